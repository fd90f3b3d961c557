// node/outage-node-enforcer: webhook.outage=node-enforcer on the real node (issue 52). With no replica of
// the webhook, pods are admitted unpatched in every namespace instead of refused, and the one that lands on
// the GPU node sees no GPU, from inside, because the node enforcer writes its GPUs from its allocation.
package main

import (
	"fmt"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func nodeOutageNodeEnforcer(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	c := n.cluster
	deployments := c.client.AppsV1().Deployments(gpuguardNamespace)
	failurePolicy := func() admissionregistrationv1.FailurePolicyType {
		config, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.ctx, webhookConfig, metav1.GetOptions{})
		t.must(err, "reading the webhook configuration")
		return *config.Webhooks[0].FailurePolicy
	}
	d, err := deployments.Get(t.ctx, webhookDeploy, metav1.GetOptions{})
	t.must(err, "reading the webhook Deployment")
	replicas := *d.Spec.Replicas

	n.helm(t, e, "upgrade", "--reuse-values", "--set", "webhook.outage=node-enforcer")
	defer func() {
		n.scaleWebhook(t, replicas)
		n.helm(t, e, "upgrade", "--reuse-values", "--set", "webhook.outage=refuse")
		// Back to refusing: the arm hook made the configuration Fail again once a replica answered.
		if got := failurePolicy(); got != admissionregistrationv1.Fail {
			t.Errorf("back at webhook.outage=refuse, failurePolicy is %s; want Fail", got)
		}
		n.waitUntilPatching(t)
	}()
	if got := failurePolicy(); got != admissionregistrationv1.Ignore {
		t.Errorf("webhook.outage=node-enforcer: failurePolicy %s; want Ignore", got)
	}
	n.scaleWebhook(t, 0)
	defer n.deletePods(t, "outage")
	// Admitted as soon as no replica answers (endpoints follow replicas), and unpatched.
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		pod, err := c.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, cudaPod("outage"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return fmt.Errorf("refused with no webhook replica under webhook.outage=node-enforcer: %v", err)
		}
		if got := visibleDevices(pod.Spec.Containers[0]); got != "unset" {
			return fmt.Errorf("a replica still answers: stored with NVIDIA_VISIBLE_DEVICES %s", got)
		}
		return nil
	}), "waiting for creates to be admitted unpatched with no webhook replica")
	pod := n.runPod(t, cudaPod("outage"))
	if got := visibleDevices(pod.Spec.Containers[0]); got != "unset" {
		t.Errorf("the pod created during the outage was stored with NVIDIA_VISIBLE_DEVICES %s; want it unpatched", got)
	}
	expectNoGPU(t, "a GPU-less pod created while no webhook replica answers, on the GPU node", n.look(t, e, pod), "void")
}

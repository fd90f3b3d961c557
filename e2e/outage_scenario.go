// node/outage-node-enforcer: webhook.outage=node-enforcer on the real node (issue 52). With no replica of
// the webhook, pods are admitted unpatched in every namespace instead of refused, and the one that lands on
// the GPU node sees no GPU, from inside, because the node enforcer writes its GPUs from its allocation.
// node/outage-gpu-taints: webhook.gpuNodeTaints against the real API server: with no replica, only pods
// that could land on a GPU node are refused.
package main

import (
	"fmt"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// nodeOutageGpuTaints: helm upgrade --set-json webhook.gpuNodeTaints=[nvidia.com/gpu:NoSchedule]. While a
// replica answers, every pod is patched, whether it tolerates the taint or not, and one that cannot land on
// a GPU node may not be given the toleration after (the backstop). With none: a pod that does
// not tolerate it is admitted unpatched; one that tolerates it, or names a node, is refused by the webhook
// configuration; and an UPDATE that adds the toleration to the pod stored unpatched is refused by the
// backstop, while one adding another toleration is not. The stored pod selects no node, so nothing
// unpatched runs. Back at no taint, one webhook entry again.
func nodeOutageGpuTaints(t *T, e *Env) {
	n := e.gpuguardFor(t)
	c := n.cluster
	pods := c.client.CoreV1().Pods(nodeNamespace)
	entries := func() []admissionregistrationv1.MutatingWebhook {
		config, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.ctx, webhookConfig, metav1.GetOptions{})
		t.must(err, "reading the webhook configuration")
		return config.Webhooks
	}
	d, err := c.client.AppsV1().Deployments(gpuguardNamespace).Get(t.ctx, webhookDeploy, metav1.GetOptions{})
	t.must(err, "reading the webhook Deployment")
	replicas := *d.Spec.Replicas

	n.helm(t, e, "upgrade", "--reuse-values", "--set-json", `webhook.gpuNodeTaints=[{"key":"nvidia.com/gpu","effect":"NoSchedule"}]`)
	defer func() {
		n.scaleWebhook(t, replicas)
		n.helm(t, e, "upgrade", "--reuse-values", "--set-json", "webhook.gpuNodeTaints=[]")
		if got := entries(); len(got) != 1 || *got[0].FailurePolicy != admissionregistrationv1.Fail || len(got[0].MatchConditions) != 0 {
			t.Errorf("back at no taint: %d webhook entries; want one, at Fail, with no matchConditions", len(got))
		}
		n.waitUntilPatching(t)
	}()
	got := entries()
	if len(got) != 2 || got[0].Name != "visible-devices.gpuguard.io" || *got[0].FailurePolicy != admissionregistrationv1.Fail ||
		got[1].Name != "visible-devices-elsewhere.gpuguard.io" || *got[1].FailurePolicy != admissionregistrationv1.Ignore {
		t.Fatalf("with webhook.gpuNodeTaints: %d webhook entries; want visible-devices at Fail and visible-devices-elsewhere at Ignore", len(got))
	}
	elsewhere := func(name string) *corev1.Pod {
		pod := cudaPod(name)
		pod.Spec.NodeSelector = map[string]string{"gpuguard.io/e2e-pool": "cpu"} // no node has it: never scheduled
		return pod
	}
	gpuToleration := corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	tolerating := cudaPod("outage-tolerating")
	tolerating.Spec.Tolerations = []corev1.Toleration{gpuToleration}
	bound := cudaPod("outage-bound")
	bound.Spec.NodeName = nodeName
	// addToleration gives a stored pod one more toleration, reading it again where the scheduler's status
	// write came between.
	addToleration := func(name string, toleration corev1.Toleration) error {
		var err error
		for range 10 {
			var pod *corev1.Pod
			if pod, err = pods.Get(t.ctx, name, metav1.GetOptions{}); err != nil {
				return err
			}
			pod.Spec.Tolerations = append(pod.Spec.Tolerations, toleration)
			if _, err = pods.Update(t.ctx, pod, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
				return err
			}
		}
		return err
	}
	dryRun := func(pod *corev1.Pod) (string, error) {
		stored, err := pods.Create(t.ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return "", err
		}
		return visibleDevices(stored.Spec.Containers[0]), nil
	}
	for _, pod := range []*corev1.Pod{elsewhere("outage-elsewhere"), tolerating} {
		if value, err := dryRun(pod); err != nil || value != "none" {
			t.Errorf("with a replica, %s: stored with NVIDIA_VISIBLE_DEVICES %s (%v); want none", pod.Name, value, err)
		}
	}
	// Patched or not, a pod admitted as one that cannot land on a GPU node may not be made one that can.
	patched, err := pods.Create(t.ctx, elsewhere("outage-patched"), metav1.CreateOptions{})
	t.must(err, "creating a pod that cannot land on a GPU node")
	defer n.deletePods(t, patched.Name)
	if value := visibleDevices(patched.Spec.Containers[0]); value != "none" {
		t.Errorf("a pod that cannot land on a GPU node, created with a replica: stored with NVIDIA_VISIBLE_DEVICES %s; want none", value)
	}
	if err := addToleration(patched.Name, gpuToleration); err == nil ||
		!strings.Contains(err.Error(), "gpuguard: this UPDATE gives the pod tolerations that let it land on a GPU node") {
		t.Errorf("adding the GPU nodes' toleration to a patched pod that could not land there: %v; want the backstop's refusal", err)
	}

	n.scaleWebhook(t, 0)
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		value, err := dryRun(elsewhere("outage-elsewhere"))
		if err != nil {
			return fmt.Errorf("a pod that does not tolerate the GPU nodes' taint is refused with no replica: %v", err)
		}
		if value != "unset" {
			return fmt.Errorf("a replica still answers: stored with NVIDIA_VISIBLE_DEVICES %s", value)
		}
		return nil
	}), "waiting for a pod that cannot land on a GPU node to be admitted unpatched with no replica")
	for _, pod := range []*corev1.Pod{tolerating, bound} {
		if _, err := dryRun(pod); err == nil || !strings.Contains(err.Error(), `failed calling webhook "visible-devices.gpuguard.io"`) {
			t.Errorf("with no replica, %s (could land on a GPU node): %v; want refused by visible-devices.gpuguard.io", pod.Name, err)
		}
	}
	stored, err := pods.Create(t.ctx, elsewhere("outage-elsewhere"), metav1.CreateOptions{})
	t.must(err, "creating a pod that cannot land on a GPU node with no replica")
	defer n.deletePods(t, stored.Name)
	if value := visibleDevices(stored.Spec.Containers[0]); value != "unset" {
		t.Errorf("the pod created with no replica was stored with NVIDIA_VISIBLE_DEVICES %s; want it unpatched", value)
	}
	t.must(addToleration(stored.Name, corev1.Toleration{Key: "example.com/spot", Operator: corev1.TolerationOpExists,
		Effect: corev1.TaintEffectNoSchedule}), "adding a toleration that still keeps the pod off GPU nodes")
	// Tolerated by value, as the scheduler would not read it against a taint without one: still in scope.
	if err := addToleration(stored.Name, corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpEqual,
		Value: "present", Effect: corev1.TaintEffectNoSchedule}); err == nil ||
		!strings.Contains(err.Error(), "gpuguard: this UPDATE gives the pod tolerations that let it land on a GPU node") {
		t.Errorf("adding the GPU nodes' toleration to the pod stored unpatched: %v; want the backstop's refusal", err)
	}
}

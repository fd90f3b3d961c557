// The node/enforcer-* scenarios: gpuguard-node-enforcer, installed by the chart, as containerd v2.4.2's NRI
// plugin on the real node, looked at from inside the containers, with admission bypassed each way a cluster
// meets: a static pod, the webhook configuration and the backstop binding deleted, a namespace the webhook
// does not cover, and the enforcer gone under fail-open and under fail-closed.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	enforcerSelector = "app.kubernetes.io/name=gpuguard-node-enforcer"
	// A pod node/control starts before any enforcer, and leaves running for node/enforcer-running and
	// node/audit.
	beforeEnforcerPod = "before-enforcer"
	staticPodName     = "static-cuda"
	// The chart's nriTolerationAnnotation, which the fail-closed config names too.
	tolerationAnnotation = "tolerate-missing-nri-plugins.noderesource.dev"
	allocatedAnnotation  = "gpuguard.io/allocated-gpus"
	infraNamespace       = "e2e-gpu-infra"
)

// runPodIn creates the pod in a namespace and waits until its container runs.
func (n *Node) runPodIn(t *T, namespace string, pod *corev1.Pod) *corev1.Pod {
	_, err := n.cluster.client.CoreV1().Pods(namespace).Create(t.ctx, pod, metav1.CreateOptions{})
	t.must(err, "creating pod "+namespace+"/"+pod.Name)
	return n.waitRunning(t, namespace, pod.Name)
}

func (n *Node) deletePodsIn(t *T, namespace string, names ...string) {
	for _, name := range names {
		err := n.cluster.client.CoreV1().Pods(namespace).Delete(t.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting pod %s/%s: %v", namespace, name, err)
		}
	}
}

// runStaticPod writes a pod of the CUDA-like image into the kubelet's staticPodPath and waits until its
// mirror pod says it runs.
func (n *Node) runStaticPod(t *T, name string) *corev1.Pod {
	pod := cudaPod(name)
	pod.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	pod.Namespace = nodeNamespace
	manifest, err := json.Marshal(pod)
	t.must(err, "encoding the static pod")
	t.must(os.WriteFile(filepath.Join(n.dir, "static-pods", name+".json"), manifest, 0o644), "writing the static pod")
	return n.waitRunning(t, nodeNamespace, name+"-"+nodeName)
}

// removeStaticPod removes the manifest and waits until the kubelet has removed the pod and its mirror.
func (n *Node) removeStaticPod(t *T, name string) {
	if err := os.Remove(filepath.Join(n.dir, "static-pods", name+".json")); err != nil && !os.IsNotExist(err) {
		t.Errorf("removing the static pod: %v", err)
	}
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		_, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Get(t.ctx, name+"-"+nodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("the mirror pod is still there (%v)", err)
	}), "waiting for the static pod to go")
}

// enforcerMetrics reads the node's enforcer's /metrics at its pod IP.
func (n *Node) enforcerMetrics(t *T) (string, error) {
	pods, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: enforcerSelector})
	if err != nil {
		return "", err
	}
	var running []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.PodIP != "" && p.Status.Phase == corev1.PodRunning {
			running = append(running, p)
		}
	}
	if len(running) != 1 {
		return "", fmt.Errorf("%d running enforcer pods, want 1", len(running))
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + running[0].Status.PodIP + ":8080/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// series is one sample's value in a Prometheus text page (the exact name and labels); -1 when absent.
func series(page, name string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` ([0-9.e+-]+)$`).FindStringSubmatch(page)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// waitForEnforcer waits until the enforcer's metrics hold what `ok` wants, and returns them.
func (n *Node) waitForEnforcer(t *T, what string, ok func(page string) error) string {
	var page string
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		var err error
		if page, err = n.enforcerMetrics(t); err != nil {
			return err
		}
		return ok(page)
	}), "waiting for the node enforcer: "+what)
	return page
}

func (n *Node) waitForEnforcerRegistered(t *T) string {
	return n.waitForEnforcer(t, "registered with "+n.runtime.title(), func(page string) error {
		if series(page, "gpuguard_node_enforcer_registered") != 1 {
			return fmt.Errorf("not registered")
		}
		return nil
	})
}

// setEnforcerPolicy patches one policy key and waits until the enforcer has reloaded it (its count of
// successful reloads grows); the webhook does not read these keys for patching.
func (n *Node) setEnforcerPolicy(t *T, key, value string) {
	before := series(n.waitForEnforcerRegistered(t), policyReloadsSeries)
	body, _ := json.Marshal(map[string]any{"data": map[string]string{key: value}})
	_, err := n.cluster.client.CoreV1().ConfigMaps(gpuguardNamespace).Patch(t.ctx, helmRelease+"-policy", types.MergePatchType, body, metav1.PatchOptions{})
	t.must(err, "patching the policy ConfigMap")
	n.waitForEnforcer(t, "reloading the policy with "+key+"="+value, func(page string) error {
		if series(page, policyReloadsSeries) <= before {
			return fmt.Errorf("no reload yet")
		}
		return nil
	})
}

// bypassAdmission deletes the webhook configuration and the backstop's binding, as a failed upgrade or a
// mistaken kubectl delete does, and returns what puts them back.
func (n *Node) bypassAdmission(t *T) func() {
	admission := n.cluster.client.AdmissionregistrationV1()
	webhook, err := admission.MutatingWebhookConfigurations().Get(t.ctx, helmRelease, metav1.GetOptions{})
	t.must(err, "reading the webhook configuration")
	binding, err := admission.ValidatingAdmissionPolicyBindings().Get(t.ctx, helmRelease+"-visible-devices", metav1.GetOptions{})
	t.must(err, "reading the backstop binding")
	t.must(admission.MutatingWebhookConfigurations().Delete(t.ctx, webhook.Name, metav1.DeleteOptions{}), "deleting the webhook configuration")
	t.must(admission.ValidatingAdmissionPolicyBindings().Delete(t.ctx, binding.Name, metav1.DeleteOptions{}), "deleting the backstop binding")
	n.waitUntilValue(t, "unset", time.Minute)
	return func() {
		for _, meta := range []*metav1.ObjectMeta{&webhook.ObjectMeta, &binding.ObjectMeta} {
			meta.ResourceVersion, meta.UID, meta.ManagedFields, meta.CreationTimestamp = "", "", nil, metav1.Time{}
		}
		_, err := admission.MutatingWebhookConfigurations().Create(t.ctx, webhook, metav1.CreateOptions{})
		t.must(err, "restoring the webhook configuration")
		_, err = admission.ValidatingAdmissionPolicyBindings().Create(t.ctx, binding, metav1.CreateOptions{})
		t.must(err, "restoring the backstop binding")
		n.waitUntilPatching(t)
	}
}

// withoutEnforcer keeps the enforcer's DaemonSet off the node (a node selector no node matches), waits
// until its pod is gone, and returns what brings it back.
func (n *Node) withoutEnforcer(t *T) func() {
	daemonSets := n.cluster.client.AppsV1().DaemonSets(gpuguardNamespace)
	patch := `{"spec":{"template":{"spec":{"nodeSelector":{"gpuguard.io/e2e-nowhere":"true"}}}}}`
	_, err := daemonSets.Patch(t.ctx, helmRelease+"-node-enforcer", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	t.must(err, "keeping the enforcer off the node")
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		pods, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: enforcerSelector})
		if err != nil {
			return err
		}
		if len(pods.Items) != 0 {
			return fmt.Errorf("%d enforcer pods left", len(pods.Items))
		}
		return nil
	}), "waiting for the enforcer to go")
	return func() {
		_, err := daemonSets.Patch(t.ctx, helmRelease+"-node-enforcer", types.MergePatchType,
			[]byte(`{"spec":{"template":{"spec":{"nodeSelector":null}}}}`), metav1.PatchOptions{})
		t.must(err, "bringing the enforcer back")
		n.waitForEnforcerRegistered(t)
	}
}

// expectNoGPU fails unless the container sees no GPU and the value the enforcer sets.
func expectNoGPU(t *T, what string, s sight, value string) {
	if len(s.gpus()) != 0 || s.value != value {
		t.Errorf("%s: %s; want no GPU and NVIDIA_VISIBLE_DEVICES=%s", what, s, value)
		return
	}
	t.Logf("%s: %s", what, s)
}

func expectBothGPUs(t *T, what string, s sight) {
	if !slices.Equal(s.gpus(), []string{"nvidia0", "nvidia1"}) || s.value != "all" {
		t.Errorf("%s: %s; want both GPUs under all", what, s)
		return
	}
	t.Logf("%s: %s", what, s)
}

// nodeEnforcerStaticPod: the kubelet runs a static pod whatever admission says; the enforcer still gives
// it no GPU (node/control showed the same manifest seeing both before gpuguard).
func nodeEnforcerStaticPod(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	defer n.removeStaticPod(t, staticPodName)
	expectNoGPU(t, "a static pod, with the enforcer", n.look(t, e, n.runStaticPod(t, staticPodName)), "void")
}

// nodeEnforcerRunning: a pod that started before any enforcer is reported at registration (a series and
// a Node event) and left running as it is.
func nodeEnforcerRunning(t *T, e *Env) {
	n := e.gpuguardFor(t)
	before, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Get(t.ctx, beforeEnforcerPod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		t.Fatalf("no pod %s: node/control starts it before gpuguard, run it first", beforeEnforcerPod)
	}
	t.must(err, "reading "+beforeEnforcerPod)
	page := n.waitForEnforcer(t, "reporting the running container", func(page string) error {
		if v := series(page, `gpuguard_node_enforcer_running_containers{state="beyond"}`); v < 1 {
			return fmt.Errorf("running containers beyond their allocation: %v", v)
		}
		return nil
	})
	t.Logf("the enforcer reports %v running container(s) beyond their allocation", series(page, `gpuguard_node_enforcer_running_containers{state="beyond"}`))
	want := nodeNamespace + "/" + beforeEnforcerPod + "/app"
	t.must(eventually(t.ctx, time.Minute, func() error {
		events, err := n.cluster.client.CoreV1().Events("default").List(t.ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + nodeName + ",reason=GPUsBeyondAllocation"})
		if err != nil {
			return err
		}
		for _, event := range events.Items {
			if strings.Contains(event.Message, want) {
				t.Logf("Node event %s: %s", event.Reason, event.Message)
				return nil
			}
		}
		return fmt.Errorf("no GPUsBeyondAllocation event of node %s names %s (%d events)", nodeName, want, len(events.Items))
	}), "waiting for the Node event")
	if err := n.describeShows(t, e, "GPUsBeyondAllocation", "node", nodeName); err != nil {
		t.Errorf("%v", err)
	}
	expectBothGPUs(t, "the pod started before the enforcer, still running", n.look(t, e, before))
}

// nodeEnforcerBypassed: with the webhook configuration and the backstop binding deleted, the node alone
// holds: a GPU-less pod sees no GPU, a GPU pod its own GPU (and one that sets all itself is refused), a
// forged allocation annotation counts for nothing, an allowlisted infrastructure namespace (and gpuguard's own device
// plugin) keeps every GPU, and under nodeEnforcement audit nothing is changed but the count.
func nodeEnforcerBypassed(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	n.cluster.namespace(t, infraNamespace, nil)
	defer n.bypassAdmission(t)()
	defer n.deletePods(t, "bypass-gpu-less", "bypass-gpu", "bypass-gpu-all", "bypass-forged", "bypass-cdi", "bypass-audit")
	defer n.deletePodsIn(t, infraNamespace, "infra")

	expectNoGPU(t, "admission bypassed, a GPU-less pod", n.look(t, e, n.runPod(t, cudaPod("bypass-gpu-less"))), "void")

	gpu := n.look(t, e, n.runPod(t, cudaPod("bypass-gpu", withRequest(gpuResource, "1"))))
	minor := slices.IndexFunc([]int{0, 1}, func(m int) bool { return gpu.value == fakeGPUUUID(m) })
	if minor < 0 || !slices.Equal(gpu.gpus(), []string{fmt.Sprintf("nvidia%d", minor)}) {
		t.Errorf("admission bypassed, a pod with one GPU: %s; want its own GPU alone", gpu)
	} else {
		t.Logf("admission bypassed, a pod with one GPU: %s", gpu)
	}
	setsAll := cudaPod("bypass-gpu-all", withRequest(gpuResource, "1"), withEnv(envVariable, "all"))
	if n.onCRIO() {
		// CRI-O keeps one entry per name, the pod's last (its server/container_create.go: the runtime-tools generator's AddProcessEnv replaces an entry of the same name): the enforcer writes
		// the allocation over it, and the pod sees its own GPU alone: the one bypass-gpu does not hold.
		if s := n.look(t, e, n.runPod(t, setsAll)); len(s.gpus()) != 1 || slices.Equal(s.gpus(), gpu.gpus()) {
			t.Errorf("admission bypassed on CRI-O, a pod with one GPU that sets NVIDIA_VISIBLE_DEVICES=all: %s; want its own GPU alone", s)
		} else {
			t.Logf("admission bypassed on CRI-O, a pod with one GPU that sets all: %s", s)
		}
	} else {
		// containerd lists the image's, the device plugin's and the pod's values one after the other, and NRI
		// cannot override a variable set more than once: the create is refused rather than let all through.
		why := n.failedCreate(t, setsAll)
		if !strings.Contains(why, `gpuguard: container "app" of pod `+nodeNamespace+`/bypass-gpu-all`) || !strings.Contains(why, "NRI can change only the first") {
			t.Errorf("admission bypassed, a pod with one GPU that sets NVIDIA_VISIBLE_DEVICES=all: %q; want gpuguard's refusal", why)
		} else {
			t.Logf("admission bypassed, a pod with one GPU that sets all: %s", why)
		}
	}

	forged := cudaPod("bypass-forged")
	forged.Annotations = map[string]string{allocatedAnnotation: fakeGPUUUID(1)}
	expectNoGPU(t, "admission bypassed, a pod forging the allocation annotation", n.look(t, e, n.runPod(t, forged)), "void")

	// A pod annotation in CDI's form naming a GPU the pod was not allocated. CRI-O copies pod annotations
	// into the container's, and NVIDIA's runtime in cdi mode reads cdi.k8s.io/ ones before the
	// environment, so there the enforcer refuses the create; containerd leaves pod annotations on the
	// sandbox, and the pod runs with what the enforcer wrote.
	cdiAnnotated := cudaPod("bypass-cdi")
	cdiAnnotated.Annotations = map[string]string{"cdi.k8s.io/gpus": "nvidia.com/gpu=" + fakeGPUUUID(1)}
	if n.onCRIO() {
		why := n.failedCreate(t, cdiAnnotated)
		if !strings.Contains(why, `gpuguard: container "app" of pod `+nodeNamespace+`/bypass-cdi`) || !strings.Contains(why, "cdi.k8s.io/gpus") {
			t.Errorf("admission bypassed on CRI-O, a GPU-less pod annotated cdi.k8s.io/gpus=nvidia.com/gpu=%s: %q; want gpuguard's refusal naming the annotation", fakeGPUUUID(1), why)
		} else {
			t.Logf("admission bypassed on CRI-O, a GPU-less pod whose cdi.k8s.io/ annotation names a GPU: %s", why)
		}
	} else {
		expectNoGPU(t, "admission bypassed, a GPU-less pod whose cdi.k8s.io/ annotation names a GPU", n.look(t, e, n.runPod(t, cdiAnnotated)), "void")
	}

	n.setEnforcerPolicy(t, "nodeEnforcementExemptNamespaces", infraNamespace)
	defer n.setEnforcerPolicy(t, "nodeEnforcementExemptNamespaces", "")
	expectBothGPUs(t, "a pod of the allowlisted namespace "+infraNamespace, n.look(t, e, n.runPodIn(t, infraNamespace, cudaPod("infra"))))
	plugins, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gpuguard-device-plugin"})
	t.must(err, "listing the device plugin's pods")
	if len(plugins.Items) != 1 {
		t.Fatalf("%d device plugin pods, want 1", len(plugins.Items))
	}
	expectBothGPUs(t, "gpuguard's own device plugin (--exempt-service-accounts)", n.look(t, e, &plugins.Items[0]))
	// The exemption is the namespace, the service account and the plugin's label together: a pod of the
	// plugin's account in its namespace, without the label, is enforced.
	lookAlike := cudaPod("look-alike")
	lookAlike.Spec.ServiceAccountName = plugins.Items[0].Spec.ServiceAccountName
	defer n.deletePodsIn(t, gpuguardNamespace, "look-alike")
	expectNoGPU(t, "a pod of the device plugin's namespace and account without its label",
		n.look(t, e, n.runPodIn(t, gpuguardNamespace, lookAlike)), "void")

	audited := `gpuguard_node_enforcer_decisions_total{action="allow",why="audited"}`
	before := series(n.waitForEnforcerRegistered(t), audited)
	n.setEnforcerPolicy(t, "nodeEnforcement", "audit")
	defer n.setEnforcerPolicy(t, "nodeEnforcement", "enforce")
	expectBothGPUs(t, "nodeEnforcement audit, a GPU-less pod", n.look(t, e, n.runPod(t, cudaPod("bypass-audit"))))
	n.waitForEnforcer(t, "counting the audited create", func(page string) error {
		if after := series(page, audited); after <= before {
			return fmt.Errorf("%s went from %v to %v", audited, before, after)
		}
		return nil
	})
}

// nodeGPUInfrastructure: NVIDIA's components recognised by the chart's defaults (gpuInfrastructure, and
// their namespaces in webhook.excludedNamespaces), by namespace, account and label together. In
// gpu-operator, a privileged pod as the GPU Operator makes its device plugin (its account and label, the
// image's NVIDIA_VISIBLE_DEVICES=all, a hostPath of NVIDIA's MPS root) sees both GPUs; the same pod without
// the label, unprivileged, is refused at its creation; in kube-system, a pod as NVIDIA's static manifest makes it (the
// default account, its label, unprivileged) sees both; the GPU Operator's kata manager, privileged with the
// host's / mounted, keeps NVIDIA's MPS root unmasked (operatorKataManager); the same account and label in a
// user namespace gets none.
func nodeGPUInfrastructure(t *T, e *Env) {
	n := e.gpuguardFor(t)
	const unlisted = "gpuguard_node_enforcer_unlisted_infrastructure_total"
	unlistedBefore := series(n.waitForEnforcerRegistered(t), unlisted)
	c := n.cluster
	const operator, account = "gpu-operator", "nvidia-device-plugin"
	operatorLabels := map[string]string{"app": "nvidia-device-plugin-daemonset"}
	c.namespace(t, operator, nil)
	defer n.waitNamespaceGone(t, operator)
	for _, namespace := range []string{operator, nodeNamespace} {
		c.serviceAccount(t, namespace, account)
	}
	defer func() {
		if err := c.client.CoreV1().ServiceAccounts(nodeNamespace).Delete(t.ctx, account, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the service account %s/%s: %v", nodeNamespace, account, err)
		}
	}()
	defer n.deletePodsIn(t, operator, "operator-plugin", "operator-look-alike")
	defer n.deletePodsIn(t, "kube-system", "static-nvidia-plugin")
	defer n.deletePods(t, "user-look-alike")
	operatorPlugin := func(name string, labels map[string]string) *corev1.Pod {
		pod := cudaPod(name, func(c *corev1.Container) {
			c.SecurityContext = &corev1.SecurityContext{Privileged: ptr(true)}
			c.VolumeMounts = []corev1.VolumeMount{{Name: "mps", MountPath: "/run/nvidia/mps"}}
		})
		pod.Labels = labels
		pod.Spec.ServiceAccountName = account
		pod.Spec.Volumes = []corev1.Volume{{Name: "mps", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/run/nvidia/mps", Type: ptr(corev1.HostPathDirectoryOrCreate)}}}}
		return pod
	}
	expectBothGPUs(t, "the GPU Operator's device plugin, in gpu-operator with its account and label",
		n.look(t, e, n.runPodIn(t, operator, operatorPlugin("operator-plugin", operatorLabels))))
	// Without its label, and unprivileged (a privileged container is never refused: it opens any GPU's node
	// anyway, docs/security.md), the MPS root it mounts is held against it.
	lookAlike := operatorPlugin("operator-look-alike", nil)
	lookAlike.Spec.Containers[0].SecurityContext = nil
	why := n.failedCreateIn(t, operator, lookAlike)
	if !strings.Contains(why, "gpuguard: container") || !strings.Contains(why, "MPS server") {
		t.Errorf("the same pod without its label: %q; want gpuguard's refusal naming the MPS servers it reaches", why)
	}
	t.Logf("the same pod without its label, unprivileged, in gpu-operator: %s", why)
	static := cudaPod("static-nvidia-plugin")
	static.Labels = map[string]string{"name": "nvidia-device-plugin-ds"}
	expectBothGPUs(t, "NVIDIA's static device plugin manifest, in kube-system with the default account and its label",
		n.look(t, e, n.runPodIn(t, "kube-system", static)))
	operatorKataManager(t, e, n, operator)
	user := cudaPod("user-look-alike")
	user.Labels = operatorLabels
	user.Spec.ServiceAccountName = account
	expectNoGPU(t, "the GPU Operator plugin's account and label in a user namespace", n.look(t, e, n.runPod(t, user)), "none")
	// That one carries an entry's label where the entry does not name the namespace: the enforcer says so,
	// by its counter (which GPUGuardGPUInfrastructureUnlisted reads) and its log; the others were exempt, or
	// carry no label.
	n.waitForEnforcer(t, "counting the user namespace's look-alike as unlisted GPU infrastructure", func(page string) error {
		if got := series(page, unlisted); got != unlistedBefore+1 {
			return fmt.Errorf("%s %v, want %v", unlisted, got, unlistedBefore+1)
		}
		return nil
	})
	logs, err := n.kubectl(t, e, "logs", "--namespace", gpuguardNamespace, "-l", enforcerSelector, "--tail=-1")
	t.must(err, "reading the enforcer's log: "+logs)
	said := ""
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "GPU infrastructure in a namespace its exemption does not name") && strings.Contains(line, "user-look-alike") {
			said = line
		}
	}
	if said == "" || !strings.Contains(said, "app=nvidia-device-plugin-daemonset") {
		t.Errorf("the enforcer's log does not name the look-alike and the entry it looks like: %q", said)
	} else {
		t.Logf("the look-alike in %s, unlisted GPU infrastructure: %s %v; %s", nodeNamespace, unlisted, unlistedBefore+1, said)
	}
	// And a Warning Event on the pod, written beside the runtime's answer: waited for, then shown by describe.
	t.must(eventually(t.ctx, time.Minute, func() error {
		events, err := c.client.CoreV1().Events(nodeNamespace).List(t.ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Pod,involvedObject.name=user-look-alike,reason=GPUInfrastructureUnlisted"})
		if err != nil {
			return err
		}
		if len(events.Items) != 1 || !strings.Contains(events.Items[0].Message, "app=nvidia-device-plugin-daemonset") {
			return fmt.Errorf("GPUInfrastructureUnlisted events of pod user-look-alike: %+v; want one naming the entry", events.Items)
		}
		t.Logf("Pod event %s: %s", events.Items[0].Reason, events.Items[0].Message)
		return nil
	}), "waiting for the look-alike's Pod event")
	if err := n.describeShows(t, e, "GPUInfrastructureUnlisted", "--namespace", nodeNamespace, "pod", "user-look-alike"); err != nil {
		t.Errorf("%v", err)
	}
}

// operatorKataManager: a pod as the GPU Operator v26.7 makes its kata manager (assets/state-kata-manager: its
// account, its name label, privileged, the host's / at /host with HostToContainer) in gpu-operator is left
// as it is by a built-in exemption: NVIDIA's MPS root below its mount is the host's, holding the file the
// host's holds, with no mask over it. Enforced as any pod, as a privileged agent mounting / is
// (node/agents), it would see an empty read-only tmpfs there.
func operatorKataManager(t *T, e *Env, n *Node, operator string) {
	const account, root, probe = "nvidia-kata-manager", "/run/nvidia/mps", "gpu-infrastructure-probe"
	n.cluster.serviceAccount(t, operator, account)
	t.must(os.MkdirAll(root, 0o755), "making "+root)
	t.must(os.WriteFile(filepath.Join(root, probe), []byte("probe\n"), 0o644), "writing the probe in "+root)
	defer os.Remove(filepath.Join(root, probe))
	pod := agentShape{name: "operator-kata-manager", hostDir: "/", mountPath: "/host", privileged: true,
		propagation: ptr(corev1.MountPropagationHostToContainer)}.pod()
	pod.Labels = map[string]string{"name": "nvidia-kata-manager"}
	pod.Spec.ServiceAccountName = account
	defer n.deletePodsIn(t, operator, pod.Name)
	pod = n.runPodIn(t, operator, pod)
	at := "/host" + root
	listing, err := e.execIn(t, pod, "ls", "-a", at)
	t.must(err, "the kata manager: listing "+at)
	mountinfo, err := e.execIn(t, pod, "cat", "/proc/self/mountinfo")
	t.must(err, "the kata manager: reading its mounts")
	if !strings.Contains(listing, probe) || maskedIn(mountinfo, at) {
		t.Errorf("the GPU Operator's kata manager sees %s as %q (masked: %v); want the host's, holding %s, unmasked",
			at, strings.Fields(listing), maskedIn(mountinfo, at), probe)
	}
	t.Logf("the GPU Operator's kata manager, in %s with its account and label: NVIDIA's MPS root at %s is the host's, unmasked", operator, at)
}

// serviceAccount makes a service account, where it is not there yet.
func (c *Cluster) serviceAccount(t *T, namespace, name string) {
	_, err := c.client.CoreV1().ServiceAccounts(namespace).Create(t.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.must(err, "creating the service account "+namespace+"/"+name)
	}
}

// nodeEnforcerRefuses: a GPU-less container that mounts /dev/nvidia1 by hostPath, which the webhook only
// warns about by default, is refused at its creation, with gpuguard's message in its status.
func nodeEnforcerRefuses(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	defer n.deletePods(t, "refused-hostpath")
	pod := cudaPod("refused-hostpath", func(c *corev1.Container) {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "gpu", MountPath: "/dev/nvidia1"}}
	})
	pod.Spec.Volumes = []corev1.Volume{{Name: "gpu", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: "/dev/nvidia1", Type: ptr(corev1.HostPathCharDev)}}}}
	why := n.failedCreate(t, pod)
	want := `gpuguard: container "app" of pod ` + nodeNamespace + `/refused-hostpath would get GPUs the kubelet did not allocate it`
	if !strings.Contains(why, want) || !strings.Contains(why, "/dev/nvidia1") {
		t.Errorf("a GPU-less pod mounting /dev/nvidia1: %q; want gpuguard's refusal naming the container and the device", why)
	}
	t.Logf("a GPU-less pod mounting /dev/nvidia1 by hostPath: %s", why)

	// The MPS root (under /run/gpuguard, the run's own /run): every shared GPU's MPS server.
	defer n.deletePods(t, "refused-mps-root")
	pod = cudaPod("refused-mps-root", func(c *corev1.Container) {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "mps", MountPath: "/mps"}}
	})
	pod.Spec.Volumes = []corev1.Volume{{Name: "mps", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: "/run/gpuguard/mps", Type: ptr(corev1.HostPathDirectoryOrCreate)}}}}
	why = n.failedCreate(t, pod)
	if !strings.Contains(why, "gpuguard: container") || !strings.Contains(why, "reaches every shared GPU's MPS server") {
		t.Errorf("a GPU-less pod mounting the MPS root: %q; want gpuguard's refusal naming every shared GPU's MPS server", why)
	}
	t.Logf("a GPU-less pod mounting /run/gpuguard/mps by hostPath: %s", why)
}

// nodeEnforcerFailure: the enforcer gone, fail-open (the default) starts a pod unenforced, which the
// webhook still covers where it looks; containerd configured fail-closed refuses a GPU-less pod's create
// clearly until the enforcer is back (and the webhook refuses the toleration that would skip it); a
// containerd restart finds the enforcer registered again, and the next pod enforced.
func nodeEnforcerFailure(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	defer n.deletePods(t, "open-covered", "closed-refused")
	defer n.deletePodsIn(t, "kube-system", "open-uncovered", "after-restart")
	back := n.withoutEnforcer(t)
	restored := false
	defer func() {
		if !restored {
			back()
		}
	}()

	expectNoGPU(t, "fail-open, the enforcer gone: a pod the webhook covers", n.look(t, e, n.runPod(t, cudaPod("open-covered"))), "none")
	expectBothGPUs(t, "fail-open, the enforcer gone: a kube-system pod, which the webhook does not cover",
		n.look(t, e, n.runPodIn(t, "kube-system", cudaPod("open-uncovered"))))

	t.must(e.restartRuntime(n, n.runtime.failClosed()), "restarting the runtime fail-closed")
	closed := true
	defer func() {
		if closed {
			t.must(e.restartRuntime(n, ""), "restarting the runtime as shipped")
		}
	}()
	why := n.failedCreate(t, cudaPod("closed-refused"))
	if !strings.Contains(why, `required plugin "gpuguard" not present`) {
		t.Errorf("fail-closed, the enforcer gone: %q; want NRI's validator naming the missing plugin gpuguard", why)
	}
	t.Logf("fail-closed, the enforcer gone, a GPU-less pod: %s", why)
	tolerating := cudaPod("closed-tolerating")
	tolerating.Annotations = map[string]string{tolerationAnnotation: "true"}
	_, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, tolerating, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !strings.Contains(err.Error(), tolerationAnnotation) {
		t.Errorf("a pod carrying %s: %v; want the webhook to refuse it", tolerationAnnotation, err)
	} else {
		t.Logf("the webhook refuses the toleration: %v", err)
	}

	back()
	restored = true
	expectNoGPU(t, "fail-closed, the enforcer back: the refused pod", n.look(t, e, n.waitRunning(t, nodeNamespace, "closed-refused")), "none")

	registered := `gpuguard_node_enforcer_connections_total{event="registered"}`
	before := series(n.waitForEnforcerRegistered(t), registered)
	// Back to the config as shipped: fail-open again, and the restart this part is about.
	t.must(e.restartRuntime(n, ""), "restarting the runtime")
	closed = false
	started := time.Now()
	n.waitForEnforcer(t, "registering again after "+n.runtime.title()+"'s restart", func(page string) error {
		if series(page, registered) <= before || series(page, "gpuguard_node_enforcer_registered") != 1 {
			return fmt.Errorf("not registered again")
		}
		return nil
	})
	t.Logf("%s restarted: the enforcer registered again within %s", n.runtime.title(), time.Since(started).Round(100*time.Millisecond))
	expectNoGPU(t, "after "+n.runtime.title()+"'s restart, a kube-system pod", n.look(t, e, n.runPodIn(t, "kube-system", cudaPod("after-restart"))), "void")
}

// nodeNoNRI: containerd with NRI off. The enforcer's pod becomes ready all the same, so that an install or
// a rollout waiting on the DaemonSet goes on, and it says the node is not enforced (its /readyz,
// gpuguard_node_enforcer_nri_served 0); a kube-system pod, which the webhook does not cover, sees both GPUs
// there: the fact it reports. NRI back on: the enforcer registers again, and the next such pod gets void.
func nodeNoNRI(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	defer n.deletePodsIn(t, "kube-system", "nri-off", "nri-back")
	t.must(e.restartRuntime(n, n.runtime.noNRI()), "restarting the runtime with NRI off")
	restored := false
	defer func() {
		if !restored {
			t.must(e.restartRuntime(n, ""), "restarting the runtime as shipped")
		}
	}()
	started := time.Now()
	n.waitForEnforcer(t, "reporting the node not enforced", func(page string) error {
		served, registered := series(page, "gpuguard_node_enforcer_nri_served"), series(page, "gpuguard_node_enforcer_registered")
		if served != 0 || registered != 0 {
			return fmt.Errorf("nri_served %v, registered %v", served, registered)
		}
		return nil
	})
	reported := time.Since(started)
	var readyz string
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		pods, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: enforcerSelector})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d enforcer pods", len(pods.Items))
		}
		pod := pods.Items[0]
		ready := false
		for _, c := range pod.Status.Conditions {
			ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
		}
		if !ready {
			return fmt.Errorf("the enforcer's pod is not Ready")
		}
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + pod.Status.PodIP + ":8080/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		readyz = strings.ReplaceAll(strings.TrimSpace(string(body)), "\n", "; ")
		return nil
	}), "waiting for the enforcer's pod to be Ready without NRI")
	if !strings.Contains(readyz, "not enforced") {
		t.Errorf("the enforcer's /readyz without NRI: %q; want it to say the node is not enforced", readyz)
	}
	t.Logf("NRI off: reported not enforced %s after %s's restart, pod Ready, /readyz %q", reported.Round(time.Second), n.runtime.title(), readyz)
	expectBothGPUs(t, "NRI off: a kube-system pod, which the webhook does not cover", n.look(t, e, n.runPodIn(t, "kube-system", cudaPod("nri-off"))))

	t.must(e.restartRuntime(n, ""), "restarting the runtime with NRI on")
	restored = true
	n.waitForEnforcer(t, "registered and served again", func(page string) error {
		if series(page, "gpuguard_node_enforcer_registered") != 1 || series(page, "gpuguard_node_enforcer_nri_served") != 1 {
			return fmt.Errorf("not registered again")
		}
		return nil
	})
	expectNoGPU(t, "NRI back on: a kube-system pod", n.look(t, e, n.runPodIn(t, "kube-system", cudaPod("nri-back"))), "void")
}

// nodeHardened: the second line under the node enforcer, as security.md's hardening sets it up: NVIDIA's
// toolkit ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers, and gpuguard's plugin hands GPUs out as
// CDI devices through the CRI (cdi-cri). The node report and the GPUIsolation condition say "not hardened"
// before and "hardened" after. Then admission is bypassed and the enforcer is away while pods are created:
// a GPU-less pod of the CUDA-like image, one that sets all itself and one that sets the index of the other
// GPU see no GPU, and a GPU pod its own alone. Nothing leaks with neither admission nor the enforcer.
func nodeHardened(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForConditionMessage(t, "; not hardened: ")
	const config = "/etc/nvidia-container-runtime/config.toml"
	saved, err := os.ReadFile(config)
	t.must(err, "reading the toolkit's config")
	t.must(os.WriteFile(config, append([]byte("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"), saved...), 0o644),
		"hardening the toolkit")
	defer os.WriteFile(config, saved, 0o644)
	n.helm(t, e, "upgrade", "--reuse-values", "--set", "devicePlugin.deviceListStrategy=cdi-cri")
	defer func() {
		n.helm(t, e, "upgrade", "--reset-values", "--set", "image.repository="+gpuguardRepo, "--set", "image.tag="+gpuguardTag)
		n.waitForGPUs(t)
		n.waitForEnforcerRegistered(t)
	}()
	n.waitForGPUs(t)
	n.waitForEnforcerRegistered(t)
	condition := n.waitForConditionMessage(t, "; hardened: ")
	restore := n.bypassAdmission(t)
	defer restore()

	// The enforcer away while the pods are created, as while it is killed, crashing or upgrading: its
	// DaemonSet kept off the node, so that NRI creates them as if it had no plugin. (Killed alone, the
	// kubelet starts it again within a second, and it judges the pods itself.)
	back := n.withoutEnforcer(t)
	defer back()
	names := []string{"hardened-image-all", "hardened-sets-all", "hardened-sets-index", "hardened-gpu"}
	defer n.deletePods(t, names...)
	pods := []*corev1.Pod{cudaPod(names[0]), cudaPod(names[1], withEnv("NVIDIA_VISIBLE_DEVICES", "all")),
		cudaPod(names[2], withEnv("NVIDIA_VISIBLE_DEVICES", "1")), cudaPod(names[3], withRequest(gpuResource, "1"))}
	for _, pod := range pods {
		_, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, pod, metav1.CreateOptions{})
		t.must(err, "creating pod "+pod.Name)
	}
	sights := map[string]sight{}
	for _, name := range names {
		sights[name] = n.look(t, e, n.waitRunning(t, nodeNamespace, name))
	}
	for _, name := range names[:3] {
		if s := sights[name]; len(s.gpus()) != 0 {
			t.Errorf("%s on a hardened node, with neither admission nor the enforcer: %s; want no GPU", name, s)
		}
	}
	if gpu := sights[names[3]]; len(gpu.gpus()) != 1 {
		t.Errorf("a GPU pod on a hardened node: %s; want its one GPU alone", gpu)
	}
	t.Logf("hardened (%s); with neither admission nor the enforcer: %v", condition.Message, sights)
}

// waitForConditionMessage waits until the node's GPUIsolation condition's message holds `part`.
func (n *Node) waitForConditionMessage(t *T, part string) corev1.NodeCondition {
	var found corev1.NodeCondition
	t.must(eventually(t.ctx, time.Minute, func() error {
		node, err := n.cluster.client.CoreV1().Nodes().Get(t.ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == "GPUIsolation" {
				found = c
				if strings.Contains(c.Message, part) {
					return nil
				}
			}
		}
		return fmt.Errorf("node %s's GPUIsolation condition says %q; want %q in it", nodeName, found.Message, part)
	}), "waiting for the node's GPUIsolation condition")
	return found
}

// nodeBreakGlassNode: the node break glass of docs/operations.md, under fail-closed. A GPU-less pod that
// mounts /dev/nvidia1 is refused by the enforcer; the docs' command (kubectl create configmap
// gpuguard-break-glass) lets the same pod start within seconds, as it is (every enforcer reads the
// ConfigMap through the API), and says so in a series; the ConfigMap deleted, the next such pod is refused
// again. containerd as shipped afterwards.
func nodeBreakGlassNode(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	const breakGlass = helmRelease + "-break-glass"
	defer n.deletePods(t, "glass-before", "glass-during", "glass-after")
	registered := `gpuguard_node_enforcer_connections_total{event="registered"}`
	before := series(n.waitForEnforcerRegistered(t), registered)
	t.must(e.restartRuntime(n, n.runtime.failClosed()), "restarting the runtime fail-closed")
	defer func() { t.must(e.restartRuntime(n, ""), "restarting the runtime as shipped") }()
	n.waitForEnforcer(t, "registering with "+n.runtime.title()+" fail-closed", func(page string) error {
		if series(page, registered) <= before || series(page, "gpuguard_node_enforcer_registered") != 1 {
			return fmt.Errorf("not registered again")
		}
		return nil
	})
	mounting := func(name string) *corev1.Pod {
		pod := cudaPod(name, func(c *corev1.Container) {
			c.VolumeMounts = []corev1.VolumeMount{{Name: "gpu", MountPath: "/dev/nvidia1"}}
		})
		pod.Spec.Volumes = []corev1.Volume{{Name: "gpu", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/dev/nvidia1", Type: ptr(corev1.HostPathCharDev)}}}}
		return pod
	}
	if why := n.failedCreate(t, mounting("glass-before")); !strings.Contains(why, "gpuguard: container") {
		t.Fatalf("fail-closed, a GPU-less pod mounting /dev/nvidia1: %q; want gpuguard's refusal", why)
	}

	started := time.Now()
	out, err := n.kubectl(t, e, "create", "configmap", breakGlass, "-n", gpuguardNamespace)
	t.must(err, "kubectl create configmap: "+out)
	defer func() {
		if out, err := n.kubectl(t, e, "delete", "configmap", breakGlass, "-n", gpuguardNamespace, "--ignore-not-found"); err != nil {
			t.Errorf("kubectl delete configmap: %v: %s", err, out)
		}
	}()
	seen := n.look(t, e, n.runPod(t, mounting("glass-during")))
	took := time.Since(started)
	if !slices.Contains(seen.devices, "nvidia1") || took > 20*time.Second {
		t.Errorf("the break glass engaged: the pod sees %s after %s; want it started as it is (nvidia1 mounted), within seconds", seen, took.Round(100*time.Millisecond))
	}
	n.waitForEnforcer(t, "saying the break glass is engaged", func(page string) error {
		if series(page, "gpuguard_node_enforcer_break_glass") != 1 {
			return fmt.Errorf("gpuguard_node_enforcer_break_glass is not 1")
		}
		return nil
	})
	t.Logf("fail-closed, the break-glass ConfigMap created: the refused kind of pod ran %s later, as it is (%s)", took.Round(100*time.Millisecond), seen)

	out, err = n.kubectl(t, e, "delete", "configmap", breakGlass, "-n", gpuguardNamespace)
	t.must(err, "kubectl delete configmap: "+out)
	n.waitForEnforcer(t, "saying the break glass is released", func(page string) error {
		if series(page, "gpuguard_node_enforcer_break_glass") != 0 {
			return fmt.Errorf("gpuguard_node_enforcer_break_glass is not 0")
		}
		return nil
	})
	if why := n.failedCreate(t, mounting("glass-after")); !strings.Contains(why, "gpuguard: container") {
		t.Errorf("the break glass released, the same kind of pod: %q; want gpuguard's refusal again", why)
	}
}

// nodeEnforcerBounded: the second red team's memory attacks on the real node, against the enforcer as the
// chart runs it, under its memory limit, which the kubelet enforces through the container's cgroup. 180
// running containers whose image sets the four variables the enforcer reads to 64 KiB each (five to a pod,
// so that NRI's split Synchronize keeps a pod in every message), a fresh enforcer that registers over all of
// them, and a pod whose volume is mounted at a path of 256 KiB: the enforcer is never restarted, refuses
// the long path by name, and every other pod comes out as before. Admission is bypassed, so that the node
// alone decides.
func nodeEnforcerBounded(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	defer n.bypassAdmission(t)()
	pods := n.cluster.client.CoreV1().Pods(gpuguardNamespace)
	enforcerPod := func() corev1.Pod {
		var found corev1.Pod
		t.must(eventually(t.ctx, 2*time.Minute, func() error {
			list, err := pods.List(t.ctx, metav1.ListOptions{LabelSelector: enforcerSelector})
			if err != nil {
				return err
			}
			var ready []corev1.Pod
			for _, p := range list.Items {
				if p.DeletionTimestamp == nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready {
					ready = append(ready, p)
				}
			}
			if len(ready) != 1 {
				return fmt.Errorf("%d ready enforcer pods, want 1", len(ready))
			}
			found = ready[0]
			return nil
		}), "waiting for the enforcer's pod to be ready")
		return found
	}
	limit := enforcerPod().Spec.Containers[0].Resources.Limits.Memory()
	if limit.IsZero() || limit.Value() > 64<<20 {
		t.Fatalf("the enforcer runs with a memory limit of %v, want the chart's 64Mi", limit)
	}

	const heavyPods, perPod = 36, 5
	var names []string
	for i := 0; i < heavyPods; i++ {
		name := fmt.Sprintf("heavy-%d", i)
		names = append(names, name)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr(int64(0))}}
		for c := 0; c < perPod; c++ {
			pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: fmt.Sprintf("c%d", c),
				Image: heavyEnvImage, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"}})
		}
		_, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, pod, metav1.CreateOptions{})
		t.must(err, "creating "+name)
	}
	defer n.deletePodsTornDown(t, names...)
	t.must(eventually(t.ctx, 5*time.Minute, func() error {
		running := 0
		for _, name := range names {
			p, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Get(t.ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, status := range p.Status.ContainerStatuses {
				if status.State.Running != nil {
					running++
				} else if w := status.State.Waiting; w != nil && w.Reason != "ContainerCreating" {
					return fmt.Errorf("%s/%s waits: %s: %s", name, status.Name, w.Reason, w.Message)
				}
			}
		}
		if running != heavyPods*perPod {
			return fmt.Errorf("%d of %d heavy containers run", running, heavyPods*perPod)
		}
		return nil
	}), "waiting for the heavy containers to run")

	// A fresh enforcer registers over every one of them.
	before := enforcerPod()
	t.must(pods.Delete(t.ctx, before.Name, metav1.DeleteOptions{}), "deleting the enforcer's pod")
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		if p := enforcerPod(); p.Name == before.Name {
			return fmt.Errorf("the old enforcer pod is still the ready one")
		}
		return nil
	}), "waiting for a new enforcer pod")
	page := n.waitForEnforcerRegistered(t)
	fresh := enforcerPod()
	t.Logf("a fresh enforcer registered over %d heavy running containers (connections it made: %v); running containers it reports: beyond %v, unjudged %v",
		heavyPods*perPod, series(page, `gpuguard_node_enforcer_connections_total{event="registered"}`),
		series(page, `gpuguard_node_enforcer_running_containers{state="beyond"}`),
		series(page, `gpuguard_node_enforcer_running_containers{state="unjudged"}`))
	// Its own part of each Synchronize, and the whole, which NRI bounds by one request timeout (2 s).
	for _, line := range podLogLines(gpuguardNamespace, fresh.Name, "synchronized with the runtime", "NRI connection ended") {
		t.Logf("the fresh enforcer's log: %.400s", line)
	}

	// A volume mounted at a path of 256 KiB, under the device list root: refused by name, never held. (Of a
	// megabyte, the kubelet cannot write the pod's status: it holds the path twice, past etcd's 2 MiB.)
	defer n.deletePods(t, "long-path", "bounded-gpu-less", "bounded-gpu")
	longPath := cudaPod("long-path", func(c *corev1.Container) {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/var/run/nvidia-container-devices/" + strings.Repeat("p", 256<<10)}}
	})
	longPath.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	why := n.failedCreate(t, longPath)
	if !strings.Contains(why, "gpuguard: container") || !strings.Contains(why, "longer than PATH_MAX") {
		t.Errorf("a volume mounted at a path of 256 KiB: %.300s; want gpuguard's refusal naming the path's length", why)
	}
	t.Logf("a volume mounted at a path of 256 KiB: %.300s", why)

	// Every other pod comes out as before.
	expectNoGPU(t, "a GPU-less pod after the attacks", n.look(t, e, n.runPod(t, cudaPod("bounded-gpu-less"))), "void")
	gpu := n.look(t, e, n.runPod(t, cudaPod("bounded-gpu", withRequest(gpuResource, "1"))))
	if len(gpu.gpus()) != 1 {
		t.Errorf("a pod that asked for one GPU after the attacks: %s", gpu)
	}

	// The enforcer was never killed or restarted through all of it.
	after, err := pods.Get(t.ctx, fresh.Name, metav1.GetOptions{})
	t.must(err, "reading the enforcer's pod")
	if restarts := after.Status.ContainerStatuses[0].RestartCount; restarts != 0 {
		t.Errorf("the enforcer restarted %d times (last state: %+v)", restarts, after.Status.ContainerStatuses[0].LastTerminationState)
	}
}

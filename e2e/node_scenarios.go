// The node/ scenarios: what containers see on the real node (node.go), looked at from inside them, before
// and after gpuguard is installed with Helm as an admin installs it.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	nodeNamespace = "e2e-node"
	helmRelease   = "gpuguard"
	webhookDeploy = "gpuguard-webhook"
)

// sight is what a container sees of the GPUs: the NVIDIA device nodes in its /dev, and its PID 1's
// NVIDIA_VISIBLE_DEVICES (unset: "(unset)").
type sight struct {
	devices []string
	value   string
}

func (s sight) gpus() []string {
	var gpus []string
	for _, d := range s.devices {
		if strings.TrimLeft(strings.TrimPrefix(d, "nvidia"), "0123456789") == "" && d != "nvidia" {
			gpus = append(gpus, d)
		}
	}
	return gpus
}

func (s sight) String() string {
	return fmt.Sprintf("/dev: %v, NVIDIA_VISIBLE_DEVICES=%s", s.devices, s.value)
}

// cudaPod is a pod of the CUDA-like image (NVIDIA_VISIBLE_DEVICES=all in its config) that sleeps.
func cudaPod(name string, options ...func(*corev1.Container)) *corev1.Pod {
	c := corev1.Container{Name: "app", Image: cudaLikeImage, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"}}
	for _, option := range options {
		option(&c)
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{c}, TerminationGracePeriodSeconds: ptr(int64(0))}}
}

func withRequest(name string, quantity string) func(*corev1.Container) {
	return func(c *corev1.Container) {
		c.Resources.Limits = corev1.ResourceList{corev1.ResourceName(name): resource.MustParse(quantity)}
	}
}

// runPod creates the pod and waits until its container runs; a container that cannot be created ends
// the wait with the runtime's message.
func (n *Node) runPod(t *T, pod *corev1.Pod) *corev1.Pod {
	return n.runPodIn(t, nodeNamespace, pod)
}

// waitRunning waits until the pod's container runs; one that cannot be created ends the wait with the
// runtime's message.
func (n *Node) waitRunning(t *T, namespace, name string) *corev1.Pod {
	var running *corev1.Pod
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		p, err := n.cluster.client.CoreV1().Pods(namespace).Get(t.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, status := range p.Status.ContainerStatuses {
			if status.State.Running != nil {
				running = p
				return nil
			}
			if w := status.State.Waiting; w != nil && w.Reason != "ContainerCreating" {
				return fmt.Errorf("container %s waits: %s: %s", status.Name, w.Reason, w.Message)
			}
		}
		return fmt.Errorf("pod %s is %s", p.Name, p.Status.Phase)
	}), "waiting for pod "+name+" to run")
	return running
}

// failedCreate creates the pod and waits for its container to fail to be created; it returns why.
func (n *Node) failedCreate(t *T, pod *corev1.Pod) string {
	return n.failedCreateIn(t, nodeNamespace, pod)
}

func (n *Node) failedCreateIn(t *T, namespace string, pod *corev1.Pod) string {
	_, err := n.cluster.client.CoreV1().Pods(namespace).Create(t.ctx, pod, metav1.CreateOptions{})
	t.must(err, "creating pod "+pod.Name)
	var why string
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		p, err := n.cluster.client.CoreV1().Pods(namespace).Get(t.ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		// The runtime runs at the container's start: its error is the start's (StartError), or the
		// create's in other runtimes.
		for _, status := range p.Status.ContainerStatuses {
			if status.State.Running != nil {
				return fmt.Errorf("pod %s runs", p.Name)
			}
			for _, ended := range []*corev1.ContainerStateTerminated{status.State.Terminated, status.LastTerminationState.Terminated} {
				if ended != nil && ended.Message != "" {
					why = ended.Reason + ": " + ended.Message
					return nil
				}
			}
			if w := status.State.Waiting; w != nil && w.Reason == "CreateContainerError" {
				why = w.Reason + ": " + w.Message
				return nil
			}
		}
		return fmt.Errorf("pod %s is %s", p.Name, p.Status.Phase)
	}), "waiting for pod "+pod.Name+"'s container to fail")
	return why
}

// deletePods deletes the pods at once: their objects go, and the kubelet tears them down after.
func (n *Node) deletePods(t *T, names ...string) { n.deletePodsIn(t, nodeNamespace, names...) }

// deletePodsTornDown deletes the pods as kubectl delete does, not forced, and waits until their objects
// are gone: the kubelet removes a pod's object only once it has torn the pod down, its DRA claims
// unprepared included. A forced deletion does not wait for that, and a driver stopped before it leaves the
// kubelet retrying the unprepare, and the pod's cgroup in place, until the kubelet restarts.
func (n *Node) deletePodsTornDown(t *T, names ...string) {
	pods := n.cluster.client.CoreV1().Pods(nodeNamespace)
	for _, name := range names {
		err := pods.Delete(t.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(1))})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting pod %s: %v", name, err)
		}
	}
	// Two minutes, and three seconds more for each pod: the kubelet tears down many pods a few at a time, and
	// containerd's shims end slowly on a loaded machine (the 36 pods of node/enforcer-bounded, 180 containers,
	// took up to 119 s on a two-core machine, past the 96 s this allowed before).
	limit := 2*time.Minute + time.Duration(len(names))*3*time.Second
	t.must(eventually(t.ctx, limit, func() error {
		for _, name := range names {
			if _, err := pods.Get(t.ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("pod %s is not torn down yet (%v)", name, err)
			}
		}
		return nil
	}), "waiting for the kubelet to tear down "+strings.Join(names, ", "))
}

// containerID is the runtime's ID of the pod's first container.
func containerID(t *T, pod *corev1.Pod) string {
	if len(pod.Status.ContainerStatuses) == 0 {
		t.Fatalf("pod %s has no container status", pod.Name)
	}
	_, id, found := strings.Cut(pod.Status.ContainerStatuses[0].ContainerID, "://")
	if !found {
		t.Fatalf("pod %s: container ID %q", pod.Name, pod.Status.ContainerStatuses[0].ContainerID)
	}
	return id
}

// execIn runs a command inside the pod's first container, through the runtime's CRI (as kubectl exec
// would through the kubelet), and returns its output.
func (e *Env) execIn(t *T, pod *corev1.Pod, command ...string) (string, error) {
	return criExec(t.ctx, e.nodeRuntime().socket(), containerID(t, pod), command...)
}

// look lists /dev and reads PID 1's environment inside the pod's container; from the host, through
// /proc, for an image without ls and cat (gpuguard's own, distroless, and NVIDIA's device plugin's and DRA driver's).
func (n *Node) look(t *T, e *Env, pod *corev1.Pod) sight {
	if image := pod.Spec.Containers[0].Image; strings.HasPrefix(image, gpuguardRepo) || image == nvidiaPluginImage || image == draDriverImage {
		return lookFromHost(t, e, pod)
	}
	listing, err := e.execIn(t, pod, "ls", "/dev")
	t.must(err, "listing /dev in "+pod.Name)
	environ, err := e.execIn(t, pod, "cat", "/proc/1/environ")
	t.must(err, "reading PID 1's environment in "+pod.Name)
	s := sight{value: "(unset)"}
	for _, name := range strings.Fields(listing) {
		if strings.HasPrefix(name, "nvidia") {
			s.devices = append(s.devices, name)
		}
	}
	for _, entry := range strings.Split(environ, "\x00") {
		if value, ok := strings.CutPrefix(entry, "NVIDIA_VISIBLE_DEVICES="); ok {
			s.value = value
		}
	}
	return s
}

func lookFromHost(t *T, e *Env, pod *corev1.Pod) sight {
	pid := taskPIDs(t, e)[containerID(t, pod)]
	if pid == "" {
		t.Fatalf("pod %s: no process for its container", pod.Name)
	}
	environ, err := os.ReadFile("/proc/" + pid + "/environ")
	t.must(err, "reading PID 1's environment in "+pod.Name)
	entries, err := os.ReadDir("/proc/" + pid + "/root/dev")
	t.must(err, "listing /dev in "+pod.Name)
	s := sight{value: "(unset)"}
	for _, entry := range entries {
		if strings.HasPrefix(entry.Name(), "nvidia") {
			s.devices = append(s.devices, entry.Name())
		}
	}
	for _, entry := range strings.Split(string(environ), "\x00") {
		if value, ok := strings.CutPrefix(entry, "NVIDIA_VISIBLE_DEVICES="); ok {
			s.value = value
		}
	}
	return s
}

// taskPIDs is the node's PID of each running container, by container ID.
func taskPIDs(t *T, e *Env) map[string]string {
	pids, err := criPIDs(t.ctx, e.nodeRuntime().socket())
	t.must(err, "listing the runtime's running containers")
	return pids
}

// nodeWithoutGpuguard is the node before anything of gpuguard is installed on it.
func (e *Env) nodeWithoutGpuguard(t *T) *Node {
	n := e.nodeFor(t)
	if n.installed {
		t.Fatalf("gpuguard is already installed on the node: run this scenario before node/closed")
	}
	n.cluster.namespace(t, nodeNamespace, nil)
	return n
}

// nodeControl: the leak is real on this node, and NVIDIA's runtime reads each value as its mode says.
func nodeControl(t *T, e *Env) {
	n := e.nodeWithoutGpuguard(t)
	defer n.deletePods(t, "control-all", "control-void", "control-none")
	all := n.look(t, e, n.runPod(t, cudaPod("control-all")))
	if !slices.Equal(all.gpus(), []string{"nvidia0", "nvidia1"}) || all.value != "all" {
		t.Errorf("a pod that asked for no GPU, before gpuguard: %s; want both GPUs under all (the leak)", all)
	}
	t.Logf("before gpuguard, a pod that asked for no GPU sees %s", all)
	void := n.look(t, e, n.runPod(t, cudaPod("control-void", withEnv("NVIDIA_VISIBLE_DEVICES", "void"))))
	if len(void.devices) != 0 {
		t.Errorf("void, before gpuguard: %s; want no NVIDIA device", void)
	}
	why := n.failedCreate(t, cudaPod("control-none", withEnv("NVIDIA_VISIBLE_DEVICES", "none")))
	if !strings.Contains(why, "unresolvable CDI devices nvidia.com/gpu=none") {
		t.Errorf("none, before gpuguard: %q; want the create to fail on the CDI device nvidia.com/gpu=none", why)
	}
	t.Logf("before gpuguard, none fails the create: %s", why)
	expectBothGPUs(t, "before gpuguard, a static pod", n.look(t, e, n.runStaticPod(t, staticPodName)))
	n.removeStaticPod(t, staticPodName)
	// Left running: node/enforcer-running and node/audit report it.
	expectBothGPUs(t, "before gpuguard, the pod left running", n.look(t, e, n.runPod(t, cudaPod(beforeEnforcerPod))))
}

// gpuguardFor installs gpuguard on the node on first use as the README does: its namespace from
// manifests/base/namespace.yaml (Pod Security privileged), then helm install of charts/gpuguard, with the
// image reference the one thing set.
func (e *Env) gpuguardFor(t *T) *Node {
	n := e.nodeFor(t)
	n.cluster.namespace(t, nodeNamespace, nil)
	if n.installed {
		return n
	}
	out, err := n.kubectl(t, e, "apply", "-f", e.source("manifests", "base", "namespace.yaml"))
	t.must(err, "kubectl apply -f manifests/base/namespace.yaml: "+out)
	n.helm(t, e, "install", "--set", "image.repository="+gpuguardRepo, "--set", "image.tag="+gpuguardTag)
	n.installed = true
	n.waitUntilPatching(t)
	return n
}

// helm runs helm install, upgrade or uninstall of charts/gpuguard against the node's cluster, and waits
// for it.
func (n *Node) helm(t *T, e *Env, command string, args ...string) {
	release := []string{command, helmRelease}
	if command != "uninstall" {
		release = append(release, e.source("charts", "gpuguard"))
	}
	if command != "uninstall" {
		release = append(release, n.runtime.helmValues()...)
	}
	args = append(append(release, "--kubeconfig", e.path("node-control-plane", "admin.kubeconfig"),
		"--namespace", gpuguardNamespace, "--wait", "--timeout", "5m"), args...)
	out, err := exec.CommandContext(t.ctx, e.component("helm"), args...).CombinedOutput()
	log := e.path("logs", "helm-"+command+".log")
	os.WriteFile(log, out, 0o644)
	if err != nil {
		t.Fatalf("helm %s: %v (%s)", command, err, log)
	}
	if command == "upgrade" {
		n.waitDaemonSetsRolledOut(t)
	}
}

// waitDaemonSetsRolledOut waits until every DaemonSet of gpuguard's runs its new pods, available, as
// kubectl rollout status does. helm --wait does not: with one node and maxUnavailable 1 it wants no pod
// ready, so the old device plugin may still be going away (its GPUs briefly gone from the kubelet) when
// the next step creates a GPU pod.
func (n *Node) waitDaemonSetsRolledOut(t *T) {
	t.must(eventually(t.ctx, 3*time.Minute, func() error {
		sets, err := n.cluster.client.AppsV1().DaemonSets(gpuguardNamespace).List(t.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ds := range sets.Items {
			s := ds.Status
			if s.ObservedGeneration < ds.Generation || s.UpdatedNumberScheduled != s.DesiredNumberScheduled ||
				s.NumberAvailable != s.DesiredNumberScheduled || s.NumberUnavailable != 0 {
				return fmt.Errorf("DaemonSet %s: %d of %d updated, %d available", ds.Name, s.UpdatedNumberScheduled,
					s.DesiredNumberScheduled, s.NumberAvailable)
			}
		}
		return nil
	}), "waiting for gpuguard's DaemonSets to roll out")
}

// waitUntilValue waits until a dry-run create through the Service-routed webhook comes back with want
// (the webhook configuration is informer-driven, and endpoints follow replicas).
func (n *Node) waitUntilValue(t *T, want string, timeout time.Duration) {
	t.must(eventually(t.ctx, timeout, func() error {
		pod, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, cudaPod("probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		if got := visibleDevices(pod.Spec.Containers[0]); got != want {
			return fmt.Errorf("a dry-run pod is stored with NVIDIA_VISIBLE_DEVICES %s, want %s", got, want)
		}
		return nil
	}), "waiting for the webhook to answer "+want)
}

func (n *Node) waitUntilPatching(t *T) { n.waitUntilValue(t, "none", 2*time.Minute) }

// nodeClosed: with gpuguard installed, the same pod starts and sees no GPU.
func nodeClosed(t *T, e *Env) {
	n := e.gpuguardFor(t)
	defer n.deletePods(t, "closed")
	s := n.look(t, e, n.runPod(t, cudaPod("closed")))
	if len(s.gpus()) != 0 || s.value != "none" {
		t.Errorf("a pod that asked for no GPU, with gpuguard: %s; want no GPU and none", s)
	}
	t.Logf("with gpuguard, a pod that asked for no GPU sees %s", s)
}

// nodeAllocated: a pod that requests one GPU sees the one the plugin allocated; a second pod the other.
func nodeAllocated(t *T, e *Env) {
	n := e.gpuguardFor(t)
	defer n.deletePods(t, "gpu-a", "gpu-b")
	seen := map[string]bool{}
	for _, name := range []string{"gpu-a", "gpu-b"} {
		s := n.look(t, e, n.runPod(t, cudaPod(name, withRequest(gpuResource, "1"))))
		minor := -1
		for m := 0; m < nodeGPUs; m++ {
			if s.value == fakeGPUUUID(m) {
				minor = m
			}
		}
		want := []string{fmt.Sprintf("nvidia%d", minor)}
		if minor < 0 || !slices.Equal(s.gpus(), want) {
			t.Errorf("pod %s, one GPU requested: %s; want the allocated GPU's node alone", name, s)
			continue
		}
		if seen[s.value] {
			t.Errorf("pod %s got %s, which the other pod already has", name, s.value)
		}
		seen[s.value] = true
		t.Logf("pod %s sees %s", name, s)
	}
}

// nodeNoneVoid: on this cdi-mode node none now starts (the plugin added nvidia.com/gpu=none), void too,
// and the plugin's node report says both are honoured.
func nodeNoneVoid(t *T, e *Env) {
	n := e.gpuguardFor(t)
	if _, err := os.Stat("/var/run/cdi/gpuguard-none-nvidia.com-gpu.json"); err != nil {
		t.Errorf("the device plugin did not add the CDI device nvidia.com/gpu=none: %v", err)
	}
	metrics := n.devicePluginMetrics(t)
	for _, want := range []string{`gpuguard_device_plugin_value_honoured{value="none",verdict="honoured"} 1`,
		`gpuguard_device_plugin_value_honoured{value="void",verdict="honoured"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("the device plugin's /metrics lack %s", want)
		}
	}
	n.waitForCondition(t, "True", "Honoured", "NVIDIA_VISIBLE_DEVICES=none: ")
	defer n.deletePods(t, "value-none", "value-void")
	none := n.look(t, e, n.runPod(t, cudaPod("value-none")))
	if len(none.gpus()) != 0 || none.value != "none" {
		t.Errorf("none: %s; want no GPU", none)
	}
	n.setPolicy(t, "visibleDevicesValue", "void")
	defer n.setPolicy(t, "visibleDevicesValue", "none")
	// The plugin reads the same ConfigMap through its own volume: its Node condition now judges void.
	n.waitForCondition(t, "True", "Honoured", "NVIDIA_VISIBLE_DEVICES=void: ")
	void := n.look(t, e, n.runPod(t, cudaPod("value-void")))
	if len(void.devices) != 0 || void.value != "void" {
		t.Errorf("void: %s; want no NVIDIA device at all", void)
	}
	t.Logf("none: %s; void: %s", none, void)
}

// nodeReportFlip: the plugin's node report follows the node. Without the device none, its /metrics turn
// to breaks-pods within its re-read interval, and a GPU-less pod indeed fails to start; with the device
// back, honoured, and the pod starts.
func nodeReportFlip(t *T, e *Env) {
	n := e.gpuguardFor(t)
	const noneSpec = "/var/run/cdi/gpuguard-none-nvidia.com-gpu.json"
	saved, err := os.ReadFile(noneSpec)
	t.must(err, "reading the spec with the device none")
	t.must(os.Remove(noneSpec), "removing the device none")
	defer os.WriteFile(noneSpec, saved, 0o644)
	n.waitForMetric(t, `gpuguard_device_plugin_value_honoured{value="none",verdict="breaks-pods"} 0`)
	broken := n.waitForCondition(t, "False", "BreaksPods", "NVIDIA_VISIBLE_DEVICES=none: ")
	defer n.deletePods(t, "flip-broken", "flip-restored")
	var why string
	if n.onCRIO() {
		// CRI-O keeps one entry per name: the node enforcer writes void over none, and the pod starts with
		// no GPU where the report, which judges the value alone, says none breaks pods.
		seen := n.look(t, e, n.runPod(t, cudaPod("flip-broken")))
		expectNoGPU(t, "without the device none on CRI-O, a GPU-less pod", seen, "void")
		why = seen.String()
	} else {
		// It fails either way: the node enforcer refuses it first (none no longer gives no GPU here, and a
		// variable the image and the webhook both set cannot be rewritten), else the runtime fails on the
		// device.
		why = n.failedCreate(t, cudaPod("flip-broken"))
		if !strings.Contains(why, "unresolvable CDI devices nvidia.com/gpu=none") &&
			!strings.Contains(why, "NVIDIA_VISIBLE_DEVICES=none, not what gpuguard writes for the allocation") {
			t.Errorf("without the device none, a GPU-less pod: %q; want the create to fail on nvidia.com/gpu=none", why)
		}
	}
	n.auditNodes(t, e, []string{nodeName})
	t.must(os.WriteFile(noneSpec, saved, 0o644), "putting the device none back")
	n.waitForMetric(t, `gpuguard_device_plugin_value_honoured{value="none",verdict="honoured"} 1`)
	restored := n.waitForCondition(t, "True", "Honoured", "NVIDIA_VISIBLE_DEVICES=none: ")
	if !restored.LastTransitionTime.After(broken.LastTransitionTime.Time) {
		t.Errorf("GPUIsolation's lastTransitionTime %s did not move on from %s", restored.LastTransitionTime, broken.LastTransitionTime)
	}
	n.auditNodes(t, e, nil)
	s := n.look(t, e, n.runPod(t, cudaPod("flip-restored")))
	if len(s.gpus()) != 0 {
		t.Errorf("with the device none back: %s", s)
	}
	t.Logf("without the device none: breaks-pods, GPUIsolation %s since %s, and the pod: %s", broken.Status, broken.LastTransitionTime.UTC().Format(time.RFC3339), why)
}

// waitForCondition waits until the device plugin has set the node's GPUIsolation condition so (it judges
// the node every 10 s, and reads the policy from its ConfigMap volume, which the kubelet refreshes).
func (n *Node) waitForCondition(t *T, status, reason, messagePrefix string) corev1.NodeCondition {
	var found corev1.NodeCondition
	t.must(eventually(t.ctx, time.Minute, func() error {
		node, err := n.cluster.client.CoreV1().Nodes().Get(t.ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == "GPUIsolation" {
				found = c
				if string(c.Status) == status && c.Reason == reason && strings.HasPrefix(c.Message, messagePrefix) {
					return nil
				}
			}
		}
		return fmt.Errorf("node %s's GPUIsolation condition is %+v; want %s, %s, %q...", nodeName, found, status, reason, messagePrefix)
	}), "waiting for the node's GPUIsolation condition")
	return found
}

// auditNodes runs `gpuguard-webhook audit --nodes` over the cluster's Nodes, as an admin would with
// kubectl's output, and checks which nodes it lists as not holding.
func (n *Node) auditNodes(t *T, e *Env, want []string) {
	nodes, err := n.cluster.client.CoreV1().Nodes().List(t.ctx, metav1.ListOptions{})
	t.must(err, "listing the nodes")
	for i := range nodes.Items {
		nodes.Items[i].Kind, nodes.Items[i].APIVersion = "Node", "v1"
	}
	dir, err := os.MkdirTemp("", "gpuguard-audit-")
	t.must(err, "making a directory for the audit's input")
	defer os.RemoveAll(dir)
	nodesFile, podsFile := filepath.Join(dir, "nodes.json"), filepath.Join(dir, "pods.json")
	data, _ := json.Marshal(nodes)
	t.must(os.WriteFile(nodesFile, data, 0o644), "writing the nodes")
	t.must(os.WriteFile(podsFile, []byte(`{"kind":"List","items":[]}`), 0o644), "writing an empty pod list")
	out, _ := exec.CommandContext(t.ctx, e.gpuguard("gpuguard-webhook"), "audit", "--output", "json", "--nodes", nodesFile, podsFile).Output()
	var report struct {
		Nodes struct {
			NotHolding []struct{ Name, Reason string } `json:"notHolding"`
		} `json:"nodes"`
	}
	t.must(json.Unmarshal(out, &report), "reading the audit's report: "+string(out))
	var listed []string
	for _, node := range report.Nodes.NotHolding {
		listed = append(listed, node.Name)
	}
	if strings.Join(listed, ",") != strings.Join(want, ",") {
		t.Errorf("audit --nodes lists %v as not holding; want %v", listed, want)
	}
}

// waitForMetric waits until the device plugin's /metrics carry the line (the plugin re-reads the node
// every 10 s).
func (n *Node) waitForMetric(t *T, line string) {
	t.must(eventually(t.ctx, 45*time.Second, func() error {
		if !strings.Contains(n.devicePluginMetrics(t), line) {
			return fmt.Errorf("the device plugin's /metrics lack %s", line)
		}
		return nil
	}), "waiting for the device plugin's node report")
}

// setPolicy changes one key of the policy ConfigMap through the API and returns how long it took until
// every webhook replica, each reading it from its kubelet-written volume, had loaded it and the API
// server's creates carried it.
func (n *Node) setPolicy(t *T, key, value string) time.Duration {
	before := n.replicaReloads(t)
	body, _ := json.Marshal(map[string]any{"data": map[string]string{key: value}})
	started := time.Now()
	_, err := n.cluster.client.CoreV1().ConfigMaps(gpuguardNamespace).Patch(t.ctx, helmRelease+"-policy", types.MergePatchType, body, metav1.PatchOptions{})
	t.must(err, "patching the policy ConfigMap")
	n.waitForReloads(t, before)
	if key == "visibleDevicesValue" {
		n.waitUntilValue(t, value, 10*time.Second)
	}
	return time.Since(started)
}

// waitForReloads waits until each webhook replica counted in before has loaded its policy again.
func (n *Node) waitForReloads(t *T, before map[string]int) {
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		after := n.replicaReloads(t)
		for pod, count := range before {
			if after[pod] <= count {
				return fmt.Errorf("webhook replica %s has not reloaded its policy (%d successful reloads)", pod, after[pod])
			}
		}
		return nil
	}), "waiting for every webhook replica to load the policy")
}

// replicaReloads reads gpuguard_policy_reloads_total{result="success"} from each ready webhook replica's
// /metrics, at its pod IP, trusting the CA the webhook configuration carries.
func (n *Node) replicaReloads(t *T) map[string]int {
	config, err := n.cluster.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.ctx, "gpuguard", metav1.GetOptions{})
	t.must(err, "reading the webhook configuration")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(config.Webhooks[0].ClientConfig.CABundle)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: webhookDeploy + "." + gpuguardNamespace + ".svc"}}}
	reloads := map[string]int{}
	for _, pod := range n.webhookPods(t) {
		if pod.DeletionTimestamp != nil || !podReady(pod) {
			continue
		}
		count, err := scrape(client, "https://"+pod.Status.PodIP+":8443/metrics", policyReloadsSeries)
		t.must(err, "reading webhook replica "+pod.Name+"'s policy reloads")
		reloads[pod.Name] = count
	}
	return reloads
}

func podReady(pod corev1.Pod) bool {
	for _, condition := range pod.Status.Conditions {
		if condition.Type == corev1.PodReady {
			return condition.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodePolicyReload: a ConfigMap change reaches the running webhook pods through the kubelet's atomic
// writer, without a restart, within a minute.
func nodePolicyReload(t *T, e *Env) {
	n := e.gpuguardFor(t)
	before := n.webhookRestarts(t)
	took := n.setPolicy(t, "visibleDevicesValue", "void")
	back := n.setPolicy(t, "visibleDevicesValue", "none")
	if took > time.Minute || back > time.Minute {
		t.Errorf("the policy took %s and %s to reach the webhook, over the minute allowed", took, back)
	}
	if after := n.webhookRestarts(t); after != before {
		t.Errorf("webhook containers restarted: %d before, %d after", before, after)
	}
	t.Logf("ConfigMap update to every webhook replica reloaded: %s to void, %s back to none (kubelet syncFrequency 5s, Watch)",
		took.Round(100*time.Millisecond), back.Round(100*time.Millisecond))
}

func (n *Node) webhookPods(t *T) []corev1.Pod {
	pods, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gpuguard-webhook"})
	t.must(err, "listing the webhook's pods")
	return pods.Items
}

func (n *Node) webhookRestarts(t *T) int32 {
	var restarts int32
	for _, pod := range n.webhookPods(t) {
		for _, status := range pod.Status.ContainerStatuses {
			restarts += status.RestartCount
		}
	}
	return restarts
}

// devicePluginMetrics reads the device plugin pod's /metrics at its pod IP.
func (n *Node) devicePluginMetrics(t *T) string {
	pods, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gpuguard-device-plugin"})
	t.must(err, "listing the device plugin's pods")
	if len(pods.Items) != 1 || pods.Items[0].Status.PodIP == "" {
		t.Fatalf("%d device plugin pods, want 1 with an IP", len(pods.Items))
	}
	resp, err := http.Get("http://" + pods.Items[0].Status.PodIP + ":8080/metrics")
	t.must(err, "reading the device plugin's /metrics")
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// nodeFuse: /dev/fuse through the host-devices plugin, for an unprivileged pod that requests it only. The
// plugin's pod is started again first, with the node enforcer registered: it mounts the host's /dev, so
// the enforcer refuses it unless it exempts it, which an install's start order alone would not show.
func nodeFuse(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	n.restartGpuguardPods(t, "gpuguard-host-devices")
	defer n.deletePods(t, "fuse-requested", "fuse-not-requested")
	// <> would create a plain file where there is no device: the node is tested first.
	open := []string{"sh", "-c", "test -c /dev/fuse && exec 3<>/dev/fuse && echo opened"}
	with := n.runPod(t, cudaPod("fuse-requested", withRequest(fuseResource, "1")))
	if out, err := e.execIn(t, with, open...); err != nil || !strings.Contains(out, "opened") {
		t.Errorf("a pod that requested %s cannot open /dev/fuse: %v %s", fuseResource, err, out)
	}
	without := n.runPod(t, cudaPod("fuse-not-requested"))
	if out, err := e.execIn(t, without, open...); err == nil {
		t.Errorf("a pod that did not request %s opened /dev/fuse: %s", fuseResource, out)
	}
}

// nodeImageHardened: gpuguard's own containers run as the image says (65532, read-only root, no
// privilege), and all of their probes pass.
func nodeImageHardened(t *T, e *Env) {
	n := e.gpuguardFor(t)
	pods, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{})
	t.must(err, "listing gpuguard's pods")
	pids := taskPIDs(t, e)
	if len(pods.Items) == 0 {
		t.Fatalf("no gpuguard pod")
	}
	for _, pod := range pods.Items {
		if !podReady(pod) {
			t.Errorf("pod %s is not Ready", pod.Name)
		}
		for _, status := range pod.Status.ContainerStatuses {
			if status.RestartCount != 0 {
				t.Errorf("pod %s: container %s restarted %d times (a probe failed?)", pod.Name, status.Name, status.RestartCount)
			}
			_, id, _ := strings.Cut(status.ContainerID, "://")
			pid := pids[id]
			statusFile, err := os.ReadFile("/proc/" + pid + "/status")
			if pid == "" || err != nil {
				t.Errorf("pod %s: no process for container %s: %v", pod.Name, status.Name, err)
				continue
			}
			uid := ""
			for _, line := range strings.Split(string(statusFile), "\n") {
				if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
					uid = strings.Fields(rest)[1] // effective
				}
			}
			wantUID := "65532"
			if strings.Contains(pod.Name, "device-plugin") || strings.Contains(pod.Name, "host-devices") ||
				strings.Contains(pod.Name, "node-enforcer") {
				wantUID = "0" // the chart runs these as root, for the kubelet's and the runtime's sockets
			}
			if uid != wantUID {
				t.Errorf("pod %s: %s runs as UID %s, want %s", pod.Name, status.Name, uid, wantUID)
			}
			if strings.Contains(pod.Name, "node-enforcer") {
				// Its memory as the node spends it: its libraries' pages are shared with the device plugin's,
				// mapped from the same image files, so PSS and private memory say what it costs the node.
				if rollup, err := os.ReadFile("/proc/" + pid + "/smaps_rollup"); err == nil {
					var fields []string
					for _, line := range strings.Split(string(rollup), "\n") {
						for _, name := range []string{"Rss:", "Pss:", "Shared_Clean:", "Private_Clean:", "Private_Dirty:"} {
							if strings.HasPrefix(line, name) {
								fields = append(fields, strings.Join(strings.Fields(line), " "))
							}
						}
					}
					t.Logf("the node enforcer's memory on the node: %s", strings.Join(fields, ", "))
				}
			}
			mounts, err := os.ReadFile("/proc/" + pid + "/mountinfo")
			t.must(err, "reading a container's mounts")
			if !rootReadOnly(mounts) {
				t.Errorf("pod %s: %s's root filesystem is writable", pod.Name, status.Name)
			}
		}
	}
}

// rootReadOnly says whether the mount at / in a mountinfo is read-only.
func rootReadOnly(mountinfo []byte) bool {
	for _, line := range bytes.Split(mountinfo, []byte("\n")) {
		fields := strings.Fields(string(line))
		if len(fields) > 5 && fields[4] == "/" {
			return slices.Contains(strings.Split(fields[5], ","), "ro")
		}
	}
	return false
}

// nodeRollout: a rollout restart of the webhook while pods are created fails none of them; with no
// replica, failurePolicy Fail refuses creates, which succeed again once a replica is back.
func nodeRollout(t *T, e *Env) {
	n := e.gpuguardFor(t)
	deployments := n.cluster.client.AppsV1().Deployments(gpuguardNamespace)
	creates := n.startCreates(t)
	restart, _ := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{"kubectl.kubernetes.io/restartedAt": time.Now().Format(time.RFC3339)}}}}})
	_, err := deployments.Patch(t.ctx, webhookDeploy, types.StrategicMergePatchType, restart, metav1.PatchOptions{})
	t.must(err, "restarting the webhook Deployment")
	t.must(eventually(t.ctx, 3*time.Minute, func() error {
		d, err := deployments.Get(t.ctx, webhookDeploy, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := d.Status
		if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != *d.Spec.Replicas || s.AvailableReplicas != *d.Spec.Replicas || s.Replicas != *d.Spec.Replicas {
			return fmt.Errorf("rollout: %d updated, %d available, %d in all", s.UpdatedReplicas, s.AvailableReplicas, s.Replicas)
		}
		return nil
	}), "waiting for the rollout")
	creates.stop(t, "the rollout restart")

	d, err := deployments.Get(t.ctx, webhookDeploy, metav1.GetOptions{})
	t.must(err, "reading the webhook Deployment")
	original := *d.Spec.Replicas
	n.scaleWebhook(t, 0)
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		_, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, cudaPod("no-webhook"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return fmt.Errorf("a create was admitted with no webhook replica")
		}
		return nil
	}), "waiting for creates to be refused with no replica (failurePolicy Fail)")
	n.scaleWebhook(t, original)
	n.waitUntilPatching(t)
}

// scaleWebhook sets the webhook Deployment's replicas through its scale subresource.
func (n *Node) scaleWebhook(t *T, replicas int32) {
	deployments := n.cluster.client.AppsV1().Deployments(gpuguardNamespace)
	s, err := deployments.GetScale(t.ctx, webhookDeploy, metav1.GetOptions{})
	t.must(err, "reading the webhook's scale")
	s.Spec.Replicas = replicas
	_, err = deployments.UpdateScale(t.ctx, webhookDeploy, s, metav1.UpdateOptions{})
	t.must(err, "scaling the webhook")
}

// creates are dry-run pod creates, every 50 ms until stopped, each of which must come back patched.
type creates struct {
	created, failed atomic.Int64
	first           atomic.Value
	done            chan struct{}
	wg              sync.WaitGroup
	mu              sync.Mutex
	failures        []failedCreate
}

// failedCreate is a create that failed, when it was sent, and why.
type failedCreate struct {
	at  time.Time
	why string
}

func (n *Node) startCreates(t *T) *creates {
	c := &creates{done: make(chan struct{})}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			select {
			case <-c.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			sent := time.Now()
			pod, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, cudaPod("create"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err == nil && visibleDevices(pod.Spec.Containers[0]) != "none" {
				err = fmt.Errorf("stored with NVIDIA_VISIBLE_DEVICES %s", visibleDevices(pod.Spec.Containers[0]))
			}
			if err != nil {
				c.failed.Add(1)
				c.first.CompareAndSwap(nil, err.Error())
				c.mu.Lock()
				c.failures = append(c.failures, failedCreate{at: sent, why: err.Error()})
				c.mu.Unlock()
			}
			c.created.Add(1)
		}
	}()
	return c
}

// end ends the creates and returns those that failed.
func (c *creates) end() []failedCreate {
	close(c.done)
	c.wg.Wait()
	return c.failures
}

// stop ends the creates and fails the scenario if any failed during what.
func (c *creates) stop(t *T, what string) {
	c.end()
	if c.failed.Load() != 0 {
		t.Errorf("%d of %d creates failed during %s; first: %v", c.failed.Load(), c.created.Load(), what, c.first.Load())
	}
	t.Logf("%d creates during %s, %d failed", c.created.Load(), what, c.failed.Load())
}

// nodeCertRotation: the chart's own rotation (delete the serving certificate's Secret, helm upgrade: a
// new certificate from the same CA) reaches every webhook replica through the kubelet's Secret volume,
// with no restart and no failed create.
func nodeCertRotation(t *T, e *Env) {
	n := e.gpuguardFor(t)
	secrets := n.cluster.client.CoreV1().Secrets(gpuguardNamespace)
	secretName := webhookDeploy + "-tls"
	old, err := secrets.Get(t.ctx, secretName, metav1.GetOptions{})
	t.must(err, "reading the serving certificate's Secret")
	restarts := n.webhookRestarts(t)
	creates := n.startCreates(t)
	started := time.Now()
	t.must(secrets.Delete(t.ctx, secretName, metav1.DeleteOptions{}), "deleting the serving certificate's Secret")
	n.helm(t, e, "upgrade", "--reuse-values")
	rotated, err := secrets.Get(t.ctx, secretName, metav1.GetOptions{})
	t.must(err, "reading the new Secret")
	if bytes.Equal(rotated.Data["tls.crt"], old.Data["tls.crt"]) {
		t.Fatalf("helm upgrade kept the old certificate")
	}
	block, _ := pem.Decode(rotated.Data["tls.crt"])
	if block == nil {
		t.Fatalf("the new Secret's tls.crt is not PEM")
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(rotated.Data["ca.crt"])
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		for _, pod := range n.webhookPods(t) {
			conn, err := tls.Dial("tcp", pod.Status.PodIP+":8443", &tls.Config{RootCAs: pool, ServerName: webhookDeploy + "." + gpuguardNamespace + ".svc"})
			if err != nil {
				return fmt.Errorf("replica %s: %w", pod.Name, err)
			}
			served := conn.ConnectionState().PeerCertificates[0].Raw
			conn.Close()
			if !bytes.Equal(served, block.Bytes) {
				return fmt.Errorf("replica %s still serves the old certificate", pod.Name)
			}
		}
		return nil
	}), "waiting for every replica to serve the new certificate")
	took := time.Since(started)
	creates.stop(t, "the rotation")
	if after := n.webhookRestarts(t); after != restarts {
		t.Errorf("webhook containers restarted: %d before, %d after", restarts, after)
	}
	t.Logf("Secret deleted to every replica serving the new certificate: %s", took.Round(100*time.Millisecond))
}

// nodeKustomize: the kustomize default installs the same way: the Helm release uninstalled as
// operations.md says, its hooks cleaning the node, nothing of it left (helmUninstall), then an overlay of
// manifests/default that sets only the image, applied with the repo's kubectl as the README says:
// everything but what refuses pods, the rollout, then the rest; the webhook patches, a GPU-less pod sees
// no GPU, and a GPU pod gets one from the kustomize device plugin.
func nodeKustomize(t *T, e *Env) {
	n := e.gpuguardFor(t)
	e.render(t, "default") // copies manifests/ (the uninstall's overlay too) and makes the overlay's certificates
	n.helmUninstall(t, e)
	overlay := e.path("manifests", "node-image")
	t.must(os.MkdirAll(overlay, 0o755), "creating the image overlay")
	components := ""
	if n.onCRIO() {
		components = "components: [../cri-o]\n" // node-enforcer.md tells a CRI-O admin to add it
	}
	t.must(os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../default]
%simages:
  - {name: gpuguard, newName: %s, newTag: %s}
`, components, gpuguardRepo, gpuguardTag)), 0o644), "writing the image overlay")
	e.render(t, "node-image") // the pinned kustomize renders it, as the manifest tests do
	out, err := n.kubectl(t, e, "apply", "-k", overlay, "-l", "gpuguard.io/refuses-pods!=true")
	t.must(err, "kubectl apply -k of everything but what refuses pods: "+out)
	if left := n.refusing(t, e); len(left) != 0 {
		t.Errorf("the first apply, which leaves out what refuses pods, applied %v", left)
	}
	out, err = n.kubectl(t, e, "-n", gpuguardNamespace, "rollout", "status", "deployment/"+webhookDeploy, "--timeout=5m")
	t.must(err, "kubectl rollout status: "+out)
	out, err = n.kubectl(t, e, "apply", "-k", overlay)
	t.must(err, "kubectl apply -k: "+out)
	n.installed = true
	t.must(eventually(t.ctx, 3*time.Minute, func() error {
		d, err := n.cluster.client.AppsV1().Deployments(gpuguardNamespace).Get(t.ctx, webhookDeploy, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.AvailableReplicas != *d.Spec.Replicas {
			return fmt.Errorf("%d of %d webhook replicas available", d.Status.AvailableReplicas, *d.Spec.Replicas)
		}
		plugins, err := n.cluster.client.AppsV1().DaemonSets(gpuguardNamespace).List(t.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ds := range plugins.Items {
			// gpuguard-node-report runs only on the GPU Operator's nodes: none here.
			want := int32(1)
			if ds.Name == "gpuguard-node-report" {
				want = 0
			}
			if ds.Status.DesiredNumberScheduled != want || ds.Status.NumberReady != want {
				return fmt.Errorf("DaemonSet %s: %d of %d ready, want %d", ds.Name, ds.Status.NumberReady, ds.Status.DesiredNumberScheduled, want)
			}
		}
		return nil
	}), "waiting for the kustomize installation to be ready")
	n.waitUntilPatching(t)
	defer n.deletePods(t, "kustomize-none", "kustomize-gpu")
	none := n.look(t, e, n.runPod(t, cudaPod("kustomize-none")))
	if len(none.gpus()) != 0 || none.value != "none" {
		t.Errorf("with the kustomize installation, a pod that asked for no GPU: %s", none)
	}
	gpu := n.look(t, e, n.runPod(t, cudaPod("kustomize-gpu", withRequest(gpuResource, "1"))))
	if len(gpu.gpus()) != 1 {
		t.Errorf("with the kustomize installation, a pod that asked for one GPU: %s", gpu)
	}
}

// nodeScenarios run last, in this order: control, install-unpullable and break-glass need the node without
// gpuguard; image-hardened counts container restarts, and audit needs the pod control left running, so
// the scenarios that kill and restart things come after both.
var nodeScenarios = []scenario{
	{"node/control", "before gpuguard: a pod that asked for no GPU sees both GPUs, and so does a static pod; void sees none; none fails the create", nodeControl},
	{"node/install-unpullable", "helm install with an image no node can pull refuses no pod while it fails (armed at once, the control, refuses every one); uninstalled, nothing is left", nodeInstallUnpullable},
	{"node/break-glass", "a release armed by its hook; its namespace deleted: pods refused until operations.md's break-glass; uninstalled, then the namespace deleted: pods admitted, nothing left", nodeBreakGlass},
	{"node/arm-probe", "a release in policy mode off until armed, whose webhook Service is pointed at a closed port (the kubelet's probes pass, the API server cannot reach the webhook): the arm hook's dry-run pod comes back unpatched, so helm install fails with nothing armed, saying why in its log (probed through the API server the kubernetes Service lists, at its own address) and a NotArmed Event that kubectl describe deployment shows; with the Service restored, helm upgrade arms; armed, an upgrade with the Service pointed away again fails its probe (a NotReached Event) and leaves it armed, and the next one passes", nodeArmProbe},
	{"node/rollback", "a release armed by its hook, upgraded, then rolled back to its first revision: the post-rollback hook arms it again (without hooks, the control, it stays Ignore and Warn)", nodeRollback},
	{"node/gitops", "Argo CD's way (helm template with webhook.armAfterReady=false, refused without cert-manager, rendered once with selfSigned.renderWithoutCluster, applied in sync waves): armed once the webhook is available, pods patched, live as rendered; Flux's way (Helm with hooks): its drift correction to revision 1's manifest, with the docs' ignore rules, keeps it armed, without them (the control) the webhook configuration is disarmed; the break glass that self-heal does not revert (every namespace labelled gpuguard.io/ignore=break-glass) admits pods during an outage, and taken off by its value, refuses them again", nodeGitOps},
	{"node/closed", "helm install; the same pod starts and sees no GPU", nodeClosed},
	{"node/own-node-writes", "the device plugin's token bound to its pod may patch its own Node's status, not another's, and one bound to no pod none (gpuguard-device-plugin-own-node); the admin may", nodeOwnNodeWrites},
	{"node/enforcer-static-pod", "a static pod of the CUDA-like image sees no GPU: the node enforcer set void", nodeEnforcerStaticPod},
	{"node/enforcer-running", "a pod started before the enforcer is reported (a series and a Node event that kubectl describe node shows) and left running, seeing both GPUs", nodeEnforcerRunning},
	{"node/enforcer-bypassed", "the webhook configuration and the backstop binding deleted: a GPU-less pod sees no GPU, a GPU pod its own GPU (one that sets all itself is refused on containerd), a forged annotation nothing, a cdi.k8s.io/ annotation naming a GPU nothing (refused on CRI-O); an allowlisted namespace and gpuguard's device plugin keep both, a pod of its account without its label none; audit changes nothing and counts", nodeEnforcerBypassed},
	{"node/gpu-infrastructure", "NVIDIA's components recognised by default, by namespace, account and label together: the GPU Operator's device plugin (privileged, all, NVIDIA's MPS root) and NVIDIA's static manifest see both GPUs; without the label, unprivileged, refused; the GPU Operator's kata manager (privileged, the host's / mounted) sees NVIDIA's MPS root unmasked; the same account and label in a user namespace gets none, and the enforcer counts it as unlisted GPU infrastructure (the alert's series), logs the entry it looks like, and says so in a Warning Event on the pod that kubectl describe shows", nodeGPUInfrastructure},
	{"node/nvidia-device-plugin", "NVIDIA's device plugin v0.20.0 (-peers) as its static manifest runs it and installed from its own Helm chart with helm install (release gpu-sharing, not nvdp): it registers and serves both GPUs and sees both; gpuguard's plugin, started after it, leaves them to it; its pods see the GPU it allocated alone, also time-sliced (UUID::n), GPU-less pods none; gone and the kubelet restarted, gpuguard's does not take them, nor after its own restart (its record); its pod on the node but not registered (its image not there), gpuguard's started afresh withholds both GPUs; then gpuguard's serving first, one pod given a GPU, and NVIDIA's started with renamed time-slicing (nvidia.com/gpu.shared): gpuguard's withholds both GPUs, for good, and counts the GPU held twice while a pod of NVIDIA's holds it too; the same with NVIDIA's time-slicing under gpuguard's own name, nvidia.com/gpu, also once gpuguard's is restarted beside it and only reports", nodeNvidiaDevicePlugin},
	{"node/nvidia-dra-driver", "NVIDIA's DRA driver (-peers) installed from its own chart in dra-driver-nvidia-gpu: its kubelet plugin's pod, its prestart check waiting for nvidia-smi and nothing published, makes gpuguard's device plugin started afresh withhold both GPUs; once the driver root is complete, the pod, exempt by gpuguard's built-in entry, keeps the chart's void and publishes both GPUs; a pod claiming one through gpu.nvidia.com sees that GPU alone (void, from the claim's CDI spec); the same claim with the other GPU mounted is refused by the enforcer, which read the claim's CDI devices from pod-resources; a GPU-less pod none; a pod asking for one nvidia.com/gpu gets the other GPU through the DRA driver (extendedResourceName) and sees it alone, and one that also mounts the claimed GPU is refused, naming it; gpuguard's device plugin withholds the GPUs the slice publishes; nothing of the pods left once the driver is uninstalled", leftoverChecked(nodeNvidiaDRADriver)},
	{"node/driver-late", "the driver not loaded (its procfs directory absent and impossible to make): gpuguard's device plugin and node enforcer start all the same, the plugin reporting no GPU; the driver loaded, the enforcer (not restarted) knows both GPUs and a GPU pod sees its own alone, a GPU-less pod none", nodeDriverLate},
	{"node/enforcer-refuses", "a GPU-less pod mounting /dev/nvidia1, or the MPS root, by hostPath is refused at its creation with gpuguard's message", nodeEnforcerRefuses},
	{"node/agents", "node agents in their charts' shapes (node-exporter's / read-only HostToContainer, a privileged security agent's /, a log shipper's /run, a CNI agent's /var/run) start under the defaults and keep running; inside each, every MPS root below its mount is an empty read-only tmpfs, though the host's hold a file, and a file beside them is there; the enforcer counts the masks", nodeAgents},
	{"node/enforcer-bounded", "under the chart's memory limit: 180 running containers whose image sets the four variables the enforcer reads to 64 KiB each, a fresh enforcer registering over them, and a volume mounted at a path of 256 KiB: the enforcer never restarts, refuses the path by name, and a GPU-less and a GPU pod come out as before", leftoverChecked(nodeEnforcerBounded)},
	{"node/enforcer-failure", "the enforcer gone: fail-open starts pods (the webhook still covers them); fail-closed refuses them clearly until it is back; after the runtime's restart it registers again and the next pod is enforced", nodeEnforcerFailure},
	{"node/break-glass-node", "fail-closed, a pod the enforcer refuses: operations.md's kubectl create configmap gpuguard-break-glass lets the same pod start as it is within seconds (a series says so); deleted, refused again", nodeBreakGlassNode},
	{"node/no-nri", "the runtime (containerd or CRI-O) with NRI off: the enforcer's pod is Ready all the same and reports the node not enforced (/readyz, a series), where a kube-system pod sees both GPUs; NRI back on: registered, and the next pod gets void", nodeNoNRI},
	{"node/hardened", "the toolkit ignoring the variable in unprivileged containers and the plugin's GPUs as CDI devices: the report and condition say hardened; admission bypassed and the enforcer away while pods are created, GPU-less pods see no GPU, one that sets all or an index included, and a GPU pod its own", nodeHardened},
	{"node/allocated", "two pods asking for one GPU each see the one the plugin allocated, and not the other", nodeAllocated},
	{"node/time-slicing", "the plugin's config time-slices GPU 0 alone as nvidia.com/gpu.shared: two pods holding its replicas see GPU 0 alone by its UUID, one of them keeping the CUDA variables it set, a whole-GPU pod GPU 1, a GPU-less pod none; both whole again once the config goes", nodeTimeSlicing},
	{"node/mps", "the plugin's config shares GPU 0 through MPS: the chart's daemon for GPU 0 alone; a client sees GPU 0's pipe and shm alone and its limit, also one that set the CUDA variables itself; a GPU-less pod no MPS directory; a config change registers again and the client keeps its mounts", nodeMPS},
	{"node/none-void", "the plugin adds nvidia.com/gpu=none; none and void both start with no GPU; its node report and Node condition agree", nodeNoneVoid},
	{"node/report-flip", "without the device none the report and the Node condition say breaks-pods, audit lists the node, and a GPU-less pod fails (on CRI-O starts with void, which the enforcer wrote); with it back, honoured", nodeReportFlip},
	{"node/policy-reload", "a ConfigMap change reaches the webhook pods through the kubelet's volume, without a restart", nodePolicyReload},
	{"node/fuse", "the host-devices plugin started again under the node enforcer is Ready; an unprivileged pod opens /dev/fuse when it requests it, and only then", nodeFuse},
	{"node/image-hardened", "gpuguard's containers run as 65532 (the plugins and the node enforcer as root) on a read-only root, probes passing", nodeImageHardened},
	{"node/cert-rotation", "the chart's certificate rotation reaches every webhook replica, no restart, no failed create", nodeCertRotation},
	{"node/outage-node-enforcer", "helm upgrade --set webhook.outage=node-enforcer: the webhook configuration at Ignore; scaled to no replica, a GPU-less pod is admitted unpatched and, on the GPU node, sees no GPU (void, the node enforcer's); back at refuse, armed again (Fail)", nodeOutageNodeEnforcer},
	{"node/outage-gpu-taints", "helm upgrade --set-json webhook.gpuNodeTaints: with a replica every pod is patched and a patched pod that cannot land on a GPU node may not be given the toleration; with none, a pod that does not tolerate the GPU nodes' taint is admitted unpatched, one that tolerates it or names a node is refused, and so is an UPDATE adding the toleration to the pod stored unpatched (the backstop)", nodeOutageGpuTaints},
	{"node/rollout", "a rollout restart fails no create; with no replica creates are refused, then admitted", nodeRollout},
	{"node/audit", "helm upgrade with audit.enabled: the chart's audit controller, on the node as its image, reports a kube-system pod that sees every GPU in a PolicyReport, and one replica holds the Lease; every runbook command of operations.md runs", nodeAudit},
	{"node/kubelet-restart", "two pods hold both GPUs; the kubelet restarts: the plugin registers again, each pod still sees its own GPU alone, a third GPU pod waits and then gets the GPU one of them frees", leftoverChecked(nodeKubeletRestart)},
	{"node/plugin-killed", "the device plugin killed with SIGKILL while pods are created 50 ms apart: it comes back, every pod runs, the two GPU pods on distinct GPUs, the rest with none", leftoverChecked(nodePluginKilled)},
	{"node/containerd-restart", "the runtime (containerd, or CRI-O with -runtime crio) restarted under a GPU pod and a GPU-less one: same containers, same sights; new pods patched; the node report stays honoured", leftoverChecked(nodeContainerdRestart)},
	{"node/webhook-killed", "creates every 50 ms: a webhook replica evicted under the PodDisruptionBudget fails none; one killed with SIGKILL fails only those sent to it, within seconds, and none once it is back", leftoverChecked(nodeWebhookKilled)},
	{"node/restart", "the whole node as after a reboot (the kubelet and the runtime stopped, every container killed, the runtime's state in /run gone): a GPU-less pod comes back seeing what it saw; a bare GPU pod is refused by the kubelet before the plugin registers, a Deployment's comes back on a GPU of its own; the kubelet's checkpoint agrees", leftoverChecked(nodeRestart)},
	{"node/uninstall-unclean", "helm uninstall while a tmpfs under the node's MPS root (an MPS daemon's) keeps it from being cleaned, uninstall.timeoutSeconds=15: it fails naming the hook Job, whose log names the node, Helm having deleted the cleanup's DaemonSet and ClusterRole; the node's condition removed all the same; the tmpfs gone, operations.md's kustomize cleanup leaves nothing", nodeUninstallUnclean},
	{"node/kustomize", "the Helm release uninstalled as operations.md says, its post-delete hooks cleaning the node (its files, its GPUIsolation condition): nothing of it left in the API or on the node; then manifests/default with only the image set, applied: the same guarantees", nodeKustomize},
	{"node/uninstall", "the kustomize installation uninstalled as operations.md says, its leftovers removed with its commands and manifests/uninstall: nothing of gpuguard left in the API or on the node, the runtime's config as shipped, and a GPU-less pod sees both GPUs as before gpuguard", nodeUninstall},
}

// nodeAudit: the in-cluster audit as the chart ships it, on the real node. A pod in kube-system (which
// the webhook does not look at) keeps the image's NVIDIA_VISIBLE_DEVICES=all in its spec (the node
// enforcer sets void in its container, which the API does not show); the audit Deployment, switched on by
// helm upgrade, puts it in kube-system's PolicyReport, and the pod node/control left running before any
// enforcer, which does see both GPUs, in its namespace's.
func nodeAudit(t *T, e *Env) {
	n := e.gpuguardFor(t)
	c := n.cluster
	pod := cudaPod("audit-exposed")
	created, err := c.client.CoreV1().Pods("kube-system").Create(t.ctx, pod, metav1.CreateOptions{})
	t.must(err, "creating a pod in kube-system")
	defer func() {
		err := c.client.CoreV1().Pods("kube-system").Delete(t.ctx, created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the kube-system pod: %v", err)
		}
	}()
	n.helm(t, e, "upgrade", "--reuse-values", "--set", "audit.enabled=true", "--set", "audit.policyReportCRD=true")
	defer n.helm(t, e, "upgrade", "--reuse-values", "--set", "audit.enabled=false")
	started := time.Now()
	var verdict string
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		r, err := c.dynamic.Resource(policyReports).Namespace("kube-system").Get(t.ctx, auditReportName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if verdict = resultFor(r, created.Name); verdict == "" {
			return fmt.Errorf("kube-system's PolicyReport has no result for %s", created.Name)
		}
		return nil
	}), "waiting for the audit's PolicyReport in kube-system")
	if verdict != "fail" && verdict != "skip" {
		t.Errorf("the kube-system pod's result is %q, want fail (or skip, were kube-system exempt)", verdict)
	}
	if _, err := c.client.CoreV1().Pods(nodeNamespace).Get(t.ctx, beforeEnforcerPod, metav1.GetOptions{}); err == nil {
		defer n.deletePods(t, beforeEnforcerPod)
		t.must(eventually(t.ctx, 2*time.Minute, func() error {
			r, err := c.dynamic.Resource(policyReports).Namespace(nodeNamespace).Get(t.ctx, auditReportName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if verdict = resultFor(r, beforeEnforcerPod); verdict != "fail" {
				return fmt.Errorf("%s's PolicyReport gives %s %q, want fail", nodeNamespace, beforeEnforcerPod, verdict)
			}
			return nil
		}), "waiting for the PolicyReport of the pod started before the enforcer")
		t.Logf("%s's PolicyReport: %s for %s, the pod started before the enforcer", nodeNamespace, verdict, beforeEnforcerPod)
	} else if !apierrors.IsNotFound(err) {
		t.Errorf("reading %s: %v", beforeEnforcerPod, err)
	} else {
		t.Fatalf("no pod %s: node/control starts it before gpuguard, run it first", beforeEnforcerPod)
	}
	t.Logf("kube-system's PolicyReport has %s for the pod %s after the helm upgrade", verdict, time.Since(started).Round(100*time.Millisecond))
	lease, err := c.client.CoordinationV1().Leases(gpuguardNamespace).Get(t.ctx, "gpuguard-audit", metav1.GetOptions{})
	t.must(err, "reading the audit Lease")
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	pods, err := c.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{})
	t.must(err, "listing gpuguard's pods")
	auditPods := 0
	held := false
	for _, p := range pods.Items {
		if strings.Contains(p.Name, "-audit-") {
			auditPods++
			held = held || strings.HasPrefix(holder, p.Name)
		}
	}
	if auditPods < 2 || !held {
		t.Errorf("the audit Lease is held by %q; want one of the %d audit pods (the chart runs two)", holder, auditPods)
	}
	// With everything the runbook reads in place (the audit's Deployment and kube-system's PolicyReport).
	n.runRunbook(t, e, "kube-system")
}

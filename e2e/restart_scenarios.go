// The node/ scenarios of issue 37: what a node goes through besides steady running. The kubelet restarted
// (an upgrade), the device plugin killed, containerd restarted, a webhook replica evicted or killed, and
// the whole node restarted (a reboot), each under running pods whose containers are looked at from
// inside before and after.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The kubelet's record of which devices it gave which container, kept across its restarts.
const deviceCheckpoint = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"

// ownGPU is the UUID of the one GPU a container sees, or "" (and an error) unless it sees exactly one,
// with that GPU's device node alone.
func ownGPU(t *T, what string, s sight) string {
	for m := 0; m < nodeGPUs; m++ {
		if s.value == fakeGPUUUID(m) && slices.Equal(s.gpus(), []string{"nvidia" + strconv.Itoa(m)}) {
			return s.value
		}
	}
	t.Errorf("%s: %s; want one GPU alone, its UUID in NVIDIA_VISIBLE_DEVICES", what, s)
	return ""
}

// expectGPULess fails unless the container sees no GPU and the injected none.
func expectGPULess(t *T, what string, s sight) {
	if len(s.gpus()) != 0 || s.value != "none" {
		t.Errorf("%s: %s; want no GPU and none", what, s)
	}
}

func logSize(e *Env, name string) int64 {
	info, err := os.Stat(e.path("logs", name+".log"))
	if err != nil {
		return 0
	}
	return info.Size()
}

// waitForLog waits until the component's log, after offset, holds text.
func waitForLog(t *T, e *Env, name string, offset int64, text string, timeout time.Duration) {
	t.must(eventually(t.ctx, timeout, func() error {
		log, err := os.ReadFile(e.path("logs", name+".log"))
		if err != nil {
			return err
		}
		if int64(len(log)) > offset && strings.Contains(string(log[offset:]), text) {
			return nil
		}
		return fmt.Errorf("logs/%s.log has no %q yet", name, text)
	}), "waiting for "+text)
}

// The kubelet's line when a device plugin registers the GPUs.
const gpuRegistration = `Got registration request from device plugin with resource" resourceName="` + gpuResource + `"`

// waitForGPUs waits until the node offers both GPUs again: the plugin's devices healthy and the Node's
// allocatable back to two.
func (n *Node) waitForGPUs(t *T) {
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		node, err := n.cluster.client.CoreV1().Nodes().Get(t.ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if q := node.Status.Allocatable[gpuResource]; q.Value() != nodeGPUs {
			return fmt.Errorf("allocatable %s is %s", gpuResource, q.String())
		}
		return nil
	}), "waiting for the node to offer both GPUs")
}

// devicePluginContainer is the device plugin pod's container status.
func (n *Node) devicePluginContainer(t *T) corev1.ContainerStatus {
	pods, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gpuguard-device-plugin"})
	t.must(err, "listing the device plugin's pods")
	if len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) == 0 {
		t.Fatalf("%d device plugin pods, want 1 with a container", len(pods.Items))
	}
	return pods.Items[0].Status.ContainerStatuses[0]
}

// nodeKubeletRestart: two pods hold the two GPUs; the kubelet restarts. The plugin registers again, both
// pods still see their own GPU alone, a third GPU pod waits without a GPU, and starts on the GPU freed
// when one of the two is deleted.
func nodeKubeletRestart(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitUntilPatching(t)
	defer n.deletePods(t, "restart-a", "restart-b", "restart-c")
	held := map[string]string{}
	for _, name := range []string{"restart-a", "restart-b"} {
		held[name] = ownGPU(t, "pod "+name+" before the restart", n.look(t, e, n.runPod(t, cudaPod(name, withRequest(gpuResource, "1")))))
	}
	if held["restart-a"] == held["restart-b"] {
		t.Fatalf("both pods hold %s", held["restart-a"])
	}
	offset := logSize(e, "kubelet")
	started := time.Now()
	n.kubelet.stop()
	t.must(e.startKubelet(n), "starting the kubelet again")
	waitForLog(t, e, "kubelet", offset, gpuRegistration, time.Minute)
	t.Logf("the kubelet restarted; the device plugin registered with it again %s after the stop", time.Since(started).Round(100*time.Millisecond))
	n.waitForGPUs(t)
	for _, name := range []string{"restart-a", "restart-b"} {
		if got := ownGPU(t, "pod "+name+" after the restart", n.look(t, e, n.waitRunning(t, nodeNamespace, name))); got != held[name] {
			t.Errorf("pod %s sees %s after the restart, %s before", name, got, held[name])
		}
	}
	// No GPU is free: the third waits, and never runs, for as long as both are held.
	_, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, cudaPod("restart-c", withRequest(gpuResource, "1")), metav1.CreateOptions{})
	t.must(err, "creating a third GPU pod")
	for waited := time.Duration(0); waited < 10*time.Second; waited += time.Second {
		p, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Get(t.ctx, "restart-c", metav1.GetOptions{})
		t.must(err, "reading the third pod")
		if p.Status.Phase != corev1.PodPending || len(p.Status.ContainerStatuses) != 0 {
			t.Fatalf("the third GPU pod, with both GPUs held: %s, %+v; want it Pending, with no container", p.Status.Phase, p.Status.ContainerStatuses)
		}
		time.Sleep(time.Second)
	}
	n.deletePods(t, "restart-a")
	third := ownGPU(t, "the third pod, once restart-a is gone", n.look(t, e, n.waitRunning(t, nodeNamespace, "restart-c")))
	if third != held["restart-a"] {
		t.Errorf("the third pod sees %s; want %s, the GPU restart-a freed (restart-b holds %s)", third, held["restart-a"], held["restart-b"])
	}
	t.Logf("after the kubelet restart: restart-b keeps %s; restart-c waited, then got %s", held["restart-b"], third)
}

// nodePluginKilled: the device plugin killed (SIGKILL) while pods are created every 50 ms, two of them
// asking for a GPU. Its container comes back by itself and registers again; health and capacity come back
// without a kubelet restart. Every GPU-less pod runs with none. A GPU pod either runs on a GPU of its own,
// or, bound while the plugin was gone, was refused by the kubelet's admission with no container made (the
// kubelet marks a resource's devices unhealthy the moment its plugin goes, and refuses a pod that needs
// them rather than holding it); made again, as its controller would, it runs on a GPU of its own.
func nodePluginKilled(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitUntilPatching(t)
	n.waitForGPUs(t)
	plugin := n.devicePluginContainer(t)
	_, id, _ := strings.Cut(plugin.ContainerID, "://")
	pid, err := strconv.Atoi(taskPIDs(t, e)[id])
	t.must(err, "finding the device plugin's process")
	const pods = 10
	names := make([]string, pods)
	gpu := func(i int) bool { return i == 2 || i == 6 }
	defer func() { n.deletePods(t, names...) }()
	offset := logSize(e, "kubelet")
	var killedAt time.Time
	for i := range names {
		names[i] = "killed-" + strconv.Itoa(i)
		pod := cudaPod(names[i])
		if gpu(i) {
			pod = cudaPod(names[i], withRequest(gpuResource, "1"))
		}
		_, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, pod, metav1.CreateOptions{})
		t.must(err, "creating pod "+names[i])
		if i == 1 {
			t.must(syscall.Kill(pid, syscall.SIGKILL), "killing the device plugin")
			killedAt = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitForLog(t, e, "kubelet", offset, gpuRegistration, 2*time.Minute)
	t.Logf("the device plugin registered again %s after SIGKILL", time.Since(killedAt).Round(100*time.Millisecond))
	n.waitForMetric(t, `gpuguard_device_plugin_devices{resource="`+gpuResource+`",health="healthy"} `+strconv.Itoa(nodeGPUs))
	n.waitForGPUs(t)
	if after := n.devicePluginContainer(t); after.RestartCount != plugin.RestartCount+1 {
		t.Errorf("the device plugin's container restarted %d times, %d before the kill; want one more", after.RestartCount, plugin.RestartCount)
	}
	seen := map[string]string{}
	var refused []string
	for i, name := range names {
		if !gpu(i) {
			expectGPULess(t, "pod "+name+", no GPU requested", n.look(t, e, n.waitRunning(t, nodeNamespace, name)))
			continue
		}
		running, why := n.runningOrRefused(t, name)
		if running == nil {
			refused = append(refused, name+": "+why)
			names = append(names, name+"-again")
			running = n.runPod(t, cudaPod(name+"-again", withRequest(gpuResource, "1")))
		}
		uuid := ownGPU(t, "pod "+running.Name+", one GPU requested", n.look(t, e, running))
		if other, taken := seen[uuid]; taken && uuid != "" {
			t.Errorf("pods %s and %s both got %s", other, running.Name, uuid)
		}
		seen[uuid] = running.Name
	}
	t.Logf("%d pods created 50 ms apart around the kill; GPU pods refused at admission while the plugin was gone, none given a GPU: %v; the GPUs went to %v",
		pods, refused, seen)
}

// runningOrRefused waits until the pod runs, or until the kubelet has refused it at admission (Failed,
// with no container ever made); then it returns nil and the kubelet's reason.
func (n *Node) runningOrRefused(t *T, name string) (*corev1.Pod, string) {
	var running *corev1.Pod
	var why string
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		p, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Get(t.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase == corev1.PodFailed {
			for _, status := range p.Status.ContainerStatuses {
				if status.ContainerID != "" {
					return fmt.Errorf("pod %s failed after its container %s was made: %s", name, status.Name, p.Status.Message)
				}
			}
			why = p.Status.Reason + ": " + p.Status.Message
			return nil
		}
		for _, status := range p.Status.ContainerStatuses {
			if status.State.Running != nil {
				running = p
				return nil
			}
		}
		return fmt.Errorf("pod %s is %s", name, p.Status.Phase)
	}), "waiting for pod "+name+" to run or be refused")
	return running, why
}

// nodeContainerdRestart: containerd restarted under a GPU pod and a GPU-less one. Both keep running the
// same containers with the same GPUs; new pods are patched and see what they should; the node report and
// the Node condition stay right.
func nodeContainerdRestart(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitUntilPatching(t)
	defer n.deletePods(t, "containerd-gpu", "containerd-none", "containerd-gpu-after", "containerd-none-after")
	gpuPod := n.runPod(t, cudaPod("containerd-gpu", withRequest(gpuResource, "1")))
	held := ownGPU(t, "the GPU pod before the restart", n.look(t, e, gpuPod))
	nonePod := n.runPod(t, cudaPod("containerd-none"))
	expectGPULess(t, "the GPU-less pod before the restart", n.look(t, e, nonePod))
	t.must(e.restartRuntime(n, ""), "restarting the runtime")
	for _, before := range []*corev1.Pod{gpuPod, nonePod} {
		after := n.waitRunning(t, nodeNamespace, before.Name)
		if containerID(t, after) != containerID(t, before) || after.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("pod %s: container %s, restarted %d times; want the same container as before the restart, %s",
				before.Name, containerID(t, after), after.Status.ContainerStatuses[0].RestartCount, containerID(t, before))
		}
	}
	if got := ownGPU(t, "the GPU pod after the restart", n.look(t, e, gpuPod)); got != held {
		t.Errorf("the GPU pod sees %s after the restart, %s before", got, held)
	}
	expectGPULess(t, "the GPU-less pod after the restart", n.look(t, e, nonePod))
	other := ownGPU(t, "a GPU pod created after the restart", n.look(t, e, n.runPod(t, cudaPod("containerd-gpu-after", withRequest(gpuResource, "1")))))
	if other == held {
		t.Errorf("a GPU pod created after the restart got %s, which containerd-gpu holds", other)
	}
	expectGPULess(t, "a GPU-less pod created after the restart", n.look(t, e, n.runPod(t, cudaPod("containerd-none-after"))))
	n.waitForMetric(t, `gpuguard_device_plugin_value_honoured{value="none",verdict="honoured"} 1`)
	n.waitForCondition(t, "True", "Honoured", "NVIDIA_VISIBLE_DEVICES=none: ")
}

// nodeWebhookKilled: creates every 50 ms while a webhook replica is evicted (a drain: the
// PodDisruptionBudget lets one go at a time, and the replica drains before it exits): none fails. Then
// while another is killed with SIGKILL, as an OOM kill or a crash would: under failurePolicy Fail the
// API server refuses the creates it sends to the dead replica, and does not retry them, until the
// kubelet has seen the container die and the replica's endpoint is gone. Those failures must all be that
// replica's, within seconds of the kill, and none once it is back.
func nodeWebhookKilled(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitUntilPatching(t)
	deployments := n.cluster.client.AppsV1().Deployments(gpuguardNamespace)
	allAvailable := func() error {
		d, err := deployments.Get(t.ctx, webhookDeploy, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s := d.Status; s.AvailableReplicas != *d.Spec.Replicas || s.Replicas != *d.Spec.Replicas {
			return fmt.Errorf("%d of %d webhook replicas available, %d in all", s.AvailableReplicas, *d.Spec.Replicas, s.Replicas)
		}
		return nil
	}
	t.must(eventually(t.ctx, 2*time.Minute, allAvailable), "waiting for every webhook replica")

	creates := n.startCreates(t)
	time.Sleep(time.Second)
	victim := n.webhookPods(t)[0]
	t.must(eventually(t.ctx, time.Minute, func() error { // once the disruption controller has counted the replicas
		return n.cluster.client.CoreV1().Pods(gpuguardNamespace).EvictV1(t.ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: victim.Name, Namespace: gpuguardNamespace}})
	}), "evicting webhook replica "+victim.Name)
	t.must(eventually(t.ctx, 3*time.Minute, func() error {
		if _, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).Get(t.ctx, victim.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("replica %s is still there", victim.Name)
		}
		return allAvailable()
	}), "waiting for the evicted replica's successor")
	creates.stop(t, "a webhook replica evicted")

	creates = n.startCreates(t)
	time.Sleep(time.Second)
	victim = n.webhookPods(t)[0]
	_, id, _ := strings.Cut(victim.Status.ContainerStatuses[0].ContainerID, "://")
	pid, err := strconv.Atoi(taskPIDs(t, e)[id])
	t.must(err, "finding webhook replica "+victim.Name+"'s process")
	killed := time.Now()
	t.must(syscall.Kill(pid, syscall.SIGKILL), "killing webhook replica "+victim.Name)
	var back time.Time
	t.must(eventually(t.ctx, 3*time.Minute, func() error {
		p, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).Get(t.ctx, victim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.ContainerStatuses[0].RestartCount == victim.Status.ContainerStatuses[0].RestartCount {
			return fmt.Errorf("replica %s has not restarted yet", victim.Name)
		}
		back = time.Now()
		return allAvailable()
	}), "waiting for the killed replica to come back")
	time.Sleep(2 * time.Second) // creates after it is back, too
	failures := creates.end()
	var last time.Duration
	for _, f := range failures {
		// Refused once dead; a request in flight at the kill ends in a reset or an EOF.
		atVictim := strings.Contains(f.why, victim.Status.PodIP+":8443") || (strings.HasSuffix(f.why, ": EOF") && f.at.Before(killed.Add(time.Second)))
		if !atVictim {
			t.Errorf("a create failed otherwise than on the killed replica %s (%s): %s", victim.Name, victim.Status.PodIP, f.why)
		}
		if f.at.After(back) {
			t.Errorf("a create sent %s after the replica was back failed: %s", f.at.Sub(back).Round(time.Millisecond), f.why)
		}
		last = max(last, f.at.Sub(killed))
	}
	if last > 10*time.Second {
		t.Errorf("creates failed until %s after the kill; the kubelet should see a dead container within seconds", last.Round(time.Millisecond))
	}
	t.Logf("SIGKILL: %d of %d creates failed, all sent to the killed replica, the last %s after the kill; it was back after %s",
		len(failures), creates.created.Load(), last.Round(time.Millisecond), back.Sub(killed).Round(100*time.Millisecond))
}

// checkpointDevices reads the kubelet's device checkpoint: the device IDs of each pod's container, by
// pod UID, for one resource.
func checkpointDevices(t *T, resourceName string) map[string][]string {
	raw, err := os.ReadFile(deviceCheckpoint)
	t.must(err, "reading the kubelet's device checkpoint")
	var checkpoint struct {
		Data struct {
			PodDeviceEntries []struct {
				PodUID, ContainerName, ResourceName string
				DeviceIDs                           map[string][]string // by NUMA node
			}
		}
	}
	t.must(json.Unmarshal(raw, &checkpoint), "decoding the kubelet's device checkpoint")
	devices := map[string][]string{}
	for _, entry := range checkpoint.Data.PodDeviceEntries {
		if entry.ResourceName != resourceName {
			continue
		}
		for _, ids := range entry.DeviceIDs {
			devices[entry.PodUID] = append(devices[entry.PodUID], ids...)
		}
	}
	return devices
}

// nodeRestart: the whole node as after a reboot. A Deployment's GPU pod, a bare GPU pod and a bare
// GPU-less pod run; the kubelet and the runtime stop, every container and its monitor (containerd's
// shim, CRI-O's conmon) is killed, and what the runtime kept in /run (its state, the pods' network
// namespaces) and the mounts the pods held are gone, as a reboot leaves them; /var stays. Started
// again: the GPU-less pod comes back seeing what it saw. A GPU pod is admitted again before the device
// plugin (itself a pod) can register, which the kubelet refuses by design (its devicemanager's "scenario
// 3: node reboot"): the bare pod ends Failed with no container made, so sees nothing, and the
// Deployment's is replaced by one that runs on a GPU of its own.
// The kubelet's checkpoint gives each running GPU pod the GPU it sees, and no GPU twice.
func nodeRestart(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitUntilPatching(t)
	n.waitForGPUs(t)
	pods := n.cluster.client.CoreV1().Pods(nodeNamespace)
	labels := map[string]string{"app": "reboot-gpu"}
	template := cudaPod("", withRequest(gpuResource, "1"))
	deployment := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "reboot-gpu"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: template.Spec}}}
	_, err := n.cluster.client.AppsV1().Deployments(nodeNamespace).Create(t.ctx, deployment, metav1.CreateOptions{})
	t.must(err, "creating the Deployment reboot-gpu")
	defer func() {
		err := n.cluster.client.AppsV1().Deployments(nodeNamespace).Delete(t.ctx, "reboot-gpu", metav1.DeleteOptions{PropagationPolicy: ptr(metav1.DeletePropagationForeground)})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the Deployment reboot-gpu: %v", err)
		}
	}()
	defer n.deletePods(t, "reboot-gpu-bare", "reboot-none")
	// The Deployment's pod that runs a container started after `since`.
	replica := func(since time.Time) *corev1.Pod {
		var found *corev1.Pod
		t.must(eventually(t.ctx, 3*time.Minute, func() error {
			list, err := pods.List(t.ctx, metav1.ListOptions{LabelSelector: "app=reboot-gpu"})
			if err != nil {
				return err
			}
			for i := range list.Items {
				for _, status := range list.Items[i].Status.ContainerStatuses {
					if status.State.Running != nil && status.State.Running.StartedAt.After(since) {
						found = &list.Items[i]
						return nil
					}
				}
			}
			return fmt.Errorf("no pod of the Deployment reboot-gpu runs a container started since %s", since.Format(time.RFC3339))
		}), "waiting for the Deployment's pod")
		return found
	}
	beforeReplica := replica(time.Time{})
	replicaGPU := ownGPU(t, "the Deployment's pod before the restart", n.look(t, e, beforeReplica))
	bare := n.runPod(t, cudaPod("reboot-gpu-bare", withRequest(gpuResource, "1")))
	bareGPU := ownGPU(t, "the bare GPU pod before the restart", n.look(t, e, bare))
	if bareGPU == replicaGPU {
		t.Fatalf("both GPU pods see %s", bareGPU)
	}
	gpuLess := n.look(t, e, n.runPod(t, cudaPod("reboot-none")))
	expectGPULess(t, "the GPU-less pod before the restart", gpuLess)

	offset := logSize(e, "kubelet")
	stopped := time.Now()
	n.kubelet.stop()
	n.runtimeProcess.stop()
	killed := killContainers(t, n.runtime.monitor(e))
	forgetRuntimeState(t, n)
	t.Logf("kubelet and %s stopped; %d container monitors and processes killed; runtime state and pod mounts gone", n.runtime.title(), killed)
	t.must(e.startRuntime(n), "starting the runtime again")
	t.must(e.startKubelet(n), "starting the kubelet again")
	waitForLog(t, e, "kubelet", offset, gpuRegistration, 2*time.Minute)
	n.waitForGPUs(t)

	var none *corev1.Pod
	t.must(eventually(t.ctx, 3*time.Minute, func() error {
		p, err := pods.Get(t.ctx, "reboot-none", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, status := range p.Status.ContainerStatuses {
			if status.State.Running != nil && status.State.Running.StartedAt.After(stopped) {
				none = p
				return nil
			}
		}
		return fmt.Errorf("pod reboot-none has no container started since the restart")
	}), "waiting for the GPU-less pod to run again")
	if after := n.look(t, e, none); after.String() != gpuLess.String() {
		t.Errorf("the GPU-less pod after the restart: %s; before: %s", after, gpuLess)
	}
	running := map[string]string{} // pod UID: the GPU it sees
	// The bare GPU pod: refused at admission (Failed, no container made since), or running again.
	var bareAfter *corev1.Pod
	t.must(eventually(t.ctx, 3*time.Minute, func() error {
		p, err := pods.Get(t.ctx, "reboot-gpu-bare", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase == corev1.PodFailed && p.Status.Reason == "UnexpectedAdmissionError" {
			bareAfter = p
			return nil
		}
		for _, status := range p.Status.ContainerStatuses {
			if status.State.Running != nil && status.State.Running.StartedAt.After(stopped) {
				bareAfter = p
				return nil
			}
		}
		return fmt.Errorf("pod reboot-gpu-bare is %s (%s): %+v", p.Status.Phase, p.Status.Reason, p.Status.ContainerStatuses)
	}), "waiting for the bare GPU pod to run again or be refused")
	if bareAfter.Status.Phase == corev1.PodFailed {
		t.Logf("the bare GPU pod, admitted again before the plugin registered: %s: %s", bareAfter.Status.Reason, bareAfter.Status.Message)
	} else {
		running[string(bareAfter.UID)] = ownGPU(t, "the bare GPU pod after the restart", n.look(t, e, bareAfter))
	}
	afterReplica := replica(stopped)
	running[string(afterReplica.UID)] = ownGPU(t, "the Deployment's pod after the restart", n.look(t, e, afterReplica))
	t.Logf("the Deployment's pod after the restart: %s (was %s, %s)", afterReplica.Name, beforeReplica.Name, replicaGPU)

	checkpoint := checkpointDevices(t, gpuResource)
	holders := map[string]string{}
	for uid, ids := range checkpoint {
		for _, id := range ids {
			if other, held := holders[id]; held {
				t.Errorf("the kubelet's checkpoint gives %s to pods %s and %s", id, other, uid)
			}
			holders[id] = uid
		}
	}
	for uid, gpu := range running {
		if got := checkpoint[uid]; !slices.Equal(got, []string{gpu}) {
			t.Errorf("the kubelet's checkpoint gives pod %s %v; it sees %s", uid, got, gpu)
		}
	}
	t.Logf("back %s after the stop; the checkpoint agrees with what the running GPU pods see", time.Since(stopped).Round(time.Second))
}

// killContainers kills, with SIGKILL, every process running monitor (containerd's shim, CRI-O's conmon)
// and every process under one (the containers), as a power cut would, and waits until they are gone.
// Returns how many it killed.
func killContainers(t *T, monitor string) int {
	parents := map[int]int{}
	var monitors []int
	entries, err := os.ReadDir("/proc")
	t.must(err, "listing processes")
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", entry.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after its closing parenthesis.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 {
			parents[pid], _ = strconv.Atoi(fields[1])
		}
		if exe, err := os.Readlink(filepath.Join("/proc", entry.Name(), "exe")); err == nil && exe == monitor {
			monitors = append(monitors, pid)
		}
	}
	under := func(pid int) bool {
		for p := pid; p > 1; p = parents[p] {
			if slices.Contains(monitors, p) {
				return true
			}
		}
		return false
	}
	var victims []int
	for pid := range parents {
		if under(pid) {
			victims = append(victims, pid)
		}
	}
	if len(monitors) == 0 {
		t.Fatalf("no process runs %s: the pods' containers were not found to kill", monitor)
	}
	sort.Ints(victims)
	for _, pid := range victims {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	t.must(eventually(t.ctx, time.Minute, func() error {
		for _, pid := range victims {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
				return fmt.Errorf("process %d is still there", pid)
			}
		}
		return nil
	}), "waiting for the containers to die")
	return len(victims)
}

// forgetRuntimeState removes what a reboot takes: every mount the pods held (their root filesystems, /dev/shm,
// network namespaces, and the kubelet's tmpfs volumes), the runtime's state in /run, the network
// namespaces' files, which takes their interfaces with them, what gpuguard keeps in /run (the CDI specs
// its device plugin writes at start, in /run/cdi, where NVIDIA's is in /etc/cdi, and its MPS root), and
// the pods' cgroups. A GPU-less pod the kubelet starts again before the plugin has written the device
// none cannot start until it has.
func forgetRuntimeState(t *T, n *Node) {
	mountsUnder, dirs := n.runtime.volatileState(n)
	t.must(unmountUnder(append(mountsUnder, "/var/lib/kubelet/pods/", "/run/gpuguard/")...), "unmounting the pods' mounts")
	for _, dir := range dirs {
		t.must(os.RemoveAll(dir), "removing "+dir)
	}
	// Their contents: /run/gpuguard is the run's mount, shared with the node (e2e/node.go).
	for _, dir := range []string{"/run/cdi", "/run/gpuguard"} {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("listing %s: %v", dir, err)
		}
		for _, entry := range entries {
			t.must(os.RemoveAll(filepath.Join(dir, entry.Name())), "removing "+filepath.Join(dir, entry.Name()))
		}
	}
	// The pods' cgroups, empty now: left in place, the kubelet's cAdvisor asks the runtime about every one
	// of them at its start and waits seconds on each.
	t.must(removeCgroupTrees(filepath.Join(os.Getenv(cgroupRootEnv), "kubepods")), "removing the pods' cgroups")
}

// leftoverChecked runs a scenario, and then, once its pods are gone, checks that the node holds nothing
// the runtime and the API no longer account for (checkLeftovers).
func leftoverChecked(run func(t *T, e *Env)) func(t *T, e *Env) {
	return func(t *T, e *Env) {
		run(t, e)
		if !t.failed() {
			e.nodeFor(t).checkLeftovers(t, e)
		}
	}
}

// checkLeftovers waits until the node holds nothing that outlived what made it: every container's root
// filesystem mount (containerd's) and every network namespace belongs to a container or sandbox the runtime runs, every veth on the
// bridge to a network namespace, and every pod cgroup to a pod bound to the node.
func (n *Node) checkLeftovers(t *T, e *Env) {
	t.must(eventually(t.ctx, time.Minute, func() error {
		tasks := taskPIDs(t, e)
		namespaces := map[uint64]bool{} // the network namespaces of the running tasks, by inode
		for _, pid := range tasks {
			var info syscall.Stat_t
			if syscall.Stat("/proc/"+pid+"/ns/net", &info) == nil {
				namespaces[info.Ino] = true
			}
		}
		var left []string
		mountinfo, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return err
		}
		// containerd's task directory holds each container's mounts by its ID. CRI-O's are in its store, by
		// layer; they are not checked on CRI-O yet (docs/testing.md).
		const taskDir = "/run/containerd/io.containerd.runtime.v2.task/k8s.io/"
		for _, line := range strings.Split(string(mountinfo), "\n") {
			if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], taskDir) {
				if id, _, _ := strings.Cut(strings.TrimPrefix(fields[4], taskDir), "/"); tasks[id] == "" {
					left = append(left, "mount "+fields[4])
				}
			}
		}
		files, _ := os.ReadDir("/run/netns")
		for _, file := range files {
			var info syscall.Stat_t
			if err := syscall.Stat("/run/netns/"+file.Name(), &info); err == nil && !namespaces[info.Ino] {
				left = append(left, "network namespace "+file.Name())
			}
		}
		out, err := exec.Command("ip", "-o", "link", "show", "master", nodeBridge).Output()
		if err != nil {
			return err
		}
		if veths := strings.Count(string(out), "\n"); veths != len(files) {
			left = append(left, fmt.Sprintf("%d interfaces on %s for %d network namespaces", veths, nodeBridge, len(files)))
		}
		bound, err := n.cluster.client.CoreV1().Pods("").List(t.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName})
		if err != nil {
			return err
		}
		uids := map[string]bool{}
		for _, p := range bound.Items {
			uids[strings.ReplaceAll(string(p.UID), "-", "_")] = true
			uids[string(p.UID)] = true
		}
		kubepods := filepath.Join(cgroupFS, "memory", os.Getenv(cgroupRootEnv), "kubepods")
		filepath.WalkDir(kubepods, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && strings.HasPrefix(d.Name(), "pod") && !uids[strings.TrimPrefix(d.Name(), "pod")] {
				left = append(left, "cgroup "+path)
			}
			return nil
		})
		if len(left) > 0 {
			return fmt.Errorf("left behind: %s", strings.Join(left, "; "))
		}
		return nil
	}), "checking that nothing outlived the scenario")
}

// GPU sharing on the real node (issue 35), observed inside the containers: the device plugin's config
// time-slices GPU 0 alone under its own name, or shares it through MPS, through the chart, and pods holding
// its replicas, a whole GPU and none see what they should.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sharedGpuResource is what the configs below advertise GPU 0's replicas as; the policy's defaults
// already count it a GPU, and the chart lists it as a share whose variables are stripped once its device
// plugin serves it through MPS.
const sharedGpuResource = "nvidia.com/gpu.shared"

// nodeTimeSlicing: GPU 0 shared twice as nvidia.com/gpu.shared (devices: [0], renamed), GPU 1 whole.
// Two pods each holding a replica see GPU 0 alone, by its one UUID; a whole-GPU pod sees GPU 1 alone; a
// GPU-less pod sees none. A replica's pod that sets CUDA_VISIBLE_DEVICES and CUDA_MPS_PIPE_DIRECTORY
// itself keeps them: time-slicing has no limits for them to loosen, and the chart lists only its MPS
// resources as shares whose variables are stripped. The config is then taken away and both GPUs are
// whole again.
func nodeTimeSlicing(t *T, e *Env) {
	n := e.gpuguardFor(t)
	config := `{"version":"v1","sharing":{"timeSlicing":{"resources":[{"name":"nvidia.com/gpu","rename":"` +
		sharedGpuResource + `","devices":[0],"replicas":2}]}}}`
	n.helm(t, e, "upgrade", "--reuse-values", "--set-json", "devicePlugin.config="+config)
	defer func() {
		// The install's own values: --reuse-values cannot take a map away (a null is merged, not applied).
		n.helm(t, e, "upgrade", "--reset-values", "--set", "image.repository="+gpuguardRepo, "--set", "image.tag="+gpuguardTag)
		n.waitForGPUs(t)
	}()
	n.waitForAllocatable(t, map[string]int64{gpuResource: 1, sharedGpuResource: 2})

	pods := []string{"shared-a", "shared-b", "whole", "no-gpu"}
	defer n.deletePods(t, pods...)
	for i, name := range pods[:2] {
		var own []func(*corev1.Container)
		if i == 1 {
			own = append(own, withEnv("CUDA_VISIBLE_DEVICES", "0"), withEnv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/own"))
		}
		pod := n.runPod(t, cudaPod(name, append([]func(*corev1.Container){withRequest(sharedGpuResource, "1")}, own...)...))
		s := n.look(t, e, pod)
		if !slices.Equal(s.gpus(), []string{"nvidia0"}) || s.value != fakeGPUUUID(0) {
			t.Errorf("pod %s holding a replica of GPU 0: %s; want nvidia0 alone and %s", name, s, fakeGPUUUID(0))
		}
		t.Logf("pod %s sees %s", name, s)
		if len(own) > 0 {
			env := e.lookMPS(t, pod, "own-env").env
			if env["CUDA_VISIBLE_DEVICES"] != "0" || env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/own" {
				t.Errorf("pod %s set CUDA_VISIBLE_DEVICES=0 and CUDA_MPS_PIPE_DIRECTORY=/tmp/own on a time-sliced replica; it runs with %v", name, env)
			} else {
				t.Logf("pod %s keeps the CUDA variables it set on a time-sliced replica: %v", name, env)
			}
		}
	}
	whole := n.look(t, e, n.runPod(t, cudaPod("whole", withRequest(gpuResource, "1"))))
	if !slices.Equal(whole.gpus(), []string{"nvidia1"}) || whole.value != fakeGPUUUID(1) {
		t.Errorf("a whole-GPU pod beside the shared GPU: %s; want nvidia1 alone", whole)
	}
	expectNoGPU(t, "a GPU-less pod on the sharing node", n.look(t, e, n.runPod(t, cudaPod("no-gpu"))), "none")
}

// mpsView is what a container shows of MPS: its mounts (mount point -> root, from /proc/self/mountinfo),
// the whole mountinfo, its CUDA and NVIDIA variables, and what its pipe directory and /dev/shm hold.
type mpsView struct {
	mounts    map[string]string
	mountinfo string
	env       map[string]string
	pipe, shm []string
}

func (e *Env) lookMPS(t *T, pod *corev1.Pod, step string) mpsView {
	v := mpsView{mounts: map[string]string{}, env: map[string]string{}}
	mountinfo, err := e.execIn(t, pod, "cat", "/proc/self/mountinfo")
	t.must(err, "reading /proc/self/mountinfo in "+pod.Name)
	v.mountinfo = mountinfo
	for _, line := range strings.Split(mountinfo, "\n") {
		if fields := strings.Fields(line); len(fields) > 4 {
			v.mounts[fields[4]] = fields[3]
		}
	}
	environ, err := e.execIn(t, pod, "cat", "/proc/1/environ")
	t.must(err, "reading PID 1's environment in "+pod.Name)
	for _, entry := range strings.Split(environ, "\x00") {
		if name, value, ok := strings.Cut(entry, "="); ok && (strings.HasPrefix(name, "CUDA_") || strings.HasPrefix(name, "NVIDIA_VISIBLE")) {
			v.env[name] = value
		}
	}
	if listing, err := e.execIn(t, pod, "ls", mpsClientPipe); err == nil {
		v.pipe = names(listing)
	}
	if listing, err := e.execIn(t, pod, "ls", "/dev/shm"); err == nil {
		v.shm = names(listing)
	}
	return v
}

// names are the entries ls printed, without what ctr logs beside them (its cgroup v1 warning).
func names(listing string) []string {
	var entries []string
	for _, line := range strings.Split(listing, "\n") {
		if !strings.Contains(line, "level=") {
			entries = append(entries, strings.Fields(line)...)
		}
	}
	return entries
}

// mpsMounts are the container's mounts of anything under the MPS root, by mount point.
func (v mpsView) mpsMounts() []string {
	var found []string
	for point, root := range v.mounts {
		if strings.HasPrefix(point, "/run/gpuguard") || strings.Contains(root, "/gpuguard/mps") {
			found = append(found, point+" from "+root)
		}
	}
	return found
}

// mpsClientPipe is where the plugin mounts a client's GPU's pipe directory; mpsRoot the chart's default
// root on the host.
const (
	mpsClientPipe = "/run/gpuguard/mps/pipe"
	mpsRoot       = "/run/gpuguard/mps"
)

// expectMPSClient: the pipe directory of GPU 0's daemon (its control file in it) and GPU 0's shm (the
// daemon's mark in it) mounted, nothing of GPU 1, and the plugin's variables for one replica of two.
func expectMPSClient(t *T, what string, v mpsView) {
	gpu0, gpu1 := fakeGPUUUID(0), fakeGPUUUID(1)
	var wrong []string
	if root := v.mounts[mpsClientPipe]; !strings.HasSuffix(root, "/"+gpu0+"/pipe") {
		wrong = append(wrong, fmt.Sprintf("%s mounted from %q, not GPU 0's pipe directory", mpsClientPipe, root))
	}
	if !slices.Contains(v.pipe, "control") {
		wrong = append(wrong, fmt.Sprintf("its pipe directory holds %v, not the daemon's control", v.pipe))
	}
	if !slices.Contains(v.shm, "stand-in-"+gpu0) {
		wrong = append(wrong, fmt.Sprintf("/dev/shm holds %v, not GPU 0's daemon's mark", v.shm))
	}
	if strings.Contains(v.mountinfo, gpu1) {
		wrong = append(wrong, "its mountinfo names GPU 1")
	}
	want := map[string]string{"CUDA_MPS_PIPE_DIRECTORY": mpsClientPipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
		"NVIDIA_VISIBLE_DEVICES": gpu0}
	for name, value := range want {
		if v.env[name] != value {
			wrong = append(wrong, fmt.Sprintf("%s=%q, want %q", name, v.env[name], value))
		}
	}
	if _, set := v.env["CUDA_VISIBLE_DEVICES"]; set {
		wrong = append(wrong, "CUDA_VISIBLE_DEVICES="+v.env["CUDA_VISIBLE_DEVICES"])
	}
	if len(wrong) > 0 {
		t.Errorf("%s: %s", what, strings.Join(wrong, "; "))
		return
	}
	t.Logf("%s: %s from %s (holding %v), /dev/shm %v, %v", what, mpsClientPipe, v.mounts[mpsClientPipe], v.pipe, v.shm, v.env)
}

// nodeMPS: GPU 0 shared through MPS as nvidia.com/gpu.shared (two replicas), GPU 1 whole, through the
// chart: its MPS control DaemonSet starts GPU 0's daemon over the driver's programs as the node's CDI spec
// mounts them (stand-ins here), and the plugin serves the replicas once it is ready. A client sees its
// GPU's pipe and shm alone and its own limit; one that sets CUDA_MPS_PIPE_DIRECTORY and
// CUDA_VISIBLE_DEVICES itself ends up with the plugin's values (the webhook strips its own); a GPU-less
// pod sees no MPS directory. A config change rolls the plugin and the daemons: the resources register
// again and the running client keeps its mounts.
func nodeMPS(t *T, e *Env) {
	n := e.gpuguardFor(t)
	mpsConfig := func(replicas int) string {
		return fmt.Sprintf(`{"version":"v1","sharing":{"mps":{"resources":[{"name":"nvidia.com/gpu","rename":"%s","devices":[0],"replicas":%d}]}}}`,
			sharedGpuResource, replicas)
	}
	// The chart lists the MPS resource in the policy (sharedGpuResources); each webhook replica re-reads it
	// from its kubelet-written volume before the client that sets its own variables is created.
	reloads := n.replicaReloads(t)
	n.helm(t, e, "upgrade", "--reuse-values", "--set-json", "devicePlugin.config="+mpsConfig(2))
	defer func() {
		n.helm(t, e, "upgrade", "--reset-values", "--set", "image.repository="+gpuguardRepo, "--set", "image.tag="+gpuguardTag)
		n.waitForGPUs(t)
	}()
	// Allocatable counts Healthy devices: the replicas are Unhealthy until GPU 0's daemon is ready.
	defer func() {
		if t.failed() {
			t.Logf("the MPS control containers' logs: %s", mpsControlLogs())
		}
	}()
	n.waitForAllocatable(t, map[string]int64{gpuResource: 1, sharedGpuResource: 2})

	daemons, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx,
		metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gpuguard-mps-control"})
	t.must(err, "listing the MPS control pods")
	if len(daemons.Items) != 1 {
		t.Fatalf("%d MPS control pods, want 1", len(daemons.Items))
	}
	expectBothGPUs(t, "the MPS control pod (exempt by namespace, service account and label)", n.look(t, e, &daemons.Items[0]))

	gpu0, gpu1 := fakeGPUUUID(0), fakeGPUUUID(1)
	transcript, err := os.ReadFile(mpsRoot + "/" + gpu0 + "/log/stand-in.log")
	t.must(err, "reading GPU 0's daemon's transcript")
	for _, want := range []string{"-d CUDA_VISIBLE_DEVICES=" + gpu0 + " ", "[" + gpu0 + "] set_default_active_thread_percentage 50"} {
		if !strings.Contains(string(transcript), want) {
			t.Errorf("GPU 0's daemon's transcript lacks %q: %s", want, transcript)
		}
	}
	if _, err := os.Stat(mpsRoot + "/" + gpu1); err == nil {
		t.Errorf("GPU 1, which is not shared, has an MPS directory")
	}
	t.Logf("GPU 0's MPS daemon, as started by the chart's DaemonSet: %s", strings.ReplaceAll(strings.TrimSpace(string(transcript)), "\n", " | "))

	pods := []string{"mps-client", "mps-own-env", "mps-no-gpu"}
	defer n.deletePods(t, pods...)
	client := n.runPod(t, cudaPod("mps-client", withRequest(sharedGpuResource, "1")))
	before := e.lookMPS(t, client, "client")
	expectMPSClient(t, "an MPS client of GPU 0", before)
	n.waitForReloads(t, reloads)
	ownEnv := n.runPod(t, cudaPod("mps-own-env", withRequest(sharedGpuResource, "1"),
		withEnv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/elsewhere"), withEnv("CUDA_VISIBLE_DEVICES", "1")))
	expectMPSClient(t, "an MPS client that set CUDA_MPS_PIPE_DIRECTORY and CUDA_VISIBLE_DEVICES itself", e.lookMPS(t, ownEnv, "own-env"))

	noGPU := e.lookMPS(t, n.runPod(t, cudaPod("mps-no-gpu")), "no-gpu")
	if len(noGPU.mpsMounts()) > 0 || len(noGPU.pipe) > 0 || len(noGPU.env) != 1 || noGPU.env["NVIDIA_VISIBLE_DEVICES"] != "none" {
		t.Errorf("a GPU-less pod on the MPS node: MPS mounts %v, pipe %v, env %v; want no MPS directory and NVIDIA_VISIBLE_DEVICES=none alone",
			noGPU.mpsMounts(), noGPU.pipe, noGPU.env)
	} else {
		t.Logf("a GPU-less pod on the MPS node: no MPS mount, %v", noGPU.env)
	}

	// A config change: the plugin and the daemons roll, the resources register again, the client runs on.
	n.helm(t, e, "upgrade", "--reuse-values", "--set-json", "devicePlugin.config="+mpsConfig(3))
	n.waitForAllocatable(t, map[string]int64{gpuResource: 1, sharedGpuResource: 3})
	// The daemons roll with the plugin: GPU 0's is started again with a third's share.
	var after mpsView
	attempt := 0
	t.must(eventually(t.ctx, time.Minute, func() error {
		transcript, err := os.ReadFile(mpsRoot + "/" + gpu0 + "/log/stand-in.log")
		if err != nil || !strings.Contains(string(transcript), "["+gpu0+"] set_default_active_thread_percentage 33") {
			return fmt.Errorf("GPU 0's daemon not yet started again with three replicas (%v)", err)
		}
		attempt++
		after = e.lookMPS(t, client, fmt.Sprintf("client-after-%d", attempt))
		if !slices.Contains(after.pipe, "control") {
			return fmt.Errorf("the client's pipe directory holds %v, not the new daemon's control", after.pipe)
		}
		return nil
	}), "waiting for GPU 0's daemon to start again with three replicas")
	running, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Get(t.ctx, "mps-client", metav1.GetOptions{})
	t.must(err, "reading the MPS client")
	if running.Status.ContainerStatuses[0].RestartCount != 0 || after.mounts[mpsClientPipe] != before.mounts[mpsClientPipe] ||
		after.mounts["/dev/shm"] != before.mounts["/dev/shm"] {
		t.Errorf("after the config change, the MPS client: restarts %d, mounts %v (were %v)",
			running.Status.ContainerStatuses[0].RestartCount, after.mounts, before.mounts)
	} else {
		t.Logf("replicas 2 -> 3: the plugin registered again, GPU 0's daemon started again, the client kept %s from %s and sees %v",
			mpsClientPipe, after.mounts[mpsClientPipe], after.pipe)
	}
}

// podLogs calls each with every log file, and its text, of the containers named by `container` (a glob) in
// the pods named by `pod` (a glob) in the namespace, as the kubelet keeps them on the node.
func podLogs(namespace, pod, container string, each func(file, text string)) {
	files, _ := filepath.Glob("/var/log/pods/" + namespace + "_" + pod + "_*/" + container + "/*.log")
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			each(file, string(data))
		}
	}
}

// mpsControlLogs is the tail of each MPS control container's log.
func mpsControlLogs() string {
	var out strings.Builder
	podLogs(gpuguardNamespace, "gpuguard-mps-control-*", "mps-control", func(file, text string) {
		lines := strings.Split(strings.TrimSpace(text), "\n")
		fmt.Fprintf(&out, "\n%s:\n%s", file, strings.Join(lines[max(0, len(lines)-8):], "\n"))
	})
	return out.String()
}

// podLogLines are the lines of a pod's container logs that hold any of `holding`.
func podLogLines(namespace, pod string, holding ...string) []string {
	var lines []string
	podLogs(namespace, pod, "*", func(_, text string) {
		for _, line := range strings.Split(text, "\n") {
			for _, want := range holding {
				if strings.Contains(line, want) {
					lines = append(lines, line)
					break
				}
			}
		}
	})
	return lines
}

// waitForAllocatable waits until the Node offers exactly these quantities.
func (n *Node) waitForAllocatable(t *T, want map[string]int64) {
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		node, err := n.cluster.client.CoreV1().Nodes().Get(t.ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for name, quantity := range want {
			q := node.Status.Allocatable[corev1.ResourceName(name)]
			if q.Value() != quantity {
				return fmt.Errorf("allocatable %s is %s, want %d", name, q.String(), quantity)
			}
		}
		return nil
	}), fmt.Sprintf("waiting for the node to offer %v", want))
}

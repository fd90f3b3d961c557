// NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu at 22407113) on the real node beside gpuguard: its
// kubelet plugin, built from ../shared/peers by scripts/build-peers (-peers), installed with helm install
// from its own chart (deployments/helm/dra-driver-nvidia-gpu in the unpacked peer), in its README's
// namespace under a release name of the harness's, as a pod beside gpuguard's webhook and enforcer, over the
// node's two fake GPUs through the stand-in libnvidia-ml.so.1 in a driver root of the node's. The image
// is built here as NVIDIA's Dockerfile builds it, but for the init container's prestart script, which the
// peer's tarball lacks (e2e/peers/dra-prestart says what stands in for it).
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	draDriver = "gpu.nvidia.com"
	// The driver version the stand-in NVML reports, as the node's procfs does: the driver root's
	// libnvidia-ml.so.<version> is how the driver's CDI specs find the driver's libraries.
	draDriverVersion = "580.95.05"
	// The image the chart runs (its Chart.yaml's appVersion, v-prefixed as its default tag is), built here.
	draDriverImage = "e2e.gpuguard.io/dra-driver-nvidia-gpu:v0.5.0-dev"
	// The namespace its README installs it in, and a release name other than the README's.
	draNamespace = "nvidia-dra-driver-gpu"
	draRelease   = "gpu-dra"
	// What the chart names its kubelet plugin's DaemonSet (its name, not the release's), and labels its pods.
	draDaemonSet      = "dra-driver-nvidia-gpu-kubelet-plugin"
	draPluginSelector = "nvidia-dra-driver-gpu-component=kubelet-plugin"
	// Where the stand-in NVML finds the node's GPUs, under the driver root.
	draFakeNVML = "gpuguard-e2e/fake-nvml.json"
)

// draDriverRootfs lays out the DRA driver's image as its Dockerfile's last stage has it: the kubelet
// plugin and nvidia-cdi-hook in /usr/bin, bash at /bin/bash (NVIDIA's is Debian's bash-static; here
// Debian's bash and the libraries it loads), the prestart script, root's passwd and group; with the
// libraries the plugin and the stand-in NVML load (NVIDIA's base image is distroless/cc, glibc). Its
// busybox is left out: nothing the chart runs with these values calls it.
func (e *Env) draDriverRootfs(dir string) error {
	for _, sub := range []string{"usr/bin", "bin", "etc", "root", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	plugin := filepath.Join(e.cfg.Peers, "gpu-kubelet-plugin")
	hook := e.component("nvidia-cdi-hook")
	for _, f := range []struct{ from, to string }{
		{plugin, "usr/bin/gpu-kubelet-plugin"},
		{hook, "usr/bin/nvidia-cdi-hook"},
		{"/bin/bash", "bin/bash"},
		{e.source("e2e", "peers", "dra-prestart", "kubelet-plugin-prestart.sh"), "usr/bin/kubelet-plugin-prestart.sh"},
	} {
		if err := copyFile(f.from, filepath.Join(dir, f.to), 0o755); err != nil {
			return err
		}
	}
	for name, line := range map[string]string{"passwd": "root:x:0:0:root:/root:/bin/bash\n", "group": "root:x:0:\n"} {
		if err := os.WriteFile(filepath.Join(dir, "etc", name), []byte(line), 0o644); err != nil {
			return err
		}
	}
	return copyLibraries(dir, plugin, hook, "/bin/bash", e.gpuguard(filepath.Join("tests", "fake-nvml", "libnvidia-ml.so.1")))
}

// draDriverImageConfig is what NVIDIA's Dockerfile sets (and distroless's PATH, less /busybox); the chart
// gives each command.
var draDriverImageConfig = imageConfig{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"NVIDIA_DISABLE_REQUIRE=true", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"}}

// startNvidiaDRADriver lays out a driver root (the stand-in NVML under its versioned name, the stand-in's
// GPUs) and installs NVIDIA's chart over it. nvidia-smi is left out at first, as on a node whose driver is
// not installed yet: the chart's init container fails, and the kubelet plugin's pod is on the node with
// nothing published, while whilePrestartFails runs. Then nvidia-smi is placed and the pod started again (by
// deleting it, as the DaemonSet makes another at once, where the kubelet's back-off could take minutes);
// it waits until the new pod is ready and returns it and the stop.
func (e *Env) startNvidiaDRADriver(t *T, n *Node, whilePrestartFails func()) (*corev1.Pod, func()) {
	root := filepath.Join(n.dir, "dra", "driver-root")
	libraries := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	for _, dir := range []string{libraries, filepath.Join(root, "usr/bin"), filepath.Join(root, filepath.Dir(draFakeNVML))} {
		t.must(os.MkdirAll(dir, 0o755), "making the driver root")
	}
	versioned := "libnvidia-ml.so." + draDriverVersion
	t.must(copyFile(e.gpuguard(filepath.Join("tests", "fake-nvml", "libnvidia-ml.so.1")), filepath.Join(libraries, versioned), 0o755),
		"placing the stand-in NVML")
	if err := os.Symlink(versioned, filepath.Join(libraries, "libnvidia-ml.so.1")); err != nil && !os.IsExist(err) {
		t.must(err, "linking libnvidia-ml.so.1")
	}
	nvidiaSMI := filepath.Join(root, "usr/bin/nvidia-smi")
	if err := os.Remove(nvidiaSMI); err != nil && !os.IsNotExist(err) {
		t.must(err, "removing an earlier run's nvidia-smi")
	}
	var gpus []string
	for minor := 0; minor < nodeGPUs; minor++ {
		gpus = append(gpus, fmt.Sprintf(`{"uuid": %q, "minor": %d}`, fakeGPUUUID(minor), minor))
	}
	t.must(os.WriteFile(filepath.Join(root, draFakeNVML), []byte(`{"gpus": [`+strings.Join(gpus, ", ")+"]}\n"), 0o644),
		"writing the stand-in's GPUs")

	// Its defaults (GPUs on, its node affinity for nvidia.com/gpu.present, its tolerations, privileged,
	// the gRPC health probes) but for: the image, built here and never pulled; compute domains off (they
	// need the controller and IMEX, which this node has none of); gpuResourcesEnabledOverride, without which
	// the chart refuses GPUs where a device plugin may run (gpuguard's withholds them, below); the driver
	// root; the host's nvidia-cdi-hook for the CDI specs (the image's copy is the plugin's, not the host's);
	// and where the stand-in NVML finds the GPUs.
	image := strings.SplitN(draDriverImage, ":", 2)
	helm := func(command string, args ...string) error {
		args = append([]string{command, draRelease}, append(args, "--namespace", draNamespace,
			"--kubeconfig", e.path("node-control-plane", "admin.kubeconfig"))...)
		out, err := exec.CommandContext(t.ctx, e.component("helm"), args...).CombinedOutput()
		os.WriteFile(e.path("logs", "helm-"+draRelease+"-"+command+".log"), out, 0o644)
		if err != nil {
			return fmt.Errorf("helm %s %s (NVIDIA's DRA chart): %v: %s", command, draRelease, err, out)
		}
		return nil
	}
	stop := func() {
		if err := helm("uninstall", "--wait", "--timeout", "2m"); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("%v", err)
		}
		n.waitNamespaceGone(t, draNamespace)
		if err := n.cluster.client.ResourceV1().ResourceSlices().DeleteCollection(t.ctx, metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver}); err != nil {
			t.Errorf("deleting the driver's ResourceSlices: %v", err)
		}
		for _, path := range []string{"/var/lib/kubelet/plugins/" + draDriver, "/var/lib/kubelet/plugins_registry/" + draDriver + "-reg.sock"} {
			if err := os.RemoveAll(path); err != nil {
				t.Errorf("removing %s: %v", path, err)
			}
		}
	}
	fail := func(format string, args ...any) {
		stop()
		t.Fatalf(format, args...)
	}
	err := helm("install", filepath.Join(e.cfg.Peers, "src", "k8s-dra-driver-gpu", "deployments", "helm", "dra-driver-nvidia-gpu"),
		"--create-namespace", "--set", "image.repository="+image[0], "--set", "image.tag="+image[1], "--set", "image.pullPolicy=Never",
		"--set", "resources.computeDomains.enabled=false", "--set", "gpuResourcesEnabledOverride=true",
		"--set", "nvidiaDriverRoot="+root, "--set", "nvidiaCDIHookPath="+e.component("nvidia-cdi-hook"),
		"--set-json", `kubeletPlugin.containers.gpus.env=[{"name":"GPUGUARD_FAKE_NVML","value":"/driver-root/`+draFakeNVML+`"}]`)
	if err != nil {
		fail("installing NVIDIA's DRA driver chart: %v", err)
	}
	pluginPods := func() ([]corev1.Pod, error) {
		pods, err := n.cluster.client.CoreV1().Pods(draNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: draPluginSelector})
		if err != nil {
			return nil, err
		}
		return pods.Items, nil
	}

	var failing corev1.Pod
	if err := eventually(t.ctx, 2*time.Minute, func() error {
		pods, err := pluginPods()
		if err != nil {
			return err
		}
		for _, pod := range pods {
			for _, status := range pod.Status.InitContainerStatuses {
				if ended := status.LastTerminationState.Terminated; ended != nil && ended.ExitCode != 0 {
					failing = pod
					return nil
				}
			}
		}
		return fmt.Errorf("no init container of the DRA kubelet plugin has failed yet (%d pods)", len(pods))
	}); err != nil {
		fail("waiting for the DRA kubelet plugin's prestart check to fail without nvidia-smi: %v", err)
	}
	// The kubelet keeps only the newest ended instance of a container, and the one that failed may have
	// been replaced by another failing the same way: the ended one's log, else the one running now.
	var logs []byte
	if err := eventually(t.ctx, 30*time.Second, func() error {
		var last error
		for _, previous := range []bool{true, false} {
			out, err := n.cluster.client.CoreV1().Pods(draNamespace).GetLogs(failing.Name,
				&corev1.PodLogOptions{Container: failing.Spec.InitContainers[0].Name, Previous: previous}).DoRaw(t.ctx)
			if err == nil && strings.Contains(string(out), "lacks nvidia-smi") {
				logs = out
				return nil
			}
			last = fmt.Errorf("%q (%v)", out, err)
		}
		return last
	}); err != nil {
		fail("the prestart check's log: %v; want it to say the driver root lacks nvidia-smi", err)
	}
	t.Logf("the DRA kubelet plugin's pod %s waits for the driver: %s", failing.Name, strings.TrimSpace(string(logs)))
	whilePrestartFails()

	t.must(copyFile(e.component("mps-stand-in"), nvidiaSMI, 0o755), "placing nvidia-smi")
	if err := n.cluster.client.CoreV1().Pods(draNamespace).Delete(t.ctx, failing.Name, metav1.DeleteOptions{}); err != nil &&
		!apierrors.IsNotFound(err) {
		fail("deleting the DRA kubelet plugin's pod %s: %v", failing.Name, err)
	}
	var ready *corev1.Pod
	if err := eventually(t.ctx, 2*time.Minute, func() error {
		pods, err := pluginPods()
		if err != nil {
			return err
		}
		ready = nil
		for i, pod := range pods {
			if pod.Name == failing.Name || pod.DeletionTimestamp != nil {
				continue
			}
			for _, status := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
				if w := status.State.Waiting; w != nil && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
					return fmt.Errorf("the DRA kubelet plugin's container %s waits: %s: %s", status.Name, w.Reason, w.Message)
				}
			}
			for _, condition := range pod.Status.Conditions {
				if condition.Type == corev1.PodReady && condition.Status == corev1.ConditionTrue {
					ready = &pods[i]
				}
			}
		}
		if ready == nil {
			return fmt.Errorf("no new pod of the DRA kubelet plugin is ready (%d pods)", len(pods))
		}
		return nil
	}); err != nil {
		fail("waiting for NVIDIA's DRA kubelet plugin: %v", err)
	}
	return ready, stop
}

// nodeNvidiaDRADriver: NVIDIA's DRA driver, installed from its own chart in its README's namespace, runs
// its kubelet plugin as a pod beside gpuguard's webhook and enforcer, under gpuguard's defaults, which
// build that namespace and the pod's label in. Before the driver is installed on the node (its prestart
// check failing), the pod alone makes gpuguard's device plugin, started afresh, withhold both GPUs with no
// slice published: which starts first does not decide. Then the plugin's container keeps the chart's
// NVIDIA_VISIBLE_DEVICES=void, looked at from inside, and publishes the node's two GPUs as a
// ResourceSlice; a pod whose container claims one (a ResourceClaim of the chart's DeviceClass
// gpu.nvidia.com) runs, and sees that GPU alone, looked at from inside: its device node, and
// NVIDIA_VISIBLE_DEVICES=void from the claim's CDI spec. The enforcer reads the claim's CDI devices from
// pod-resources and the device nodes from the driver's spec, so a pod of the same claim that also mounts
// the other GPU is refused, naming it. A GPU-less pod sees none. gpuguard's device plugin keeps withholding
// the GPUs the slice publishes: the node offers no nvidia.com/gpu.
func nodeNvidiaDRADriver(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	c := n.cluster
	// After the driver and its slices are gone (deferred below, so run before this): gpuguard's plugin,
	// which withheld the GPUs the driver published, started again to serve them for the scenarios after.
	defer n.gpuguardServesGPUsAgain(t)
	privilegedBefore := n.enforcerDecisions(t, "privileged")
	plugin, stop := e.startNvidiaDRADriver(t, n, func() {
		if err := os.RemoveAll(servedElsewhereRecordDir); err != nil {
			t.Errorf("removing %s: %v", servedElsewhereRecordDir, err)
		}
		n.restartGpuguardPlugin(t)
		n.waitForMetric(t, `gpus="served"} 1`)
		n.waitForMetric(t, "gpuguard_device_plugin_gpus_served_elsewhere "+strconv.Itoa(nodeGPUs))
		n.expectNoGPUsFor(t, 12*time.Second, "the DRA kubelet plugin's pod on the node, nothing published, gpuguard's plugin started afresh",
			"gpuguard's plugin served the GPUs")
		published, err := c.client.ResourceV1().ResourceSlices().List(t.ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver})
		t.must(err, "listing the driver's ResourceSlices")
		if len(published.Items) != 0 {
			t.Fatalf("the DRA driver published %d ResourceSlices before its prestart check passed", len(published.Items))
		}
		t.Logf("the DRA kubelet plugin's pod waiting for the driver, nothing published: gpuguard's plugin, started with no record, withholds both GPUs")
	})
	defer stop()
	// Exempt by the built-in entry (its namespace and its chart's component label): its privileged
	// containers were never decided as privileged ones, and the chart's void, which its comment says keeps
	// the runtime from giving the plugin every GPU, is what it runs with.
	if after := n.enforcerDecisions(t, "privileged"); after != privilegedBefore {
		t.Errorf("the enforcer decided %v containers as privileged while NVIDIA's DRA kubelet plugin started; want none, it is exempt",
			after-privilegedBefore)
	}
	if own := n.look(t, e, plugin); own.value != "void" {
		t.Errorf("NVIDIA's DRA kubelet plugin (%s/%s, container %s): %s; want the chart's void", plugin.Namespace, plugin.Name,
			plugin.Spec.Containers[0].Name, own)
	} else {
		t.Logf("NVIDIA's DRA kubelet plugin %s/%s runs from its chart, release %s, exempt under gpuguard's defaults: %s",
			plugin.Namespace, plugin.Name, draRelease, own)
	}
	_, err := c.client.ResourceV1().DeviceClasses().Get(t.ctx, draDriver, metav1.GetOptions{})
	t.must(err, "reading the chart's DeviceClass gpu.nvidia.com")
	var published []string
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		slices, err := c.client.ResourceV1().ResourceSlices().List(t.ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver})
		if err != nil {
			return err
		}
		published = nil
		for _, slice := range slices.Items {
			for _, device := range slice.Spec.Devices {
				published = append(published, device.Name+"="+*device.Attributes["uuid"].StringValue)
			}
		}
		if len(published) != nodeGPUs {
			return fmt.Errorf("the driver publishes %v", published)
		}
		return nil
	}), "waiting for NVIDIA's DRA driver to publish the GPUs")
	t.Logf("NVIDIA's DRA driver publishes %v", published)
	// gpuguard's device plugin, which served both GPUs, withholds the GPUs the node's slice publishes.
	t.must(eventually(t.ctx, time.Minute, func() error { return n.offers(t, 0) }),
		"gpuguard's plugin withholding the GPUs NVIDIA's DRA driver publishes")
	n.waitForMetric(t, "gpuguard_device_plugin_gpus_served_elsewhere "+strconv.Itoa(nodeGPUs))
	t.Logf("gpuguard's device plugin withholds both GPUs from %s while the DRA driver publishes them", gpuResource)

	const claimName = "dra-gpu"
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: claimName}, Spec: resourcev1.ResourceClaimSpec{
		Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: draDriver}}}}}}
	_, err = c.client.ResourceV1().ResourceClaims(nodeNamespace).Create(t.ctx, claim, metav1.CreateOptions{})
	t.must(err, "creating the ResourceClaim")
	defer func() {
		if err := c.client.ResourceV1().ResourceClaims(nodeNamespace).Delete(t.ctx, claimName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the ResourceClaim: %v", err)
		}
	}()
	claiming := func(name string, options ...func(*corev1.Container)) *corev1.Pod {
		pod := cudaPod(name, append(options, withClaim("gpu"))...)
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr(claimName)}}
		return pod
	}
	c.waitUntilClaimKnown(t, nodeNamespace, claiming("dra-probe"), "the ResourceClaim")

	// Torn down before the driver stops, which the kubelet needs to unprepare the claim.
	defer n.deletePodsTornDown(t, "dra-claimed", "dra-beyond", "dra-none", "dra-extended")
	seen := n.look(t, e, n.runPod(t, claiming("dra-claimed")))
	stored, err := c.client.ResourceV1().ResourceClaims(nodeNamespace).Get(t.ctx, claimName, metav1.GetOptions{})
	t.must(err, "reading the allocated claim")
	if stored.Status.Allocation == nil || len(stored.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("the claim's allocation: %+v", stored.Status.Allocation)
	}
	device := stored.Status.Allocation.Devices.Results[0].Device // gpu-<minor>
	minor := strings.TrimPrefix(device, "gpu-")
	if !slices.Equal(seen.gpus(), []string{"nvidia" + minor}) || seen.value != "void" {
		t.Errorf("a pod claiming %s through NVIDIA's DRA driver: %s; want nvidia%s alone and void", device, seen, minor)
	}
	t.Logf("a pod claiming a GPU through NVIDIA's DRA driver, allocated %s: %s", device, seen)

	other := "1"
	if minor == "1" {
		other = "0"
	}
	beyond := claiming("dra-beyond", func(c *corev1.Container) {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "other", MountPath: "/dev/nvidia" + other}}
	})
	beyond.Spec.Volumes = []corev1.Volume{{Name: "other", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: "/dev/nvidia" + other, Type: ptr(corev1.HostPathCharDev)}}}}
	why := n.failedCreate(t, beyond)
	if !strings.Contains(why, "gpuguard: container") || !strings.Contains(why, "/dev/nvidia"+other) {
		t.Errorf("a pod of the same claim also mounting /dev/nvidia%s: %q; want gpuguard's refusal naming it", other, why)
	}
	t.Logf("the same claim, and /dev/nvidia%s mounted: %s", other, why)
	expectGPULess(t, "a GPU-less pod beside NVIDIA's DRA driver", n.look(t, e, n.runPod(t, cudaPod("dra-none"))))

	// The chart's DeviceClass names nvidia.com/gpu as its extendedResourceName, and the node cluster (1.37)
	// has DRAExtendedResource on: with gpuguard's plugin withholding the GPUs, a pod asking for one
	// nvidia.com/gpu is given it through the DRA driver, the other GPU, and sees it alone.
	extended := n.look(t, e, n.runPod(t, cudaPod("dra-extended", withRequest(gpuResource, "1"))))
	want := "nvidia1"
	if minor == "1" {
		want = "nvidia0"
	}
	if !slices.Equal(extended.gpus(), []string{want}) {
		t.Errorf("a pod asking for one %s beside the claim of gpu-%s, served through the DRA driver: %s; want %s alone", gpuResource,
			minor, extended, want)
	}
	t.Logf("a pod asking for one %s, served through the DRA driver's DeviceClass: %s", gpuResource, extended)
}

// enforcerDecisions is the node enforcer's count of containers decided for the reason why, whatever was done.
func (n *Node) enforcerDecisions(t *T, why string) float64 {
	page, err := n.enforcerMetrics(t)
	t.must(err, "reading the node enforcer's metrics")
	total := 0.0
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "gpuguard_node_enforcer_decisions_total{") && strings.Contains(line, `why="`+why+`"`) {
			fields := strings.Fields(line)
			value, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			t.must(err, "reading "+line)
			total += value
		}
	}
	return total
}

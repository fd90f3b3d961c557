// NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu at 22407113) on the real node beside gpuguard: its
// kubelet plugin, built from ../shared/peers by scripts/build-peers (-peers), installed with helm install
// from its own chart (deployments/helm/dra-driver-nvidia-gpu in the unpacked peer), in its install guide's
// namespace under a release name of the harness's, as a pod beside gpuguard's webhook and enforcer, over the
// node's two fake GPUs through the stand-in libnvidia-ml.so.1 in a driver root of the node's. The image
// is built here as NVIDIA's Dockerfile builds it, but for the init container's prestart script, which the
// peer's tarball lacks (e2e/peers/dra-prestart says what stands in for it).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	draDriver = "gpu.nvidia.com"
	// The driver version the stand-in NVML reports, as the node's procfs does: the driver root's
	// libnvidia-ml.so.<version> is how the driver's CDI specs find the driver's libraries.
	draDriverVersion = "580.95.05"
	// The image the chart runs (its Chart.yaml's appVersion, v-prefixed as its default tag is), built here.
	draDriverImage = "e2e.gpuguard.io/dra-driver-nvidia-gpu:v0.5.0-dev"
	// The namespace its install guide (docs/install.md at that commit) installs it in, and a release name
	// other than the guide's.
	draNamespace = "dra-driver-nvidia-gpu"
	draRelease   = "gpu-dra"
	// The label the chart's template gives its kubelet plugin's pods, whatever the release and nameOverride.
	draPluginSelector = "nvidia-dra-driver-gpu-component=kubelet-plugin"
	// Where the stand-in NVML finds the node's GPUs, under the driver root.
	draFakeNVML = "gpuguard-e2e/fake-nvml.json"
)

// draDriverRootfs lays out the DRA driver's image as its Dockerfile's last stage has it, for what the chart
// runs with the harness's values: the kubelet plugin and nvidia-cdi-hook in /usr/bin, bash at /bin/bash
// (NVIDIA's is Debian's bash-static; here Debian's bash and the libraries it loads), busybox at /busybox
// with the applets the prestart script calls (its base image, distroless/cc:debug, has busybox there), the
// prestart script, root's passwd and group; with the libraries the plugin and the stand-in NVML load
// (distroless/cc's glibc). Left out: the compute-domain programs, its webhook and /templates (the MPS
// daemon's), which compute domains off and no MPS sharing never run.
func (e *Env) draDriverRootfs(dir string) error {
	for _, sub := range []string{"usr/bin", "bin", "busybox", "etc", "root", "proc", "dev", "sys", "tmp"} {
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
		{"/bin/busybox", "busybox/busybox"},
		{e.source("e2e", "peers", "dra-prestart", "kubelet-plugin-prestart.sh"), "usr/bin/kubelet-plugin-prestart.sh"},
	} {
		if err := copyFile(f.from, filepath.Join(dir, f.to), 0o755); err != nil {
			return err
		}
	}
	for _, applet := range []string{"sleep", "env", "ls", "cat"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "busybox", applet)); err != nil {
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

// draDriverImageConfig is what NVIDIA's Dockerfile sets, and distroless's PATH with /busybox; the chart
// gives each command.
var draDriverImageConfig = imageConfig{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox",
	"NVIDIA_DISABLE_REQUIRE=true", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"}}

// draInstall is NVIDIA's DRA driver installed from its chart on the node: the driver root it runs over.
type draInstall struct {
	e    *Env
	n    *Node
	root string
}

// installNvidiaDRADriver lays out a driver root (the stand-in NVML under its versioned name, the stand-in's
// GPUs) and installs NVIDIA's chart over it. nvidia-smi is left out, as on a node whose driver is not
// installed yet: the chart's init container waits (prestartWaiting), and the kubelet plugin's pod is on the
// node with nothing published until completeDriverRoot. The caller defers uninstall at once.
func (e *Env) installNvidiaDRADriver(t *T, n *Node) *draInstall {
	d := &draInstall{e: e, n: n, root: filepath.Join(n.dir, "dra", "driver-root")}
	libraries := filepath.Join(d.root, "usr/lib/x86_64-linux-gnu")
	for _, dir := range []string{libraries, filepath.Join(d.root, "usr/bin"), filepath.Join(d.root, filepath.Dir(draFakeNVML))} {
		t.must(os.MkdirAll(dir, 0o755), "making the driver root")
	}
	versioned := "libnvidia-ml.so." + draDriverVersion
	t.must(copyFile(e.gpuguard(filepath.Join("tests", "fake-nvml", "libnvidia-ml.so.1")), filepath.Join(libraries, versioned), 0o755),
		"placing the stand-in NVML")
	if err := os.Symlink(versioned, filepath.Join(libraries, "libnvidia-ml.so.1")); err != nil && !os.IsExist(err) {
		t.must(err, "linking libnvidia-ml.so.1")
	}
	if err := os.Remove(d.nvidiaSMI()); err != nil && !os.IsNotExist(err) {
		t.must(err, "removing an earlier run's nvidia-smi")
	}
	var gpus []string
	for minor := 0; minor < nodeGPUs; minor++ {
		gpus = append(gpus, fmt.Sprintf(`{"uuid": %q, "minor": %d}`, fakeGPUUUID(minor), minor))
	}
	t.must(os.WriteFile(filepath.Join(d.root, draFakeNVML), []byte(`{"gpus": [`+strings.Join(gpus, ", ")+"]}\n"), 0o644),
		"writing the stand-in's GPUs")

	// Its defaults (GPUs on, its node affinity for nvidia.com/gpu.present, its tolerations, privileged,
	// the gRPC health probes) but for: the image, built here and never pulled; compute domains off (they
	// need the controller and IMEX, which this node has none of), and so its compute domains' CRDs skipped
	// (helm uninstall would leave them); gpuResourcesEnabledOverride, without which the chart refuses GPUs
	// where a device plugin may run (gpuguard's withholds them, below); the driver root; the host's
	// nvidia-cdi-hook for the CDI specs (the image's copy is the plugin's, not the host's); and where the
	// stand-in NVML finds the GPUs.
	image := strings.SplitN(draDriverImage, ":", 2)
	err := d.helm(t, "install", filepath.Join(e.cfg.Peers, "src", "k8s-dra-driver-gpu", "deployments", "helm", "dra-driver-nvidia-gpu"),
		"--create-namespace", "--skip-crds", "--set", "image.repository="+image[0], "--set", "image.tag="+image[1],
		"--set", "image.pullPolicy=Never", "--set", "resources.computeDomains.enabled=false", "--set", "gpuResourcesEnabledOverride=true",
		"--set", "nvidiaDriverRoot="+d.root, "--set", "nvidiaCDIHookPath="+e.component("nvidia-cdi-hook"),
		"--set-json", `kubeletPlugin.containers.gpus.env=[{"name":"GPUGUARD_FAKE_NVML","value":"/driver-root/`+draFakeNVML+`"}]`)
	if err != nil {
		t.Errorf("installing NVIDIA's DRA driver chart: %v", err)
		d.uninstall(t)
		t.Fatalf("NVIDIA's DRA driver is not installed")
	}
	return d
}

func (d *draInstall) nvidiaSMI() string { return filepath.Join(d.root, "usr/bin/nvidia-smi") }

// helm runs helm for the release (helmPeer).
func (d *draInstall) helm(t *T, command string, args ...string) error {
	return d.e.helmPeer(t, "NVIDIA's DRA chart", command, draRelease, draNamespace, args...)
}

// uninstall takes away the release, its namespace, the slices it published and the kubelet's sockets of it.
func (d *draInstall) uninstall(t *T) {
	if err := d.helm(t, "uninstall", "--wait", "--timeout", "2m"); err != nil && !strings.Contains(err.Error(), "not found") {
		t.Errorf("%v", err)
	}
	// The slices and sockets first: the namespace's wait ends the test where it fails.
	if err := d.n.cluster.client.ResourceV1().ResourceSlices().DeleteCollection(t.ctx, metav1.DeleteOptions{},
		metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver}); err != nil {
		t.Errorf("deleting the driver's ResourceSlices: %v", err)
	}
	for _, path := range []string{"/var/lib/kubelet/plugins/" + draDriver, "/var/lib/kubelet/plugins_registry/" + draDriver + "-reg.sock"} {
		if err := os.RemoveAll(path); err != nil {
			t.Errorf("removing %s: %v", path, err)
		}
	}
	d.n.waitNamespaceGone(t, draNamespace)
}

func (d *draInstall) pods(t *T) ([]corev1.Pod, error) {
	pods, err := d.n.cluster.client.CoreV1().Pods(draNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: draPluginSelector})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}

// prestartWaiting waits until the kubelet plugin's init container runs and its log says the driver root
// lacks nvidia-smi; it returns the pod, held in its init container.
func (d *draInstall) prestartWaiting(t *T) corev1.Pod {
	var waiting corev1.Pod
	var logs []byte
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		pods, err := d.pods(t)
		if err != nil {
			return err
		}
		for _, pod := range pods {
			for _, status := range pod.Status.InitContainerStatuses {
				if status.State.Running == nil {
					continue
				}
				out, err := d.n.cluster.client.CoreV1().Pods(draNamespace).GetLogs(pod.Name,
					&corev1.PodLogOptions{Container: status.Name}).DoRaw(t.ctx)
				if err != nil {
					return err
				}
				if !strings.Contains(string(out), "lacks nvidia-smi:") {
					return fmt.Errorf("the prestart check of %s says %q", pod.Name, out)
				}
				waiting, logs = pod, out
				return nil
			}
		}
		return fmt.Errorf("no init container of the DRA kubelet plugin runs (%d pods)", len(pods))
	}), "waiting for the DRA kubelet plugin's prestart check to wait for nvidia-smi")
	first, _, _ := strings.Cut(strings.TrimSpace(string(logs)), "\n")
	t.Logf("the DRA kubelet plugin's pod %s waits for the driver: %s", waiting.Name, first)
	return waiting
}

// completeDriverRoot places nvidia-smi, which the prestart check finds within 10 s; it waits until the
// pod is ready and returns it.
func (d *draInstall) completeDriverRoot(t *T, waiting corev1.Pod) *corev1.Pod {
	t.must(copyFile(d.e.component("mps-stand-in"), d.nvidiaSMI(), 0o755), "placing nvidia-smi")
	var ready *corev1.Pod
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		pod, err := d.n.cluster.client.CoreV1().Pods(draNamespace).Get(t.ctx, waiting.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, status := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
			if w := status.State.Waiting; w != nil && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
				return fmt.Errorf("the DRA kubelet plugin's container %s waits: %s: %s", status.Name, w.Reason, w.Message)
			}
			if ended := status.State.Terminated; ended != nil && ended.ExitCode != 0 {
				return fmt.Errorf("the DRA kubelet plugin's container %s ended: %d: %s", status.Name, ended.ExitCode, ended.Message)
			}
		}
		for _, condition := range pod.Status.Conditions {
			if condition.Type == corev1.PodReady && condition.Status == corev1.ConditionTrue {
				ready = pod
				return nil
			}
		}
		// Still in its prestart check: what the check says last.
		for _, status := range pod.Status.InitContainerStatuses {
			if status.State.Running != nil {
				out, _ := d.n.cluster.client.CoreV1().Pods(draNamespace).GetLogs(pod.Name,
					&corev1.PodLogOptions{Container: status.Name, TailLines: ptr(int64(1))}).DoRaw(t.ctx)
				return fmt.Errorf("the DRA kubelet plugin's pod %s is in its prestart check: %s", pod.Name, strings.TrimSpace(string(out)))
			}
		}
		return fmt.Errorf("the DRA kubelet plugin's pod %s is not ready", pod.Name)
	}), "waiting for NVIDIA's DRA kubelet plugin")
	return ready
}

// nodeNvidiaDRADriver: NVIDIA's DRA driver, installed from its own chart in its install guide's namespace, runs
// its kubelet plugin as a pod beside gpuguard's webhook and enforcer, under gpuguard's defaults, which
// build that namespace and the pod's label in. Before the driver is installed on the node (its prestart
// check waiting), the pod alone makes gpuguard's device plugin, started afresh, withhold both GPUs with no
// slice published: which starts first does not decide. Then the plugin's container keeps the chart's
// NVIDIA_VISIBLE_DEVICES=void, looked at from inside, and publishes the node's two GPUs as a
// ResourceSlice; a pod whose container claims one (a ResourceClaim of the chart's DeviceClass
// gpu.nvidia.com) runs, and sees that GPU alone, looked at from inside: its device node, and
// NVIDIA_VISIBLE_DEVICES=void from the claim's CDI spec. The enforcer reads the claim's CDI devices from
// pod-resources and the device nodes from the driver's spec, so a pod of the same claim that also mounts
// the other GPU is refused, naming it. A GPU-less pod sees none. gpuguard's device plugin keeps withholding
// the GPUs the slice publishes: the node offers no nvidia.com/gpu, and a pod asking for one is given the
// other GPU through the DRA driver (the DeviceClass's extendedResourceName), and sees it alone; such a pod
// that also mounts the GPU the claim holds is refused, naming it: the enforcer reads the claim the
// scheduler made for it from pod-resources as it reads a pod's own.
func nodeNvidiaDRADriver(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	c := n.cluster
	// After the driver and its slices are gone (deferred below, so run before this): gpuguard's plugin,
	// which withheld the GPUs the driver published, started again to serve them for the scenarios after.
	defer n.gpuguardServesGPUsAgain(t)
	privilegedBefore := n.enforcerDecisions(t, "privileged")
	d := e.installNvidiaDRADriver(t, n)
	defer d.uninstall(t)

	// A fresh node: the kubelet plugin's pod is there, waiting for the driver, and gpuguard's plugin starts
	// with no record of GPUs withheld. It withholds both, for that pod, with nothing published.
	waiting := d.prestartWaiting(t)
	n.gpuguardStartedAfreshWithholds(t, "the DRA kubelet plugin's pod on the node, nothing published")
	early, err := c.client.ResourceV1().ResourceSlices().List(t.ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver})
	t.must(err, "listing the driver's ResourceSlices")
	if len(early.Items) != 0 {
		t.Fatalf("the DRA driver published %d ResourceSlices before its prestart check passed", len(early.Items))
	}
	// Why, as its record of GPUs withheld says: the pod, not a socket or a slice.
	withheldFor := "NVIDIA's DRA driver runs on this node (pod " + draNamespace + "/" + waiting.Name + ", container gpus)"
	records, err := os.ReadDir(servedElsewhereRecordDir)
	t.must(err, "reading the device plugin's record of GPUs withheld")
	recorded := ""
	for _, record := range records {
		content, err := os.ReadFile(filepath.Join(servedElsewhereRecordDir, record.Name()))
		t.must(err, "reading "+record.Name())
		recorded += string(content)
	}
	if strings.Count(recorded, withheldFor) != nodeGPUs {
		t.Errorf("gpuguard's record of GPUs withheld: %q; want both withheld because %s", recorded, withheldFor)
	}
	t.Logf("the DRA kubelet plugin's pod waiting for the driver, nothing published: gpuguard's plugin, started with no record, withholds both GPUs because %s",
		withheldFor)

	exemptBefore := n.enforcerDecisions(t, "exempt")
	plugin := d.completeDriverRoot(t, waiting)
	// Exempt by the built-in entry (its namespace and its chart's component label): its privileged init
	// and gpus containers were not decided as privileged ones (the enforcer judges exemption first), and
	// its gpus container, the only container made meanwhile, was decided as exempt. The chart's void,
	// which its comment says keeps the runtime from giving the plugin every GPU, is what it runs with.
	if after := n.enforcerDecisions(t, "privileged"); after != privilegedBefore {
		t.Errorf("the enforcer decided %v containers as privileged while NVIDIA's DRA kubelet plugin started; want none, it is exempt",
			after-privilegedBefore)
	}
	if after := n.enforcerDecisions(t, "exempt"); after < exemptBefore+1 {
		t.Errorf("the enforcer decided %v containers as exempt while NVIDIA's DRA kubelet plugin's gpus container started; want it",
			after-exemptBefore)
	}
	if own := n.look(t, e, plugin); own.value != "void" {
		t.Errorf("NVIDIA's DRA kubelet plugin (%s/%s, container %s): %s; want the chart's void", plugin.Namespace, plugin.Name,
			plugin.Spec.Containers[0].Name, own)
	} else {
		t.Logf("NVIDIA's DRA kubelet plugin %s/%s runs from its chart, release %s, exempt under gpuguard's defaults: %s",
			plugin.Namespace, plugin.Name, draRelease, own)
	}
	_, err = c.client.ResourceV1().DeviceClasses().Get(t.ctx, draDriver, metav1.GetOptions{})
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
	// Run once the pods are torn down (deferred below, so before this): the claim, and the one the scheduler
	// made for the nvidia.com/gpu pod, gone.
	defer n.claimsGone(t)
	claiming := func(name string, options ...func(*corev1.Container)) *corev1.Pod {
		pod := cudaPod(name, append(options, withClaim("gpu"))...)
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr(claimName)}}
		return pod
	}
	c.waitUntilClaimKnown(t, nodeNamespace, claiming("dra-probe"), "the ResourceClaim")

	// Torn down before the driver stops, which the kubelet needs to unprepare the claim.
	defer n.deletePodsTornDown(t, "dra-claimed", "dra-beyond", "dra-none", "dra-extended", "dra-extended-beyond")
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
	// A pod that also mounts the host's /dev/nvidia<minor>, the device node of a GPU it was not given.
	mounting := func(pod *corev1.Pod, minor string) *corev1.Pod {
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "other", MountPath: "/dev/nvidia" + minor}}
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "other", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/dev/nvidia" + minor, Type: ptr(corev1.HostPathCharDev)}}})
		return pod
	}
	why := n.failedCreate(t, mounting(claiming("dra-beyond"), other))
	if !strings.Contains(why, "gpuguard: container") || !strings.Contains(why, "/dev/nvidia"+other) {
		t.Errorf("a pod of the same claim also mounting /dev/nvidia%s: %q; want gpuguard's refusal naming it", other, why)
	}
	t.Logf("the same claim, and /dev/nvidia%s mounted: %s", other, why)
	expectGPULess(t, "a GPU-less pod beside NVIDIA's DRA driver", n.look(t, e, n.runPod(t, cudaPod("dra-none"))))

	// The chart's DeviceClass names nvidia.com/gpu as its extendedResourceName, and the node cluster (1.37)
	// has DRAExtendedResource on: with gpuguard's plugin withholding the GPUs, a pod asking for one
	// nvidia.com/gpu is given it through the DRA driver, the other GPU, and sees it alone.
	extendedPod := n.runPod(t, cudaPod("dra-extended", withRequest(gpuResource, "1")))
	extended := n.look(t, e, extendedPod)
	// Served through DRA, not a device plugin: the scheduler made the pod a claim of the DeviceClass.
	running, err := c.client.CoreV1().Pods(nodeNamespace).Get(t.ctx, extendedPod.Name, metav1.GetOptions{})
	t.must(err, "reading the nvidia.com/gpu pod")
	if running.Status.ExtendedResourceClaimStatus == nil {
		t.Fatalf("the pod asking for one %s has no extendedResourceClaimStatus: not served through the DRA driver", gpuResource)
	}
	madeName := running.Status.ExtendedResourceClaimStatus.ResourceClaimName
	{
		made, err := c.client.ResourceV1().ResourceClaims(nodeNamespace).Get(t.ctx, madeName, metav1.GetOptions{})
		t.must(err, "reading the claim the scheduler made for the nvidia.com/gpu pod")
		if made.Status.Allocation == nil || len(made.Status.Allocation.Devices.Results) != 1 ||
			made.Status.Allocation.Devices.Results[0].Driver != draDriver {
			t.Errorf("the claim the scheduler made for the %s pod: %+v; want one device of %s", gpuResource, made.Status.Allocation, draDriver)
		}
	}
	want := "nvidia1"
	if minor == "1" {
		want = "nvidia0"
	}
	if !slices.Equal(extended.gpus(), []string{want}) {
		t.Errorf("a pod asking for one %s beside the claim of gpu-%s, served through the DRA driver: %s; want %s alone", gpuResource,
			minor, extended, want)
	}
	t.Logf("a pod asking for one %s, served through the DRA driver's DeviceClass: %s", gpuResource, extended)

	// Beyond that allocation: the same request, also mounting the GPU the claim holds, is refused naming it.
	// The GPU dra-extended holds is freed first: its pod torn down, and the claim the scheduler made for it
	// removed (claimsGone's work, for that claim alone).
	n.deletePodsTornDown(t, "dra-extended")
	n.claimsGone(t, madeName)
	why = n.failedCreate(t, mounting(cudaPod("dra-extended-beyond", withRequest(gpuResource, "1")), minor))
	// The refusal says what the pod was allocated: the claim the scheduler made for it, by its UID, as the
	// kubelet's pod-resources gave it (were it read as allocated nothing, the same mount would be refused too).
	refused, err := c.client.CoreV1().Pods(nodeNamespace).Get(t.ctx, "dra-extended-beyond", metav1.GetOptions{})
	t.must(err, "reading the refused nvidia.com/gpu pod")
	if refused.Status.ExtendedResourceClaimStatus == nil {
		t.Fatalf("the refused pod asking for one %s has no extendedResourceClaimStatus", gpuResource)
	}
	itsClaim, err := c.client.ResourceV1().ResourceClaims(nodeNamespace).Get(t.ctx,
		refused.Status.ExtendedResourceClaimStatus.ResourceClaimName, metav1.GetOptions{})
	t.must(err, "reading the claim the scheduler made for the refused pod")
	if !strings.Contains(why, "gpuguard: container") || !strings.Contains(why, "/dev/nvidia"+minor) ||
		!strings.Contains(why, "k8s.gpu.nvidia.com/claim="+string(itsClaim.UID)+"-gpu-"+other) {
		t.Errorf("a pod asking for one %s through the DRA driver, also mounting /dev/nvidia%s: %q; want gpuguard's refusal naming it, and "+
			"its allocation k8s.gpu.nvidia.com/claim=%s-gpu-%s", gpuResource, minor, why, itsClaim.UID, other)
	}
	t.Logf("one %s through the DRA driver, and /dev/nvidia%s mounted: %s", gpuResource, minor, why)
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

// claimsGone deletes the node namespace's ResourceClaims once their pods are gone and waits until the API
// server has removed them. The node cluster's controller manager runs no resourceclaim-controller, which
// takes off the finalizer the scheduler puts on a claim it allocates once no pod holds it: that is done
// here, for claims whose pods are gone. Named claims alone where `only` names some.
func (n *Node) claimsGone(t *T, only ...string) {
	claims := n.cluster.client.ResourceV1().ResourceClaims(nodeNamespace)
	t.must(eventually(t.ctx, time.Minute, func() error {
		all, err := claims.List(t.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		list := all.DeepCopy()
		list.Items = slices.DeleteFunc(list.Items, func(claim resourcev1.ResourceClaim) bool {
			return len(only) > 0 && !slices.Contains(only, claim.Name)
		})
		for _, claim := range list.Items {
			if claim.DeletionTimestamp == nil {
				if err := claims.Delete(t.ctx, claim.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
				continue
			}
			if len(claim.Finalizers) > 0 {
				_, err := claims.Patch(t.ctx, claim.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d ResourceClaims left in %s", len(list.Items), nodeNamespace)
		}
		return nil
	}), "removing the ResourceClaims")
}

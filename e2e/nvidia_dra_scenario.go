// NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu at 22407113) on the real node beside gpuguard: its
// kubelet plugin, built from ../shared/peers by scripts/build-peers (-peers), run as a process of the
// node over the node's two fake GPUs through the stand-in libnvidia-ml.so.1. Its Helm chart cannot run
// here: its image needs a prestart script and templates the peer's tarball lacks, and NVIDIA's chart
// refuses gpu.nvidia.com where a device plugin serves the same GPUs; so the plugin is run with the
// environment the chart gives it, and its DeviceClass made as the chart makes it.
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
)

const (
	draDriver = "gpu.nvidia.com"
	// The driver version the stand-in NVML reports, as the node's procfs does: the driver root's
	// libnvidia-ml.so.<version> is how the driver's CDI specs find the driver's libraries.
	draDriverVersion = "580.95.05"
)

// startNvidiaDRADriver lays out a driver root (the stand-in NVML under its versioned name, nvidia-smi) and
// starts NVIDIA's kubelet plugin over it, with the node's admin kubeconfig; it returns the stop.
func (e *Env) startNvidiaDRADriver(t *T, n *Node) func() {
	root := filepath.Join(n.dir, "dra-driver-root")
	libraries := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	for _, dir := range []string{libraries, filepath.Join(root, "usr/bin")} {
		t.must(os.MkdirAll(dir, 0o755), "making the driver root")
	}
	versioned := "libnvidia-ml.so." + draDriverVersion
	t.must(copyFile(e.gpuguard(filepath.Join("tests", "fake-nvml", "libnvidia-ml.so.1")), filepath.Join(libraries, versioned), 0o755),
		"placing the stand-in NVML")
	if err := os.Symlink(versioned, filepath.Join(libraries, "libnvidia-ml.so.1")); err != nil && !os.IsExist(err) {
		t.must(err, "linking libnvidia-ml.so.1")
	}
	t.must(copyFile(e.component("mps-stand-in"), filepath.Join(root, "usr/bin/nvidia-smi"), 0o755), "placing nvidia-smi")
	var gpus []string
	for minor := 0; minor < nodeGPUs; minor++ {
		gpus = append(gpus, fmt.Sprintf(`{"uuid": %q, "minor": %d}`, fakeGPUUUID(minor), minor))
	}
	nvml := filepath.Join(n.dir, "dra-fake-nvml.json")
	t.must(os.WriteFile(nvml, []byte(`{"gpus": [`+strings.Join(gpus, ", ")+"]}\n"), 0o644), "writing the stand-in's GPUs")
	// As the chart's kubelet-plugin container has it: its node, the driver root (here the same on the host
	// and in the plugin, which runs on the host), CDI specs in /var/run/cdi, and the CDI hook.
	driver, err := e.startWithEnv("nvidia-dra-kubelet-plugin", filepath.Join(e.cfg.Peers, "gpu-kubelet-plugin"), []string{
		"NODE_NAME=" + nodeName, "IMAGE_NAME=" + nvidiaPluginImage, "KUBECONFIG=" + e.path("node-control-plane", "admin.kubeconfig"),
		"NVIDIA_DRIVER_ROOT=" + root, "DRIVER_ROOT_CTR_PATH=" + root, "CDI_ROOT=/var/run/cdi",
		"NVIDIA_CDI_HOOK_PATH=" + e.component("nvidia-cdi-hook"), "GPUGUARD_FAKE_NVML=" + nvml,
	}, "-v", "4")
	t.must(err, "starting NVIDIA's DRA kubelet plugin")
	return func() {
		driver.stop()
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
}

// nodeNvidiaDRADriver: NVIDIA's DRA driver publishes the node's two GPUs as a ResourceSlice; a pod whose
// container claims one (a ResourceClaim of the DeviceClass gpu.nvidia.com) runs, and sees that GPU alone,
// looked at from inside: its device node, and NVIDIA_VISIBLE_DEVICES=void from the claim's CDI spec. The
// enforcer reads the claim's CDI devices from pod-resources and the device nodes from the driver's spec,
// so a pod of the same claim that also mounts the other GPU is refused, naming it. A GPU-less pod sees
// none. gpuguard's device plugin withholds the GPUs the slice publishes: the node offers no nvidia.com/gpu.
func nodeNvidiaDRADriver(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	c := n.cluster
	// After the driver and its slices are gone (deferred below, so run before this): gpuguard's plugin,
	// which withheld the GPUs the driver published, started again to serve them for the scenarios after.
	defer n.gpuguardServesGPUsAgain(t)
	stop := e.startNvidiaDRADriver(t, n)
	defer stop()

	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: draDriver}, Spec: resourcev1.DeviceClassSpec{
		Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
			Expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}}}}
	_, err := c.client.ResourceV1().DeviceClasses().Create(t.ctx, class, metav1.CreateOptions{})
	t.must(err, "creating the DeviceClass gpu.nvidia.com")
	defer func() {
		if err := c.client.ResourceV1().DeviceClasses().Delete(t.ctx, draDriver, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the DeviceClass: %v", err)
		}
	}()
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
	defer n.deletePodsTornDown(t, "dra-claimed", "dra-beyond", "dra-none")
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
}

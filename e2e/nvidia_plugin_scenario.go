// NVIDIA's own device plugin (k8s-device-plugin v0.20.0) on the real node beside gpuguard: built from the
// vendored source in ../shared/peers by scripts/build-peers (-peers), run over the node's two fake GPUs
// through the stand-in libnvidia-ml.so.1 (tests/support/fake_nvml.cpp), as its static manifest and as its
// Helm chart run it. gpuguard is installed as the README says; the containers are looked at from inside.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	nvidiaPluginImage = "e2e.gpuguard.io/nvidia-k8s-device-plugin:v0.20.0"
	// Where the image keeps the stand-in NVML's GPUs (GPUGUARD_FAKE_NVML).
	nvidiaPluginGPUs = "/etc/gpuguard-e2e/fake-nvml.json"
	// The socket NVIDIA's plugin serves nvidia.com/gpu on; one it leaves when it fails keeps gpuguard's off
	// the GPUs.
	nvidiaPluginSocket = "/var/lib/kubelet/device-plugins/nvidia-gpu.sock"
	// Where gpuguard's plugin records the GPUs it withheld as served elsewhere, across its restarts.
	servedElsewhereRecordDir = "/var/lib/kubelet/device-plugins/gpuguard"
	// Its Helm chart installed as a release other than the README's nvdp, in namespace nvidia-device-plugin:
	// gpuguard's defaults recognise the chart there by its label, under any release name (gpuInfrastructure).
	nvidiaHelmNamespace = "nvidia-device-plugin"
	nvidiaHelmRelease   = "gpu-sharing"
)

// nvidiaPluginRootfs lays out NVIDIA's plugin image: its binary as the image's entrypoint, the stand-in
// NVML where the driver's library would be, the libraries both load, and the node's GPUs for the stand-in.
// NVIDIA's image has no NVML: on a GPU node the runtime mounts the driver's, which this node has none of.
func (e *Env) nvidiaPluginRootfs(dir string) error {
	for _, sub := range []string{"usr/bin", "lib/x86_64-linux-gnu", "etc/gpuguard-e2e", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	binary := filepath.Join(e.cfg.Peers, "nvidia-device-plugin")
	nvml := e.gpuguard(filepath.Join("tests", "fake-nvml", "libnvidia-ml.so.1"))
	if err := copyFile(binary, filepath.Join(dir, "usr/bin/nvidia-device-plugin"), 0o755); err != nil {
		return err
	}
	if err := copyFile(nvml, filepath.Join(dir, "lib/x86_64-linux-gnu/libnvidia-ml.so.1"), 0o644); err != nil {
		return fmt.Errorf("the stand-in NVML (make build builds it): %w", err)
	}
	if err := copyLibraries(dir, binary, nvml); err != nil {
		return err
	}
	var gpus []string
	for minor := 0; minor < nodeGPUs; minor++ {
		gpus = append(gpus, fmt.Sprintf(`{"uuid": %q, "minor": %d}`, fakeGPUUUID(minor), minor))
	}
	return os.WriteFile(filepath.Join(dir, strings.TrimPrefix(nvidiaPluginGPUs, "/")),
		[]byte(`{"gpus": [`+strings.Join(gpus, ", ")+"]}\n"), 0o644)
}

// nvidiaPluginImageConfig is what NVIDIA's Dockerfile sets, and the stand-in's file.
var nvidiaPluginImageConfig = imageConfig{Env: []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all",
	"NVIDIA_DRIVER_CAPABILITIES=compute,utility", "NVIDIA_DISABLE_REQUIRE=true", "GPUGUARD_FAKE_NVML=" + nvidiaPluginGPUs},
	Entrypoint: []string{"nvidia-device-plugin"}}

// nvidiaPluginLayout says how a DaemonSet of NVIDIA's plugin is made.
type nvidiaPluginLayout struct {
	namespace, name string
	labels          map[string]string
	helm            bool   // installed with helm install from NVIDIA's own chart, else as the static manifest
	config          string // a ConfigMap whose config.yaml the plugin reads (CONFIG_FILE)
	container       string // its container's name; empty: nvidia-device-plugin-ctr, as NVIDIA's manifests name it
	resource        string // what it serves the GPUs as; empty: nvidia.com/gpu
}

func (l nvidiaPluginLayout) served() string {
	if l.resource == "" {
		return gpuResource
	}
	return l.resource
}

// The static manifest (deployments/static/nvidia-device-plugin.yml): kube-system, the default account,
// the image's environment, unprivileged, the kubelet's plugin directory alone.
var nvidiaStatic = nvidiaPluginLayout{namespace: "kube-system", name: "nvidia-device-plugin-daemonset",
	labels: map[string]string{"name": "nvidia-device-plugin-ds"}}

// NVIDIA's Helm chart 0.20.0 (deployments/helm/nvidia-device-plugin in the unpacked peer), installed with helm
// install as release gpu-sharing: its own namespace, account and labels, NVIDIA_VISIBLE_DEVICES=all and
// the MPS root set, the MPS root, its shm and /var/run/cdi from the host; its defaults but for the image
// (the harness's, never pulled) and nvidiaDriverRoot=/, which mounts the host's / read-only at /driver-root
// as on a node whose driver is installed on the host. Its config-manager sidecar (which needs config.map)
// is not rendered.
var nvidiaHelm = nvidiaPluginLayout{namespace: nvidiaHelmNamespace, name: nvidiaHelmRelease + "-nvidia-device-plugin", helm: true,
	labels: map[string]string{"app.kubernetes.io/name": "nvidia-device-plugin", "app.kubernetes.io/instance": nvidiaHelmRelease}}

// helmNvidiaChart runs helm install or uninstall of NVIDIA's chart, as release gpu-sharing.
func (n *Node) helmNvidiaChart(t *T, e *Env, l nvidiaPluginLayout, command string) error {
	var args []string
	if command == "install" {
		image := strings.SplitN(nvidiaPluginImage, ":", 2)
		args = append(args, filepath.Join(e.cfg.Peers, "src", "k8s-device-plugin", "deployments", "helm", "nvidia-device-plugin"),
			"--set", "image.repository="+image[0], "--set", "image.tag="+image[1], "--set", "image.pullPolicy=Never",
			"--set", "nvidiaDriverRoot=/")
	}
	return e.helmPeer(t, "NVIDIA's chart", command, nvidiaHelmRelease, l.namespace, args...)
}

// helmPeer runs helm for a release of a peer's chart (what, in its error) in its namespace on the node's
// cluster: command, release, then args; the output is kept in the run's logs.
func (e *Env) helmPeer(t *T, what, command, release, namespace string, args ...string) error {
	args = append(append([]string{command, release}, args...), "--namespace", namespace,
		"--kubeconfig", e.path("node-control-plane", "admin.kubeconfig"))
	out, err := exec.CommandContext(t.ctx, e.component("helm"), args...).CombinedOutput()
	os.WriteFile(e.path("logs", "helm-"+release+"-"+command+".log"), out, 0o644)
	if err != nil {
		return fmt.Errorf("helm %s %s (%s): %v: %s", command, release, what, err, out)
	}
	return nil
}

func (l nvidiaPluginLayout) daemonSet() *appsv1.DaemonSet {
	hostPath := func(name, path string, kind *corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: kind}}}
	}
	name := l.container
	if name == "" {
		name = "nvidia-device-plugin-ctr"
	}
	container := corev1.Container{Name: name, Image: nvidiaPluginImage, ImagePullPolicy: corev1.PullNever,
		SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr(false),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
		VolumeMounts: []corev1.VolumeMount{{Name: "device-plugin", MountPath: "/var/lib/kubelet/device-plugins"}}}
	spec := corev1.PodSpec{PriorityClassName: "system-node-critical",
		TerminationGracePeriodSeconds: ptr(int64(5)),
		Tolerations:                   []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Volumes:                       []corev1.Volume{hostPath("device-plugin", "/var/lib/kubelet/device-plugins", ptr(corev1.HostPathDirectory))}}
	if l.config != "" {
		container.Env = append(container.Env, corev1.EnvVar{Name: "CONFIG_FILE", Value: "/config/config.yaml"})
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: "config", MountPath: "/config"})
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: l.config}}}})
	}
	spec.Containers = []corev1.Container{container}
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: l.name, Namespace: l.namespace, Labels: l.labels},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: l.labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: l.labels}, Spec: spec}}}
}

// runNvidiaPlugin creates the DaemonSet (or installs the chart) and waits until its pod runs and the node
// offers gpus of the resource it serves; it returns the pod.
func (n *Node) runNvidiaPlugin(t *T, e *Env, l nvidiaPluginLayout, gpus int64) *corev1.Pod {
	if l.helm {
		t.must(n.helmNvidiaChart(t, e, l, "install"), "installing NVIDIA's device plugin chart")
	} else {
		_, err := n.cluster.client.AppsV1().DaemonSets(l.namespace).Create(t.ctx, l.daemonSet(), metav1.CreateOptions{})
		t.must(err, "creating NVIDIA's device plugin DaemonSet "+l.namespace+"/"+l.name)
	}
	var running *corev1.Pod
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		pods, err := n.cluster.client.CoreV1().Pods(l.namespace).List(t.ctx, metav1.ListOptions{
			LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: l.labels})})
		if err != nil {
			return err
		}
		running = nil
		for i, pod := range pods.Items {
			for _, status := range pod.Status.ContainerStatuses {
				if w := status.State.Waiting; w != nil && w.Reason != "ContainerCreating" {
					return fmt.Errorf("NVIDIA's plugin waits: %s: %s", w.Reason, w.Message)
				}
				if status.State.Running != nil && pod.DeletionTimestamp == nil {
					running = &pods.Items[i]
				}
			}
		}
		if running == nil {
			return fmt.Errorf("no pod of NVIDIA's plugin runs")
		}
		return n.offersOf(t, l.served(), gpus)
	}), "waiting for NVIDIA's device plugin ("+l.namespace+") to serve "+strconv.FormatInt(gpus, 10)+" of "+l.served())
	return running
}

// offers says why the node does not offer exactly gpus of nvidia.com/gpu, or nil.
func (n *Node) offers(t *T, gpus int64) error { return n.offersOf(t, gpuResource, gpus) }

// offersOf says why the node does not offer exactly count of resource, or nil.
func (n *Node) offersOf(t *T, resource string, count int64) error {
	node, err := n.cluster.client.CoreV1().Nodes().Get(t.ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if q := node.Status.Allocatable[corev1.ResourceName(resource)]; q.Value() != count {
		return fmt.Errorf("the node offers %s of %s, want %d", q.String(), resource, count)
	}
	return nil
}

// removeNvidiaPlugin deletes its DaemonSet (or uninstalls the chart) and waits until its pods are gone (a
// plugin that stops removes its socket) and so is the DaemonSet: deleted in the foreground it outlives its
// pods until the garbage collector drops its finalizer, and a DaemonSet of the same name made before then
// is refused.
func (n *Node) removeNvidiaPlugin(t *T, e *Env, l nvidiaPluginLayout) {
	if l.helm {
		if err := n.helmNvidiaChart(t, e, l, "uninstall"); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("%v", err)
		}
	} else {
		err := n.cluster.client.AppsV1().DaemonSets(l.namespace).Delete(t.ctx, l.name, metav1.DeleteOptions{PropagationPolicy: ptr(metav1.DeletePropagationForeground)})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting NVIDIA's device plugin DaemonSet %s/%s: %v", l.namespace, l.name, err)
		}
	}
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		pods, err := n.cluster.client.CoreV1().Pods(l.namespace).List(t.ctx, metav1.ListOptions{
			LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: l.labels})})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods of NVIDIA's plugin are left", len(pods.Items))
		}
		_, err = n.cluster.client.AppsV1().DaemonSets(l.namespace).Get(t.ctx, l.name, metav1.GetOptions{})
		if err == nil {
			return fmt.Errorf("the DaemonSet %s/%s is still there", l.namespace, l.name)
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	}), "waiting for NVIDIA's device plugin to go")
}

// restartGpuguardPods deletes the pod of one of gpuguard's DaemonSets (by its app.kubernetes.io/name) and
// waits until the new one is ready.
func (n *Node) restartGpuguardPods(t *T, name string) {
	selector := "app.kubernetes.io/name=" + name
	pods, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: selector})
	t.must(err, "listing "+name+"'s pods")
	for _, pod := range pods.Items {
		t.must(n.cluster.client.CoreV1().Pods(gpuguardNamespace).Delete(t.ctx, pod.Name, metav1.DeleteOptions{}), "deleting "+pod.Name)
	}
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		now, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		if len(now.Items) != 1 || !podReady(now.Items[0]) || now.Items[0].Status.PodIP == "" ||
			(len(pods.Items) == 1 && now.Items[0].Name == pods.Items[0].Name) {
			return fmt.Errorf("%s: %d pods, not yet a new one ready", name, len(now.Items))
		}
		return nil
	}), "waiting for "+name+" to start again")
}

// restartGpuguardPlugin starts gpuguard's device plugin again: after NVIDIA's, as on a cluster that
// already ran it.
func (n *Node) restartGpuguardPlugin(t *T) { n.restartGpuguardPods(t, "gpuguard-device-plugin") }

// nodeNvidiaDevicePlugin: NVIDIA's device plugin beside gpuguard as the README installs it. As its static
// manifest runs it (kube-system, unprivileged, the image's all), it registers and serves both GPUs, and
// sees both itself; gpuguard's plugin, started after it, leaves the GPUs to it and says so. Pods that it
// allocated a GPU see that GPU alone, GPU-less pods none. Time-sliced by its config file (two replicas a
// GPU, IDs UUID::n in pod-resources, which the enforcer reads), three pods of one replica each see their
// GPU alone. Installed with helm install from its own chart (its namespace, account and labels, the host's
// / at /driver-root and the MPS root mounted) the same. Gone, and the kubelet restarted, gpuguard's plugin
// does not take the GPUs back, nor after its own restart. Then the other order, under another name
// (nvidiaRenamedAfterGpuguard).
func nodeNvidiaDevicePlugin(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	c := n.cluster
	defer n.gpuguardServesGPUsAgain(t)

	// As the static manifest runs it; gpuguard's plugin started after it.
	plugin := n.runNvidiaPlugin(t, e, nvidiaStatic, nodeGPUs)
	defer n.removeNvidiaPlugin(t, e, nvidiaStatic) // whichever step failed; gone already, it finds nothing
	n.restartGpuguardPlugin(t)
	n.waitForMetric(t, `gpus="report-only"} 1`)
	t.must(n.offers(t, nodeGPUs), "the node's GPUs, gpuguard's plugin having left them to NVIDIA's")
	expectBothGPUs(t, "NVIDIA's plugin as its static manifest runs it", n.look(t, e, plugin))
	n.expectNvidiaAllocations(t, e, "static", 2)

	// Time-sliced by its config file: four replicas, UUID::0 and UUID::1 of each GPU.
	const config = "nvidia-device-plugin-time-slicing"
	_, err := c.client.CoreV1().ConfigMaps("kube-system").Create(t.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: config},
		Data: map[string]string{"config.yaml": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"}},
		metav1.CreateOptions{})
	t.must(err, "creating the time-slicing config")
	defer func() {
		if err := c.client.CoreV1().ConfigMaps("kube-system").Delete(t.ctx, config, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the time-slicing config: %v", err)
		}
	}()
	n.removeNvidiaPlugin(t, e, nvidiaStatic)
	timeSliced := nvidiaStatic
	timeSliced.config = config
	n.runNvidiaPlugin(t, e, timeSliced, 2*nodeGPUs)
	n.expectNvidiaAllocations(t, e, "time-sliced", 3)
	n.removeNvidiaPlugin(t, e, timeSliced)

	// Installed from its own Helm chart, with helm install.
	c.namespace(t, nvidiaHelmNamespace, nil)
	defer n.waitNamespaceGone(t, nvidiaHelmNamespace)
	defer n.removeNvidiaPlugin(t, e, nvidiaHelm) // whichever step failed; uninstalled already, it finds nothing
	plugin = n.runNvidiaPlugin(t, e, nvidiaHelm, nodeGPUs)
	expectBothGPUs(t, "NVIDIA's plugin as its Helm chart runs it", n.look(t, e, plugin))
	n.expectNvidiaAllocations(t, e, "helm", 1)
	n.removeNvidiaPlugin(t, e, nvidiaHelm)

	// NVIDIA's plugin gone, and the kubelet restarted (both plugins would register again): gpuguard's,
	// having left the GPUs to it, does not take them. The kubelet posts the node's status every 10 s, so
	// first the node must offer none: restarted at once, the old kubelet's last post (NVIDIA's 2) would be
	// read as gpuguard's plugin taking the GPUs.
	t.must(eventually(t.ctx, time.Minute, func() error { return n.offers(t, 0) }),
		"the node offering none of "+gpuResource+" once NVIDIA's plugin is gone")
	n.restartKubelet(t, e)
	n.expectNoGPUsFor(t, 10*time.Second, "NVIDIA's plugin gone and the kubelet restarted", "gpuguard's plugin took the GPUs back")
	n.waitForMetric(t, `gpus="report-only"} 1`)
	// gpuguard's plugin itself restarted, NVIDIA's socket gone: it serves its resource again, and its
	// record of the GPUs it left to NVIDIA's at its start withholds them. Watched past one status post
	// of the kubelet (10 s), which would show GPUs served.
	if _, err := os.Stat(nvidiaPluginSocket); !os.IsNotExist(err) {
		t.Errorf("NVIDIA's socket %s after its plugin is gone and the kubelet restarted: %v", nvidiaPluginSocket, err)
	}
	n.restartGpuguardPlugin(t)
	n.waitForMetric(t, `gpus="served"} 1`)
	n.waitForMetric(t, "gpuguard_device_plugin_gpus_served_elsewhere "+strconv.Itoa(nodeGPUs))
	n.expectNoGPUsFor(t, 12*time.Second, "gpuguard's plugin restarted after leaving the GPUs to NVIDIA's", "its record of the GPUs it left did not hold")
	t.Logf("NVIDIA's plugin gone, the kubelet restarted, then gpuguard's plugin: the node offers no %s, gpuguard's plugin still leaves them", gpuResource)

	n.nvidiaPodBeforeItRegisters(t, e)
	n.nvidiaRenamedAfterGpuguard(t, e)
	n.nvidiaSameNameAfterGpuguard(t, e, timeSliced)
}

// nvidiaSameNameAfterGpuguard: gpuguard's plugin serves the GPUs and gives one to a pod; then NVIDIA's starts
// time-sliced under the same name, nvidia.com/gpu (its default: no rename), whose replicas (UUID::n) the
// kubelet does not know as the GPU gpuguard's pod holds (UUID). gpuguard's sends the kubelet nothing more;
// of three pods NVIDIA's gives replicas of two GPUs of two each, one must hold the pod's GPU: the kubelet
// lists both under one resource, and the plugin counts the GPU held twice, one pod holding it whole. Restarted
// while they run, gpuguard's plugin only reports (NVIDIA's answers on its socket), and still counts it.
func (n *Node) nvidiaSameNameAfterGpuguard(t *T, e *Env, timeSliced nvidiaPluginLayout) {
	n.gpuguardServesGPUsAgain(t)
	const first = "gpuguard-first-same-name"
	defer n.deletePods(t, first)
	firstGPU := ownGPU(t, "a pod given a GPU by gpuguard's plugin before NVIDIA's starts under the same name",
		n.look(t, e, n.runPod(t, cudaPod(first, withRequest(gpuResource, "1")))))
	n.runNvidiaPlugin(t, e, timeSliced, 2*nodeGPUs)
	defer n.removeNvidiaPlugin(t, e, timeSliced) // whichever step failed; gone already, it finds nothing
	n.expectNvidiaAllocationsOf(t, e, "time-sliced-same-name", gpuResource, 3, func() {
		n.waitForMetric(t, "gpuguard_device_plugin_gpus_held_twice 1")
		t.Logf("%s, given %s whole by gpuguard's plugin, and a pod given a replica of it by NVIDIA's under the same name: held twice, said",
			first, firstGPU)
		// gpuguard's plugin restarted beside NVIDIA's answering on its socket: it only reports, and still says it.
		n.restartGpuguardPlugin(t)
		n.waitForMetric(t, `gpus="report-only"} 1`)
		n.waitForMetric(t, "gpuguard_device_plugin_gpus_held_twice 1")
		t.Logf("gpuguard's plugin restarted beside NVIDIA's under the same name: it only reports, and says %s held twice still", firstGPU)
	})
	n.waitForMetric(t, "gpuguard_device_plugin_gpus_held_twice 0")
	n.deletePodsTornDown(t, first)
	n.removeNvidiaPlugin(t, e, timeSliced)
}

// nvidiaPodBeforeItRegisters: a fresh node, where both DaemonSets start together. NVIDIA's plugin's pod is
// on the node but has registered nothing (its image is not there yet, as while it pulls); gpuguard's
// plugin, started with no record of GPUs withheld and no socket of NVIDIA's, withholds every GPU for that
// pod all the same (its namespace, kube-system, is one of the chart's GPU-infrastructure namespaces).
func (n *Node) nvidiaPodBeforeItRegisters(t *T, e *Env) {
	pulling := nvidiaStatic.daemonSet()
	pulling.Spec.Template.Spec.Containers[0].Image = "gpuguard.invalid/nvidia-device-plugin:not-pulled"
	_, err := n.cluster.client.AppsV1().DaemonSets(nvidiaStatic.namespace).Create(t.ctx, pulling, metav1.CreateOptions{})
	t.must(err, "creating NVIDIA's device plugin DaemonSet with an image the node does not have")
	defer n.removeNvidiaPlugin(t, e, nvidiaStatic)
	t.must(eventually(t.ctx, time.Minute, func() error {
		pods, err := n.cluster.client.CoreV1().Pods(nvidiaStatic.namespace).List(t.ctx, metav1.ListOptions{
			LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: nvidiaStatic.labels})})
		if err != nil {
			return err
		}
		for _, pod := range pods.Items {
			for _, status := range pod.Status.ContainerStatuses {
				if w := status.State.Waiting; w != nil && w.Reason == "ErrImageNeverPull" {
					return nil
				}
			}
		}
		return fmt.Errorf("no pod of NVIDIA's plugin waits for its image")
	}), "waiting for NVIDIA's plugin's pod to wait for its image")
	n.gpuguardStartedAfreshWithholds(t, "NVIDIA's plugin's pod on the node, not registered")
	t.Logf("NVIDIA's plugin's pod waiting for its image, registered nowhere: gpuguard's plugin, started with no record, withholds both GPUs")
}

// gpuguardStartedAfreshWithholds restarts gpuguard's plugin as on a fresh node (its record of GPUs withheld
// and NVIDIA's socket deleted) and expects it to withhold both GPUs for what is on the node (the other
// plugin's pod, said as onNode) for 12 s.
func (n *Node) gpuguardStartedAfreshWithholds(t *T, onNode string) {
	for _, path := range []string{nvidiaPluginSocket, servedElsewhereRecordDir} {
		if err := os.RemoveAll(path); err != nil {
			t.Errorf("removing %s: %v", path, err)
		}
	}
	n.restartGpuguardPlugin(t)
	n.waitForMetric(t, `gpus="served"} 1`)
	n.waitForMetric(t, "gpuguard_device_plugin_gpus_served_elsewhere "+strconv.Itoa(nodeGPUs))
	n.expectNoGPUsFor(t, 12*time.Second, onNode+", gpuguard's plugin started afresh", "gpuguard's plugin served the GPUs")
}

// nvidiaRenamedAfterGpuguard: gpuguard's plugin serves the GPUs first; then NVIDIA's starts with renamed
// time-slicing (renameByDefault: the same GPUs as nvidia.com/gpu.shared, UUID::n). gpuguard's plugin
// withholds every GPU the kubelet offers there, so the node offers none of nvidia.com/gpu; pods given a
// replica see their GPU alone. A pod gpuguard's plugin gave a GPU before NVIDIA's started keeps it, and
// once one of NVIDIA's pods holds a replica of that GPU too (three pods on two GPUs of two replicas each:
// one must), the plugin counts it held twice, until NVIDIA's pods are gone. NVIDIA's plugin gone and the
// kubelet restarted, the GPUs stay withheld, and so they do after gpuguard's plugin restarts, by its record.
func (n *Node) nvidiaRenamedAfterGpuguard(t *T, e *Env) {
	n.gpuguardServesGPUsAgain(t)
	const first = "gpuguard-first"
	defer n.deletePods(t, first)
	firstGPU := ownGPU(t, "a pod given a GPU by gpuguard's plugin before NVIDIA's starts",
		n.look(t, e, n.runPod(t, cudaPod(first, withRequest(gpuResource, "1")))))
	const config, shared = "nvidia-device-plugin-renamed", "nvidia.com/gpu.shared"
	_, err := n.cluster.client.CoreV1().ConfigMaps("kube-system").Create(t.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: config},
		Data: map[string]string{"config.yaml": "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"}},
		metav1.CreateOptions{})
	t.must(err, "creating the renamed time-slicing config")
	defer func() {
		if err := n.cluster.client.CoreV1().ConfigMaps("kube-system").Delete(t.ctx, config, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the renamed time-slicing config: %v", err)
		}
	}()
	// Its container renamed too (as an admin's own manifest may): the resource it registers, not its pod,
	// is what withholds the GPUs here.
	renamed := nvidiaStatic
	renamed.config, renamed.resource, renamed.container = config, shared, "device-plugin"
	n.runNvidiaPlugin(t, e, renamed, 2*nodeGPUs)
	defer n.removeNvidiaPlugin(t, e, renamed) // whichever step failed; gone already, it finds nothing
	t.must(eventually(t.ctx, time.Minute, func() error { return n.offers(t, 0) }),
		"gpuguard's plugin withholding the GPUs NVIDIA's serves as "+shared)
	n.waitForMetric(t, "gpuguard_device_plugin_gpus_served_elsewhere "+strconv.Itoa(nodeGPUs))
	n.expectNvidiaAllocationsOf(t, e, "time-sliced-renamed", shared, 3, func() {
		n.waitForMetric(t, "gpuguard_device_plugin_gpus_held_twice 1")
		t.Logf("%s, given %s by gpuguard's plugin, and a pod given a replica of it by NVIDIA's: held twice, said", first, firstGPU)
	})
	n.waitForMetric(t, "gpuguard_device_plugin_gpus_held_twice 0")
	n.deletePodsTornDown(t, first)
	n.removeNvidiaPlugin(t, e, renamed)

	n.restartKubelet(t, e)
	n.expectNoGPUsFor(t, 10*time.Second, "NVIDIA's renamed plugin gone and the kubelet restarted", "gpuguard's plugin served the GPUs again")
	// gpuguard's plugin itself restarted (an upgrade, an OOM kill): its record withholds them still.
	n.restartGpuguardPlugin(t)
	n.waitForMetric(t, "gpuguard_device_plugin_gpus_served_elsewhere "+strconv.Itoa(nodeGPUs))
	n.expectNoGPUsFor(t, 5*time.Second, "gpuguard's plugin restarted", "its record of the GPUs it withheld did not hold")
	t.Logf("gpuguard's plugin serving first, then NVIDIA's as %s: gpuguard's withholds both GPUs, also after NVIDIA's is gone, the kubelet restarted, and its own restart", shared)
}

// restartKubelet stops the kubelet and starts it again, until its device manager has the plugins back.
func (n *Node) restartKubelet(t *T, e *Env) {
	offset := logSize(e, "kubelet")
	n.kubelet.stop()
	t.must(e.startKubelet(n), "starting the kubelet again")
	waitForLog(t, e, "kubelet", offset, `resourceName="github.com/fuse"`, time.Minute)
}

// expectNoGPUsFor checks each second, for the time given, that the node offers no nvidia.com/gpu.
func (n *Node) expectNoGPUsFor(t *T, period time.Duration, after, otherwise string) {
	for waited := time.Duration(0); waited < period; waited += time.Second {
		if err := n.offers(t, 0); err != nil {
			t.Errorf("%s: %v; %s", after, err, otherwise)
			return
		}
		time.Sleep(time.Second)
	}
}

// expectNvidiaAllocations runs count pods asking for one nvidia.com/gpu each, and one asking for none:
// each GPU pod sees the GPU NVIDIA's plugin allocated it alone (its UUID, which NVIDIA's Allocate puts in
// NVIDIA_VISIBLE_DEVICES, and that GPU's device node), the GPU-less pod none.
func (n *Node) expectNvidiaAllocations(t *T, e *Env, what string, count int) {
	n.expectNvidiaAllocationsOf(t, e, what, gpuResource, count)
}

// expectNvidiaAllocationsOf is expectNvidiaAllocations for the GPUs NVIDIA's plugin serves as resource; a
// time-sliced step (what starts with "time-sliced") gives replicas, UUID::n. Each of whileRunning runs
// once the pods have been looked at, before they are deleted.
func (n *Node) expectNvidiaAllocationsOf(t *T, e *Env, what, resource string, count int, whileRunning ...func()) {
	var names []string
	for i := 0; i < count; i++ {
		names = append(names, fmt.Sprintf("nvidia-%s-%d", what, i))
	}
	none := "nvidia-" + what + "-none"
	defer n.deletePods(t, append(names, none)...)
	held := map[string]int{}
	var allocated []string
	for _, name := range names {
		pod := n.runPod(t, cudaPod(name, withRequest(resource, "1")))
		uuid := ownGPU(t, what+": pod "+name+", allocated by NVIDIA's plugin", n.look(t, e, pod))
		held[uuid]++
		// The kubelet's record of the device it gave the pod: the GPU's UUID, or a replica of it
		// (UUID::n), which is what the enforcer reads from pod-resources.
		ids := checkpointDevices(t, resource)[string(pod.UID)]
		if len(ids) != 1 || strings.SplitN(ids[0], "::", 2)[0] != uuid || strings.Contains(ids[0], "::") != strings.HasPrefix(what, "time-sliced") {
			t.Errorf("%s: pod %s sees %s; the kubelet allocated it %v", what, name, uuid, ids)
		}
		allocated = append(allocated, ids...)
	}
	expectGPULess(t, what+": a GPU-less pod beside NVIDIA's plugin", n.look(t, e, n.runPod(t, cudaPod(none))))
	t.Logf("%s: %d pods allocated %v by NVIDIA's plugin see %v; the GPU-less pod sees none", what, count, allocated, held)
	for _, step := range whileRunning {
		step()
	}
	n.deletePodsTornDown(t, append(names, none)...)
}

// gpuguardServesGPUsAgain gives the GPUs back to gpuguard's plugin for the scenarios after this one, as
// docs/device-plugin.md tells an admin to: a socket NVIDIA's plugin left, or the record of the GPUs it
// withheld, would keep it off them, and only a new plugin process serves them again.
func (n *Node) gpuguardServesGPUsAgain(t *T) {
	for _, path := range []string{nvidiaPluginSocket, servedElsewhereRecordDir} {
		if err := os.RemoveAll(path); err != nil {
			t.Errorf("removing %s: %v", path, err)
		}
	}
	n.restartGpuguardPlugin(t)
	n.waitForGPUs(t)
	n.waitForMetric(t, `gpus="served"} 1`)
}

// The doors to the GPUs besides the environment, through the real apiserver: DRA claims the webhook
// learns by list and watch (with the shipped RBAC), hostPath device mounts, CDI annotations and
// RuntimeClasses.
package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// A resource.k8s.io object in `version`, the newest the API server serves (Cluster.draVersion).
func resourceObject(version, kind, namespace, name string, spec map[string]any) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "resource.k8s.io/" + version, "kind": kind, "metadata": map[string]any{"name": name}, "spec": spec}}
	if namespace != "" {
		obj.SetNamespace(namespace)
	}
	return obj
}

// One request for a device of the class: under `exactly` from v1beta2 on, at the request's top in v1beta1.
func deviceRequests(version, name, deviceClass string) map[string]any {
	request := map[string]any{"name": name, "exactly": map[string]any{"deviceClassName": deviceClass}}
	if version == "v1beta1" {
		request = map[string]any{"name": name, "deviceClassName": deviceClass}
	}
	return map[string]any{"devices": map[string]any{"requests": []any{request}}}
}

func withClaim(claim string) func(*corev1.Container) {
	return func(c *corev1.Container) {
		c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: claim})
	}
}

// waitUntilClaimKnown waits until the webhook, which learns claims and templates through its watch, counts
// the claim of probe's first container as a GPU: until then it counts as no GPU, and the container gets
// the injected value. probe is only ever created as a dry run.
func (c *Cluster) waitUntilClaimKnown(t *T, namespace string, probe *corev1.Pod, what string) {
	t.must(eventually(t.ctx, time.Minute, func() error {
		pod, err := c.client.CoreV1().Pods(namespace).Create(t.ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		if got := visibleDevices(pod.Spec.Containers[0]); got != "unset" {
			return fmt.Errorf("the claim's container is stored with NVIDIA_VISIBLE_DEVICES %s: %s is not known yet", got, what)
		}
		return nil
	}), "waiting for the webhook to learn "+what)
}

func draClaims(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	const ns = "e2e-dra"
	c.namespace(t, ns, nil)
	v := c.draVersion
	t.Logf("DRA objects made through resource.k8s.io/%s", v)
	for _, obj := range []*unstructured.Unstructured{
		resourceObject(v, "DeviceClass", "", "gpu.nvidia.com", map[string]any{}),
		resourceObject(v, "DeviceClass", "", "fpga.example.com", map[string]any{}),
		resourceObject(v, "ResourceClaimTemplate", ns, "single-gpu", map[string]any{"spec": deviceRequests(v, "gpu", "gpu.nvidia.com")}),
		resourceObject(v, "ResourceClaim", ns, "fpga", deviceRequests(v, "fpga", "fpga.example.com")),
	} {
		c.apply(t, obj)
	}
	withTemplate := func(name string) *corev1.Pod {
		pod := podWith(name, container("train", withClaim("gpu")), container("logger"))
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr("single-gpu")}}
		return pod
	}
	c.waitUntilClaimKnown(t, ns, withTemplate("probe"), "the ResourceClaimTemplate")

	client := c.clientCollectingWarnings(t)
	stored, err := client.CoreV1().Pods(ns).Create(t.ctx, withTemplate("gpu-from-template"), metav1.CreateOptions{})
	t.must(err, "creating a pod with a GPU claim")
	expectEnv(t, stored, map[string]string{"train": "unset", "logger": "none"})

	fpga := podWith("fpga", container("app", withClaim("fpga")))
	fpga.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "fpga", ResourceClaimName: ptr("fpga")}}
	stored, err = client.CoreV1().Pods(ns).Create(t.ctx, fpga, metav1.CreateOptions{})
	t.must(err, "creating a pod with an FPGA claim")
	expectEnv(t, stored, map[string]string{"app": "none"})

	unknown := podWith("unknown-claim", container("app", withClaim("gpu")))
	unknown.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr("not-created-yet")}}
	client.take()
	stored, err = client.CoreV1().Pods(ns).Create(t.ctx, unknown, metav1.CreateOptions{})
	t.must(err, "creating a pod with a claim that does not exist")
	expectEnv(t, stored, map[string]string{"app": "none"})
	const unknownWarning = `container "app": ResourceClaim "not-created-yet" is not known, so it is treated as requesting no GPU`
	if warnings := client.take(); !slices.Contains(warnings, unknownWarning) {
		t.Errorf("unknown claim: the client got warnings [%s], want %q", joinLines(warnings), unknownWarning)
	}
	if got := c.auditAnnotations(t, ns, "unknown-claim", "")["visible-devices.gpuguard.io/unresolved-claims"]; got != "app" {
		t.Errorf("unknown claim: the audit log has visible-devices.gpuguard.io/unresolved-claims=%q, want \"app\"", got)
	}
}

func otherDoors(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	const ns = "e2e-doors"
	c.namespace(t, ns, nil)
	defer w.defaultPolicy(t)
	client := c.clientCollectingWarnings(t)
	create := func(pod *corev1.Pod) ([]string, error) {
		_, err := client.CoreV1().Pods(ns).Create(t.ctx, pod, metav1.CreateOptions{})
		return client.take(), err
	}

	mountsDev := podWith("mounts-dev", container("agent", func(c *corev1.Container) {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "dev", MountPath: "/host/dev"}}
	}))
	mountsDev.Spec.Volumes = []corev1.Volume{{Name: "dev", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev"}}}}
	warnings, err := create(mountsDev)
	t.must(err, "creating a pod that mounts the host's /dev")
	const mountWarning = `container "agent" mounts the host's /dev (hostPath volume "dev") without requesting a GPU`
	if !slices.Contains(warnings, mountWarning) {
		t.Errorf("hostDeviceMounts: the client got warnings [%s], want %q", joinLines(warnings), mountWarning)
	}
	if got := c.auditAnnotations(t, ns, "mounts-dev", "")["visible-devices.gpuguard.io/host-device-mounts"]; got != "agent" {
		t.Errorf("hostDeviceMounts: the audit log has visible-devices.gpuguard.io/host-device-mounts=%q, want \"agent\"", got)
	}

	cdi := podWith("cdi-annotated", container("app"))
	cdi.Annotations = map[string]string{"cdi.k8s.io/gpus": "nvidia.com/gpu=all"}
	warnings, err = create(cdi)
	t.must(err, "creating a pod with a CDI annotation")
	if want := `the annotation cdi.k8s.io/gpus names CDI devices, and container "app" requests no GPU`; !slices.Contains(warnings, want) {
		t.Errorf("cdiAnnotations: the client got warnings [%s], want %q", joinLines(warnings), want)
	}

	runtimeClass := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": map[string]any{"name": "nvidia-cdi"}, "handler": "nvidia-cdi"}}
	c.apply(t, runtimeClass)
	w.setPolicy(t, map[string]*string{"runtimeClasses": ptr("nvidia-cdi"), "hostDeviceMounts": ptr("deny")})
	withRuntime := podWith("cdi-runtime", container("app"))
	withRuntime.Spec.RuntimeClassName = ptr("nvidia-cdi")
	warnings, err = create(withRuntime)
	t.must(err, "creating a pod with a listed RuntimeClass")
	if want := `runtimeClassName "nvidia-cdi" is in the policy's runtimeClasses, and container "app" requests no GPU`; !slices.Contains(warnings, want) {
		t.Errorf("runtimeClasses: the client got warnings [%s], want %q", joinLines(warnings), want)
	}

	mountsDev.Name = "mounts-dev-denied"
	_, err = create(mountsDev)
	const denial = `container "agent" mounts the host's /dev (hostPath volume "dev"), which reaches GPU devices, without requesting a GPU`
	if err == nil || !strings.Contains(err.Error(), denial) {
		t.Errorf("hostDeviceMounts: deny: creating the pod gave %v, want a denial saying %q", err, denial)
	}
}

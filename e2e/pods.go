// Pods in the shapes the fixture table covers, and how a stored container's NVIDIA_VISIBLE_DEVICES reads.
package main

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	cudaImage   = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"
	envVariable = "NVIDIA_VISIBLE_DEVICES"
	gpuResource = "nvidia.com/gpu"
)

func podWith(name string, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: containers}}
}

func container(name string, options ...func(*corev1.Container)) corev1.Container {
	c := corev1.Container{Name: name, Image: cudaImage}
	for _, option := range options {
		option(&c)
	}
	return c
}

func withEnv(name, value string) func(*corev1.Container) {
	return func(c *corev1.Container) { c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value}) }
}

func withEnvFromConfigMap(name, configMap, key string) func(*corev1.Container) {
	return func(c *corev1.Container) {
		c.Env = append(c.Env, corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
			ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: configMap}, Key: key}}})
	}
}

func withEnvFrom(configMap, prefix string) func(*corev1.Container) {
	return func(c *corev1.Container) {
		c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{Prefix: prefix,
			ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: configMap}}})
	}
}

// fractionalGPUPod is a pod as KAI-Scheduler's admission webhook leaves it: the gpu-fraction annotation,
// its scheduler, and the fraction container's NVIDIA_VISIBLE_DEVICES from the ConfigMap its binder fills.
func fractionalGPUPod(name string) *corev1.Pod {
	pod := podWith(name,
		container("main", withEnvFromConfigMap(envVariable, name+"-shared-gpu-0", envVariable),
			withEnvFromConfigMap("GPU_PORTION", name+"-shared-gpu-0", "GPU_PORTION"), withEnvFrom(name+"-shared-gpu-0-evar", "")),
		container("logger"))
	pod.Annotations = map[string]string{"gpu-fraction": "0.5", "runai/shared-gpu-configmap": name + "-shared-gpu"}
	pod.Spec.SchedulerName = "kai-scheduler"
	return pod
}

// withLimit sets a limit (extended resources: the apiserver copies it to requests).
func withLimit(name, quantity string) func(*corev1.Container) {
	return func(c *corev1.Container) {
		if c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		c.Resources.Limits[corev1.ResourceName(name)] = resource.MustParse(quantity)
	}
}

func withPrivileged() func(*corev1.Container) {
	return func(c *corev1.Container) { c.SecurityContext = &corev1.SecurityContext{Privileged: ptr(true)} }
}

// visibleDevices describes a container's NVIDIA_VISIBLE_DEVICES entries: "unset", the one value, or
// every entry joined when there are several.
func visibleDevices(c corev1.Container) string {
	return describeEnv(c.Env)
}

func describeEnv(env []corev1.EnvVar) string {
	var found []string
	for _, e := range env {
		if e.Name != envVariable {
			continue
		}
		if e.ValueFrom != nil {
			found = append(found, "valueFrom")
		} else {
			found = append(found, e.Value)
		}
	}
	if len(found) == 0 {
		return "unset"
	}
	return strings.Join(found, ",")
}

func otherEnv(c corev1.Container) []string {
	var names []string
	for _, e := range c.Env {
		if e.Name != envVariable {
			names = append(names, e.Name)
		}
	}
	return names
}

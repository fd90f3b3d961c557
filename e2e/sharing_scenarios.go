// GPU sharing on the real node (issue 35), observed inside the containers: the device plugin's config
// time-slices GPU 0 alone under its own name, through the chart, and pods holding its replicas, a whole
// GPU and none see what they should.
package main

import (
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sharedGpuResource is what the config below advertises GPU 0's replicas as; the policy's defaults
// already count it a GPU and a share of one.
const sharedGpuResource = "nvidia.com/gpu.shared"

// nodeTimeSlicing: GPU 0 shared twice as nvidia.com/gpu.shared (devices: [0], renamed), GPU 1 whole.
// Two pods each holding a replica see GPU 0 alone, by its one UUID; a whole-GPU pod sees GPU 1 alone; a
// GPU-less pod sees none. The config is then taken away and both GPUs are whole again.
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
	for _, name := range pods[:2] {
		s := n.look(t, e, n.runPod(t, cudaPod(name, withRequest(sharedGpuResource, "1"))))
		if !slices.Equal(s.gpus(), []string{"nvidia0"}) || s.value != fakeGPUUUID(0) {
			t.Errorf("pod %s holding a replica of GPU 0: %s; want nvidia0 alone and %s", name, s, fakeGPUUUID(0))
		}
		t.Logf("pod %s sees %s", name, s)
	}
	whole := n.look(t, e, n.runPod(t, cudaPod("whole", withRequest(gpuResource, "1"))))
	if !slices.Equal(whole.gpus(), []string{"nvidia1"}) || whole.value != fakeGPUUUID(1) {
		t.Errorf("a whole-GPU pod beside the shared GPU: %s; want nvidia1 alone", whole)
	}
	expectNoGPU(t, "a GPU-less pod on the sharing node", n.look(t, e, n.runPod(t, cudaPod("no-gpu"))), "none")
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

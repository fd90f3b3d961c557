// The driver loaded after gpuguard, as on a fresh GPU Operator node, where the driver itself is a pod.
package main

import (
	"fmt"
	"os"
	"syscall"
)

// The fake driver's procfs directory (node.go's makeFakeDriver), and where it waits while "unloaded".
const (
	driverProcfs   = "/proc/driver/nvidia"
	driverUnloaded = "/proc/driver/.nvidia-unloaded"
)

// unloadDriver takes /proc/driver/nvidia away and makes /proc/driver read-only, as procfs is before the
// driver loads: nothing can make the directory there (a hostPath DirectoryOrCreate of it fails, and its
// pod never starts). It returns the loading.
func unloadDriver(t *T) (load func()) {
	t.must(os.Rename(driverProcfs, driverUnloaded), "hiding the fake driver")
	t.must(syscall.Mount("", "/proc/driver", "", syscall.MS_REMOUNT|syscall.MS_RDONLY|syscall.MS_NOSUID|syscall.MS_NODEV, ""),
		"making /proc/driver read-only")
	loaded := false
	return func() {
		if loaded {
			return
		}
		loaded = true
		t.must(syscall.Mount("", "/proc/driver", "", syscall.MS_REMOUNT|syscall.MS_NOSUID|syscall.MS_NODEV, ""), "making /proc/driver writable")
		t.must(os.Rename(driverUnloaded, driverProcfs), "loading the fake driver")
	}
}

// nodeDriverLate: the driver not loaded, gpuguard's device plugin and node enforcer start (again) all the
// same, mounting no path of the driver's to make, and say what they cannot see: the plugin finds no GPU,
// the enforcer knows none. The driver loads: the enforcer, not restarted, reads the GPUs and a GPU pod sees
// its own GPU alone, a GPU-less pod none; the plugin, started again as the GPU Operator starts its operands
// once the driver is ready, serves both GPUs.
func nodeDriverLate(t *T, e *Env) {
	n := e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
	load := unloadDriver(t)
	serving := false
	defer func() {
		load()
		if !serving { // for the scenarios after this one
			n.restartGpuguardPlugin(t)
			n.waitForGPUs(t)
		}
	}()

	n.restartGpuguardPods(t, "gpuguard-node-enforcer")
	n.restartGpuguardPlugin(t)
	n.waitForMetric(t, `gpus="none"} 1`)
	n.waitForEnforcerRegistered(t)
	t.Logf("the driver not loaded: gpuguard's device plugin and node enforcer started; the plugin reports gpus=\"none\"")

	load()
	defer n.deletePods(t, "driver-late-gpu", "driver-late-none")
	expectGPULess(t, "the driver loaded, a GPU-less pod", n.look(t, e, n.runPod(t, cudaPod("driver-late-none"))))
	page := n.waitForEnforcer(t, "knowing the node's GPUs", func(page string) error {
		if series(page, "gpuguard_node_enforcer_gpus_known") != 1 || series(page, "gpuguard_node_enforcer_gpus") != nodeGPUs {
			return fmt.Errorf("the enforcer knows %v GPUs (known: %v)", series(page, "gpuguard_node_enforcer_gpus"), series(page, "gpuguard_node_enforcer_gpus_known"))
		}
		return nil
	})
	t.Logf("the driver loaded: the enforcer, not restarted, knows %v GPUs", series(page, "gpuguard_node_enforcer_gpus"))
	n.restartGpuguardPlugin(t)
	n.waitForGPUs(t)
	serving = true
	ownGPU(t, "the driver loaded, the plugin started again: a GPU pod", n.look(t, e, n.runPod(t, cudaPod("driver-late-gpu", withRequest(gpuResource, "1")))))
}

// node/agents: the node agents a cluster already runs keep running under gpuguard's defaults, and reach no
// MPS server (issue 51). Each mounts a directory above the MPS roots: the enforcer masks the roots in the
// container with an empty read-only tmpfs rather than refusing it, and the container keeps the rest.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The MPS roots the enforcer holds by default, as the chart makes them on every node it enforces.
var agentMPSRoots = []string{"/run/gpuguard", "/run/nvidia/mps"}

// agentShape is one agent as its chart makes it: a host directory above the MPS roots at a mount point,
// and where, below that mount point, the host's /run is.
type agentShape struct {
	name, hostDir, mountPath, runBelow string
	propagation                        *corev1.MountPropagationMode
	readOnly, privileged               bool
}

func (a agentShape) pod() *corev1.Pod {
	pod := cudaPod(a.name, func(c *corev1.Container) {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "host", MountPath: a.mountPath, ReadOnly: a.readOnly, MountPropagation: a.propagation}}
		if a.privileged {
			c.SecurityContext = &corev1.SecurityContext{Privileged: ptr(true)}
		}
	})
	pod.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: a.hostDir, Type: ptr(corev1.HostPathDirectory)}}}}
	return pod
}

// nodeAgents: node-exporter (the host's / read-only at /host/root, HostToContainer), a privileged security
// agent (/ at /host), a log shipper (/var/log and /run) and a CNI agent (/var/run) start under the defaults
// and keep running; in each, each MPS root below its mount is an empty read-only tmpfs, though the host's
// roots hold a file, while a file beside them in the host's /run is there; the enforcer counts the masks and
// checks each at its start. On CRI-O, which starts a container whose start is refused, the check that holds
// is the mask check the enforcer adds as a createRuntime hook: each masked agent's spec carries it
// (maskCheckedOnCRIO), and runc ran it before the agent's process.
func nodeAgents(t *T, e *Env) {
	n := e.gpuguardFor(t)
	page := n.waitForEnforcerRegistered(t)
	const masks = "gpuguard_node_enforcer_mps_masks_total"
	before := series(page, masks)
	// What an MPS daemon would leave there, and something beside it that the agents must still see.
	probes := []string{"/run/agents-beside-probe"}
	for _, root := range agentMPSRoots {
		t.must(os.MkdirAll(root, 0o755), "making "+root)
		probes = append(probes, filepath.Join(root, "agents-probe"))
	}
	for _, probe := range probes {
		t.must(os.WriteFile(probe, []byte("probe\n"), 0o644), "writing "+probe)
		defer os.Remove(probe)
	}
	agents := []agentShape{
		{name: "node-exporter", hostDir: "/", mountPath: "/host/root", runBelow: "/host/root/run", readOnly: true,
			propagation: ptr(corev1.MountPropagationHostToContainer)},
		{name: "security-agent", hostDir: "/", mountPath: "/host", runBelow: "/host/run", privileged: true},
		{name: "log-shipper", hostDir: "/run", mountPath: "/host-run", runBelow: "/host-run", readOnly: true},
		{name: "cni-agent", hostDir: "/var/run", mountPath: "/host/var/run", runBelow: "/host/var/run"},
	}
	names := []string{}
	for _, agent := range agents {
		names = append(names, agent.name)
	}
	defer n.deletePods(t, names...)
	for _, agent := range agents {
		pod := n.runPod(t, agent.pod())
		if n.onCRIO() && !agent.privileged {
			maskCheckedOnCRIO(t, e, n, pod)
		}
		for _, root := range agentMPSRoots {
			at := agent.runBelow + strings.TrimPrefix(root, "/run")
			listing, err := e.execIn(t, pod, "ls", "-a", at)
			t.must(err, fmt.Sprintf("%s: listing %s", agent.name, at))
			if got := strings.Fields(listing); len(got) != 2 {
				t.Errorf("%s sees %s as %v; want it empty (the host's holds agents-probe)", agent.name, at, got)
			}
			mountinfo, err := e.execIn(t, pod, "cat", "/proc/self/mountinfo")
			t.must(err, agent.name+": reading its mounts")
			if !maskedIn(mountinfo, at) {
				t.Errorf("%s: no read-only tmpfs at %s in its mounts:\n%s", agent.name, at, mountinfo)
			}
		}
		beside, err := e.execIn(t, pod, "cat", agent.runBelow+"/agents-beside-probe")
		if err != nil || strings.TrimSpace(beside) != "probe" {
			t.Errorf("%s: the host's /run/agents-beside-probe at %s: %q, %v; want the file, the rest of the mount kept",
				agent.name, agent.runBelow, beside, err)
		}
		t.Logf("%s (the host's %s at %s): running, each MPS root below it empty and read-only", agent.name, agent.hostDir, agent.mountPath)
	}
	// Still running: nothing restarted them.
	for _, agent := range agents {
		if pod := n.waitRunning(t, nodeNamespace, agent.name); pod.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("%s restarted %d times", agent.name, pod.Status.ContainerStatuses[0].RestartCount)
		}
	}
	// A mount point that is not a plain path: runc follows the image's links before "..", where the
	// enforcer cannot, so no mask can be placed for it; refused at its creation, saying why.
	defer n.deletePods(t, "dotdot-agent")
	dotdot := agentShape{name: "dotdot-agent", hostDir: "/", mountPath: "/var/run/../h", readOnly: true}.pod()
	if why := n.failedCreate(t, dotdot); !strings.Contains(why, "not masked: its mount point is not a plain path") {
		t.Errorf("the host's / at /var/run/../h: %q; want gpuguard's refusal saying the mount point is not a plain path", why)
	}
	// Every agent's masks were checked at its start against its mounts, and held.
	n.waitForEnforcer(t, "checking the masks at each start", func(page string) error {
		if got := series(page, `gpuguard_node_enforcer_mask_checks_total{result="masked"}`); got < float64(len(agents)-1) {
			return fmt.Errorf("%v masks checked and held at a start; want at least %d (the privileged agent is not checked)", got, len(agents)-1)
		}
		if got := series(page, `gpuguard_node_enforcer_mask_checks_total{result="unmasked"}`) + series(page, `gpuguard_node_enforcer_mask_checks_total{result="unknown"}`); got != 0 {
			return fmt.Errorf("%v mask checks failed or could not read the mounts", got)
		}
		return nil
	})
	n.waitForEnforcer(t, "counting the masks", func(page string) error {
		if after := series(page, masks); after < before+float64(len(agents)*len(agentMPSRoots)) {
			return fmt.Errorf("%s went from %v to %v; want %d more", masks, before, after, len(agents)*len(agentMPSRoots))
		}
		return nil
	})
}

// maskCheckedOnCRIO: the agent's container ran with gpuguard's mask check as its one createRuntime hook,
// the program the enforcer copied to the node, told the node's MPS roots.
func maskCheckedOnCRIO(t *T, e *Env, n *Node, pod *corev1.Pod) {
	id := pod.Status.ContainerStatuses[0].ContainerID
	id = id[strings.Index(id, "://")+3:]
	hooks, err := criCreateRuntimeHooks(e.ctx, n.runtime.socket(), id)
	t.must(err, pod.Name+": reading its runtime spec")
	const hook = maskCheckOnNode
	if len(hooks) != 1 || hooks[0][0] != hook || !strings.Contains(strings.Join(hooks[0], " "), " -- /run/gpuguard ") {
		t.Errorf("%s on CRI-O: createRuntime hooks %v; want %s alone, told the MPS roots", pod.Name, hooks, hook)
	}
	if info, err := os.Stat(hook); err != nil || info.Mode().Perm()&0o111 == 0 {
		t.Errorf("the mask check on the node: %v, %v; want the enforcer's copy, executable", info, err)
	}
	t.Logf("%s on CRI-O: checked by its createRuntime hook %v before its process ran", pod.Name, hooks[0][1:])
}

// maskedIn reports whether mountinfo has a read-only tmpfs mounted at `at`.
func maskedIn(mountinfo, at string) bool {
	for _, line := range strings.Split(mountinfo, "\n") {
		fields := strings.Fields(line)
		separator := -1
		for i, field := range fields {
			if field == "-" {
				separator = i
				break
			}
		}
		if separator < 0 || len(fields) < separator+2 || len(fields) < 6 {
			continue
		}
		readOnly := strings.HasPrefix(fields[5], "ro")
		if fields[4] == at && fields[separator+1] == "tmpfs" && readOnly {
			return true
		}
	}
	return false
}

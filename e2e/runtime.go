// The real node's container runtime: containerd (the default) or CRI-O (-runtime crio, make e2e
// E2E_RUNTIME=crio), each configured as such a node ships it, with NVIDIA's runtime as its default runtime
// over runc and NRI on at its defaults. How they are run lives here: their config, how they start, how an
// image gets into their store, and the fail-closed, NRI-off and Helm settings docs/node-enforcer.md gives
// for each. Where what a container sees differs by runtime, the scenario says so where it checks it. What
// the scenarios ask of a running container (exec, its PID) goes through the CRI both serve (cri.go).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	runtimeContainerd = "containerd"
	runtimeCRIO       = "crio"

	crioSocket = "/var/run/crio/crio.sock" // the path the kubelet's cAdvisor knows CRI-O by
	// CRI-O reads every file of its drop-in directory after crio.conf; the scenarios' changes go in one.
	crioDropIn = "/etc/crio/crio.conf.d/99-e2e.conf"
	// The name of a link to the harness that NVIDIA's runtime runs in runc's place on a CRI-O node
	// (hostClamp).
	hostClampName = "runc-host-clamp"
)

// nodeRuntime is one container runtime as the node runs it.
type nodeRuntime interface {
	// title is its name in the scenarios' messages.
	title() string
	// socket is its CRI socket, the kubelet's endpoint.
	socket() string
	// configFiles are its config files as shipped, by path.
	configFiles(e *Env, n *Node) (map[string]string, error)
	// start starts it with its config plus extra (in its own format; "" for none), as an admin does after
	// an edit, and waits until it answers.
	start(e *Env, n *Node, extra string) (*process, error)
	// importImage puts an OCI archive into its image store under name.
	importImage(e *Env, n *Node, archive, name string) error
	// failClosed is what docs/node-enforcer.md tells an admin to add to its config: NRI's default
	// validator, with gpuguard required and the chart's toleration key.
	failClosed() string
	// noNRI switches NRI off.
	noNRI() string
	// helmValues are the values docs/node-enforcer.md tells an admin to set on this runtime.
	helmValues() []string
	// monitor is the program each container runs under, as its parent: containerd's shim, CRI-O's conmon.
	monitor(e *Env) string
	// volatileState is what a reboot takes of it: the directories its containers' mounts are under (root
	// filesystems, /dev/shm, pinned namespaces), and its directories in /run, which is a tmpfs.
	volatileState(n *Node) (mountsUnder, dirs []string)
}

func (e *Env) nodeRuntime() nodeRuntime {
	if e.cfg.Runtime == runtimeCRIO {
		return crio{}
	}
	return containerd{}
}

// runtimePath is the PATH a runtime runs with: containerd finds its shim, and NVIDIA's runtime finds
// runc, there.
func (e *Env) runtimePath() string {
	return "PATH=" + e.cfg.Components + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
}

// startRuntime starts the node's runtime with its config as shipped.
func (e *Env) startRuntime(n *Node) error {
	p, err := n.runtime.start(e, n, "")
	if p != nil { // one that never started leaves the last, stopped, to be stopped again
		n.runtimeProcess = p
	}
	return err
}

// restartRuntime restarts the node's runtime with its config plus extra ("" for none), as an admin does
// after editing it: the running containers stay, their shims (containerd's) or monitors (CRI-O's conmon)
// keep them.
func (e *Env) restartRuntime(n *Node, extra string) error {
	n.runtimeProcess.stop()
	p, err := n.runtime.start(e, n, extra)
	if p != nil {
		n.runtimeProcess = p
	}
	return err
}

// onCRIO: where what a container sees, or what the harness checks, differs on CRI-O.
func (n *Node) onCRIO() bool {
	_, is := n.runtime.(crio)
	return is
}

type containerd struct{}

func (containerd) title() string  { return "containerd" }
func (containerd) socket() string { return containerdSocket }

func (containerd) configFiles(e *Env, n *Node) (map[string]string, error) {
	return map[string]string{"/etc/containerd/config.toml": e.containerdConfig(n)}, nil
}

func (containerd) start(e *Env, n *Node, extra string) (*process, error) {
	if err := os.WriteFile("/etc/containerd/config.toml", []byte(e.containerdConfig(n)+extra), 0o644); err != nil {
		return nil, err
	}
	p, err := e.startWithEnv("containerd", e.component("containerd"), []string{e.runtimePath()}, "--config=/etc/containerd/config.toml")
	if err != nil {
		return nil, err
	}
	// Its own API answers first; the CRI answers "server is not initialized yet" a while longer.
	if err := eventually(e.ctx, time.Minute, func() error {
		if err := p.alive(); err != nil {
			return err
		}
		if _, err := e.ctr("version"); err != nil {
			return err
		}
		return criVersion(e.ctx, containerdSocket)
	}); err != nil {
		return p, fmt.Errorf("containerd did not answer: %w", err)
	}
	return p, nil
}

func (containerd) importImage(e *Env, _ *Node, archive, name string) error {
	if _, err := e.ctr("images", "import", "--platform", "linux/amd64", archive); err != nil {
		return err
	}
	if out, err := e.ctr("images", "check", "name=="+name); err != nil || !strings.Contains(out, "complete") {
		return fmt.Errorf("image %s is not complete in containerd after the import: %v %s", name, err, out)
	}
	return nil
}

func (containerd) failClosed() string {
	return `
[plugins.'io.containerd.nri.v1.nri']
  [plugins.'io.containerd.nri.v1.nri'.default_validator]
    enable = true
    required_plugins = ["gpuguard"]
    tolerate_missing_plugins_annotation = "` + tolerationAnnotation + `"
`
}

// noNRI is its internal/nri config's key, as a node of containerd 1.7 has it.
func (containerd) noNRI() string {
	return `
[plugins.'io.containerd.nri.v1.nri']
  disable = true
`
}

func (containerd) helmValues() []string { return nil }

func (containerd) monitor(e *Env) string { return e.component("containerd-shim-runc-v2") }

func (containerd) volatileState(*Node) (mountsUnder, dirs []string) {
	return []string{"/run/containerd/", "/run/netns/"}, []string{"/run/containerd", "/run/netns"}
}

// ctr runs containerd's own client against the node's containerd, in the CRI's namespace.
func (e *Env) ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.component("ctr"), append([]string{"--address", containerdSocket, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// crio is CRI-O built from ../shared/peers (scripts/build-peers), with Debian's conmon and runc.
type crio struct{}

func (crio) title() string  { return "CRI-O" }
func (crio) socket() string { return crioSocket }

// The store's places, which crio-import is given too.
func crioGraphRoot(n *Node) string { return filepath.Join(n.dir, "crio", "storage") }

const (
	crioRunRoot = "/run/containers/storage"
	crioDriver  = "overlay"
	crioMonitor = "/usr/bin/conmon" // Debian's
)

func (crio) configFiles(e *Env, n *Node) (map[string]string, error) {
	own := filepath.Join(n.dir, "crio")
	// NVIDIA's runtime runs runc through the clamp (hostClamp); the link makes the harness that clamp.
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	clamp := filepath.Join(own, hostClampName)
	if err := os.MkdirAll(own, 0o755); err != nil {
		return nil, err
	}
	if err := os.Symlink(self, clamp); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	// CRI-O's own places outside the node's /etc, /var and /run overlays are moved into the node's
	// directory: hooks (default under /usr), NRI's plugin directories (under /opt), the signature policy.
	conf := fmt.Sprintf(`[crio]
root = %q
runroot = %q
storage_driver = %q
log_dir = "/var/log/crio/pods"
version_file = "/var/run/crio/version"
# A killed CRI-O would otherwise check, and may wipe, its store at the next start.
clean_shutdown_file = ""

[crio.api]
listen = %q
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "nvidia"
cgroup_manager = "cgroupfs"
pinns_path = %q
hooks_dir = [%q]
cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
irqbalance_config_restore_file = "disable"

[crio.runtime.runtimes.nvidia]
runtime_path = %q
runtime_type = "oci"
runtime_root = "/run/runc"
monitor_path = %q
monitor_cgroup = "pod"
monitor_env = [%q]

[crio.image]
pause_image = %q
signature_policy = %q
signature_policy_dir = %q
namespaced_auth_dir = %q

[crio.network]
network_dir = "/etc/cni/net.d/"
plugin_dirs = ["/usr/lib/cni"]

[crio.nri]
enable_nri = true
nri_listen = "/var/run/nri/nri.sock"
nri_plugin_dir = %q
nri_plugin_config_dir = %q
`, crioGraphRoot(n), crioRunRoot, crioDriver, crioSocket, e.peer("pinns"), filepath.Join(own, "hooks.d"),
		e.component("nvidia-container-runtime"), crioMonitor, e.runtimePath(), pauseImage, filepath.Join(own, "policy.json"),
		filepath.Join(own, "policies"), filepath.Join(own, "auth"), filepath.Join(own, "nri-plugins"), filepath.Join(own, "nri-conf.d"))
	return map[string]string{
		"/etc/crio/crio.conf":                       conf,
		filepath.Join(own, "policy.json"):           `{"default": [{"type": "insecureAcceptAnything"}]}` + "\n",
		filepath.Join(own, "storage.conf"):          "",
		"/etc/nvidia-container-runtime/config.toml": nvidiaRuntimeConfig(e, clamp),
	}, nil
}

func (crio) start(e *Env, n *Node, extra string) (*process, error) {
	if extra == "" {
		if err := os.Remove(crioDropIn); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(crioDropIn), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(crioDropIn, []byte(extra), 0o644); err != nil {
			return nil, err
		}
	}
	// CONTAINERS_STORAGE_CONF: no storage.conf of the machine's reaches the node's store.
	env := []string{e.runtimePath(), "CONTAINERS_STORAGE_CONF=" + filepath.Join(n.dir, "crio", "storage.conf")}
	p, err := e.startWithEnv("crio", e.peer("crio"), env, "--log-level=info")
	if err != nil {
		return nil, err
	}
	if err := eventually(e.ctx, time.Minute, func() error {
		if err := p.alive(); err != nil {
			return err
		}
		return criVersion(e.ctx, crioSocket)
	}); err != nil {
		return p, fmt.Errorf("CRI-O did not answer: %w", err)
	}
	return p, nil
}

func (crio) importImage(e *Env, n *Node, archive, name string) error {
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.peer("crio-import"), crioGraphRoot(n), crioRunRoot, crioDriver, archive, name)
	cmd.Env = append(os.Environ(), "CONTAINERS_STORAGE_CONF="+filepath.Join(n.dir, "crio", "storage.conf"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("crio-import %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return criImagePresent(e.ctx, crioSocket, name)
}

func (crio) failClosed() string {
	return `[crio.nri.default_validator]
nri_enable_default_validator = true
nri_validator_required_plugins = ["gpuguard"]
nri_validator_tolerate_missing_plugins_annotation = "` + tolerationAnnotation + `"
`
}

func (crio) noNRI() string {
	return `[crio.nri]
enable_nri = false
`
}

// helmValues: CRI-O makes a hostPath that holds its storage root HostToContainer, and refuses it
// recursively read-only, which must be private (server/container_create_linux.go).
func (crio) helmValues() []string {
	return []string{"--set", "hostRoot.recursiveReadOnly=Disabled"}
}

func (crio) monitor(*Env) string { return crioMonitor }

// CRI-O's /run: its run root (each container's /dev/shm and state), its own directory (its socket,
// conmon's exit files, and the version file, whose absence tells it the node rebooted), runc's state, and
// the namespaces pinned (by pinns, and the PID namespaces by CRI-O itself). The root filesystems are
// mounted in its graph root, which a reboot keeps, unmounted.
func (crio) volatileState(n *Node) (mountsUnder, dirs []string) {
	pinned := []string{"/run/netns", "/run/ipcns", "/run/utsns", "/run/userns", "/run/pidns"}
	dirs = append([]string{crioRunRoot, "/run/crio", "/run/runc"}, pinned...)
	for _, dir := range dirs {
		mountsUnder = append(mountsUnder, dir+"/")
	}
	return append(mountsUnder, filepath.Join(crioGraphRoot(n), crioDriver)+"/"), dirs
}

// nvidiaRuntimeConfig is NVIDIA's runtime in cdi mode, the toolkit's defaults otherwise
// (NVIDIA_VISIBLE_DEVICES=X is the CDI device nvidia.com/gpu=X), running lowLevel as runc.
func nvidiaRuntimeConfig(e *Env, lowLevel string) string {
	return fmt.Sprintf(`[nvidia-container-runtime]
mode = "cdi"
log-level = "info"
debug = %q
runtimes = [%q]
`, e.path("logs", runtimeLogName), lowLevel)
}

// hostClamp is what NVIDIA's runtime runs as runc on a CRI-O node. It takes out of a create's spec, and an
// exec's process, what root on this machine cannot grant, as containerd does on its own, and then runs runc with runc's
// arguments:
//   - an OOM score below its own: root here lacks CAP_SYS_RESOURCE, so no process may lower its score, and
//     runc fails any container the kubelet gives -997 (Guaranteed and node-critical pods). containerd has
//     restrict_oom_score_adj for such hosts; CRI-O has nothing of the kind. The spec gets its own score.
//   - capabilities outside its bounding set: CRI-O gives a privileged container every capability it knows
//     (CAP_SYS_RESOURCE among them), and runc cannot set one the bounding set lacks; containerd gives a
//     privileged container the capabilities it holds itself.
func hostClamp(args []string) int {
	runc, err := exec.LookPath("runc")
	if err == nil {
		err = clampBundle(args)
	}
	if err == nil {
		err = syscall.Exec(runc, append([]string{"runc"}, args...), os.Environ())
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", hostClampName, err)
	return 1
}

// capabilityNames are Linux's capabilities by number (linux/capability.h), as an OCI spec names them.
var capabilityNames = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
	"CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
	"CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"}

// unbounded are the capabilities, by name, that this process's bounding set lacks.
func unbounded() (map[string]bool, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if hex, found := strings.CutPrefix(line, "CapBnd:"); found {
			bounding, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				return nil, fmt.Errorf("CapBnd %q: %w", hex, err)
			}
			lacking := map[string]bool{}
			for bit, name := range capabilityNames {
				if bounding&(1<<bit) == 0 {
					lacking[name] = true
				}
			}
			return lacking, nil
		}
	}
	return nil, errors.New("/proc/self/status has no CapBnd")
}

// clampBundle clamps a create's spec (the bundle's config.json), or an exec's process (--process).
func clampBundle(args []string) error {
	bundle, process, create, execs := "", "", false, false
	for i, arg := range args {
		switch {
		case arg == "create" || arg == "run":
			create = true
		case arg == "exec":
			execs = true
		case (arg == "--bundle" || arg == "-b") && i+1 < len(args):
			bundle = args[i+1]
		case strings.HasPrefix(arg, "--bundle="):
			bundle = strings.TrimPrefix(arg, "--bundle=")
		case (arg == "--process" || arg == "-p") && i+1 < len(args):
			process = args[i+1]
		case strings.HasPrefix(arg, "--process="):
			process = strings.TrimPrefix(arg, "--process=")
		}
	}
	switch {
	case create:
		if bundle == "" {
			bundle = "."
		}
		return clampFile(filepath.Join(bundle, "config.json"), func(spec map[string]any) map[string]any {
			p, _ := spec["process"].(map[string]any)
			return p
		})
	case execs && process != "":
		return clampFile(process, func(p map[string]any) map[string]any { return p })
	}
	return nil
}

// clampFile rewrites the process that processOf finds in the JSON file at path, when it asks for what
// this machine cannot grant.
func clampFile(path string, processOf func(map[string]any) map[string]any) error {
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return err
	}
	floor, err := strconv.Atoi(strings.TrimSpace(string(own)))
	if err != nil {
		return err
	}
	lacking, err := unbounded()
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	decoder := json.NewDecoder(strings.NewReader(string(raw)))
	decoder.UseNumber() // the spec's 64-bit limits stay exact
	var document map[string]any
	if err := decoder.Decode(&document); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	process := processOf(document)
	changed := false
	if asked, ok := process["oomScoreAdj"].(json.Number); ok {
		n, err := asked.Int64()
		if err != nil {
			return fmt.Errorf("%s: oomScoreAdj %v: %w", path, asked, err)
		}
		if n < int64(floor) {
			process["oomScoreAdj"], changed = floor, true
		}
	}
	capabilities, _ := process["capabilities"].(map[string]any)
	for set, names := range capabilities {
		list, _ := names.([]any)
		kept := slices.DeleteFunc(slices.Clone(list), func(name any) bool { s, _ := name.(string); return lacking[s] })
		if len(kept) != len(list) {
			capabilities[set], changed = kept, true
		}
	}
	if !changed {
		return nil
	}
	clamped, err := json.Marshal(document)
	if err != nil {
		return err
	}
	return os.WriteFile(path, clamped, 0o600)
}

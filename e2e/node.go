// The real node, started once per run when a node/ scenario first needs it: a control plane of its own
// (so that its "before gpuguard" is real), containerd with NVIDIA's runtime as the default runtime in
// cdi mode over runc, Debian's CNI bridge, and the whole kubelet, all in the run's own namespaces
// (namespace.go). The node's filesystem is the machine's, but for what a node owns: /dev (the machine's
// usual devices, fake GPUs and /dev/fuse), /proc/driver/nvidia (two fake GPUs), /run, and /etc and /var
// as overlays whose changes stay in the working directory.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	nodeName    = "gpuguard-node"
	nodeAddress = "10.88.0.1"
	podSubnet   = "10.88.0.0/16"
	nodeBridge  = "gpuguard0"

	containerdSocket = "/run/containerd/containerd.sock"
	// What the kubelet's sandboxes run, and the two images the scenarios run, all built here.
	pauseImage    = "registry.k8s.io/pause:3.10.1"
	gpuguardRepo  = "e2e.gpuguard.io/gpuguard"
	gpuguardTag   = "e2e"
	cudaLikeImage = "e2e.gpuguard.io/cuda-like:e2e"
	// The CUDA-like image with the four variables the node enforcer reads at 64 KiB each, as the second red
	// team's running containers had them (node/enforcer-bounded).
	heavyEnvImage  = "e2e.gpuguard.io/heavy-env:e2e"
	nodeGPUs       = 2
	nodeGPULabel   = "nvidia.com/gpu.present=true"
	runtimeLogName = "nvidia-container-runtime.log"
)

// fakeGPUUUID is the UUID procfs gives fake GPU minor.
func fakeGPUUUID(minor int) string {
	return fmt.Sprintf("GPU-e2e0000%d-0000-4000-8000-00000000000%d", minor, minor)
}

type Node struct {
	cluster *Cluster
	dir     string
	kubelet *process
	// runtime is containerd or CRI-O (runtime.go); runtimeProcess, the one running now.
	runtime        nodeRuntime
	runtimeProcess *process
	installed      bool // gpuguard, by helm install (gpuguardFor)
}

// nodeFor starts the node and its control plane on first use.
func (e *Env) nodeFor(t *T) *Node {
	e.mu.Lock()
	n := e.node
	failed := e.nodeFailure
	e.mu.Unlock()
	if n != nil {
		return n
	}
	// The host was set up once for the node (bridge, mounts): a second start would only meet that, so
	// every later node scenario fails with the first start's reason.
	if failed != nil {
		t.must(failed, "starting the real node (the first attempt)")
	}
	n, err := e.startNode()
	if err != nil {
		e.mu.Lock()
		e.nodeFailure = err
		e.mu.Unlock()
	}
	t.must(err, "starting the real node")
	e.mu.Lock()
	e.node = n
	e.mu.Unlock()
	return n
}

func (e *Env) startNode() (*Node, error) {
	n := &Node{dir: e.path("node"), runtime: e.nodeRuntime()}
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return nil, err
	}
	if err := prepareNodeHost(n.dir); err != nil {
		return nil, fmt.Errorf("preparing the node's devices, directories and network: %w", err)
	}
	c, err := e.startCluster("node-control-plane", nodeAddress)
	if err != nil {
		return nil, err
	}
	n.cluster = c
	// Pods reach the API server at the kubernetes Service's address, which kube-proxy would translate; one
	// rule does it here for that one Service (docs/testing.md says why kube-proxy is not run).
	if err := run("iptables", "-t", "nat", "-A", "PREROUTING", "-d", kubernetesServiceIP, "-p", "tcp", "--dport", "443",
		"-j", "DNAT", "--to-destination", nodeAddress+":"+strconv.Itoa(c.port)); err != nil {
		return nil, err
	}
	if err := e.writeNodeConfigs(n); err != nil {
		return nil, err
	}
	if err := e.startRuntime(n); err != nil {
		return nil, err
	}
	if err := e.importImages(n); err != nil {
		return nil, err
	}
	if err := e.startNodeScheduler(n); err != nil {
		return nil, err
	}
	if err := e.startKubelet(n); err != nil {
		return nil, err
	}
	return n, nil
}

// prepareNodeHost gives the node what a node owns, in the run's mount and network namespaces.
func prepareNodeHost(dir string) error {
	// Every mount shared, as systemd makes a host's: CRI-O gives a hostPath of / (gpuguard's node agents
	// mount it) HostToContainer propagation, because it holds CRI-O's store, and refuses it on a private
	// mount; node-exporter and CSI plugins ask for HostToContainer and Bidirectional themselves. The run's
	// mounts were made private first (namespace.go), so the peer groups made here are the run's own and
	// nothing propagates to the machine.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making the node's mounts shared: %w", err)
	}
	for _, overlay := range []string{"/etc", "/var"} {
		upper, work := filepath.Join(dir, "overlay", overlay, "upper"), filepath.Join(dir, "overlay", overlay, "work")
		if err := os.MkdirAll(upper, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(work, 0o755); err != nil {
			return err
		}
		options := "lowerdir=" + overlay + ",upperdir=" + upper + ",workdir=" + work
		if err := syscall.Mount("overlay", overlay, "overlay", 0, options); err != nil {
			return fmt.Errorf("overlay on %s: %w", overlay, err)
		}
	}
	if err := syscall.Mount("tmpfs", "/run", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("tmpfs on /run: %w", err)
	}
	// The MPS daemons' home as a shared mount, as every mount is on a systemd node: their pod mounts it
	// Bidirectional (containerd refuses that on a private mount), so that each GPU's shm tmpfs reaches its
	// clients. Only within the run's own mount namespace.
	if err := os.MkdirAll("/run/gpuguard", 0o755); err != nil {
		return err
	}
	if err := syscall.Mount("/run/gpuguard", "/run/gpuguard", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding /run/gpuguard: %w", err)
	}
	if err := syscall.Mount("", "/run/gpuguard", "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making /run/gpuguard shared: %w", err)
	}
	if err := makeNodeDev(); err != nil {
		return err
	}
	if err := hideUnmountedControllers(dir); err != nil {
		return err
	}
	if err := makeFakeDriver(); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"link", "add", nodeBridge, "type", "bridge"},
		{"addr", "add", nodeAddress + "/16", "dev", nodeBridge},
		{"link", "set", nodeBridge, "up"},
	} {
		if err := run("ip", args...); err != nil {
			return err
		}
	}
	return nil
}

// hideUnmountedControllers gives the node a /proc/cgroups that lists only the cgroup v1 controllers mounted
// under /sys/fs/cgroup, as on a systemd host, which mounts every one the kernel has. This machine's kernel
// lists hugetlb but no hierarchy of it is mounted: CRI-O reads /proc/cgroups, writes hugetlb limits into
// every spec, and runc fails each create ("cannot set hugetlb limit"); containerd leaves hugetlb out by
// default (disable_hugetlb_controller). A bind mount in the run's own mount namespace, gone with it.
func hideUnmountedControllers(dir string) error {
	listed, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		return err
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return err
	}
	mounted := map[string]bool{} // a v1 hierarchy's mount options name its controllers
	for _, line := range strings.Split(string(mounts), "\n") {
		if fields := strings.Fields(line); len(fields) > 3 && fields[2] == "cgroup" {
			for _, option := range strings.Split(fields[3], ",") {
				mounted[option] = true
			}
		}
	}
	var kept []string
	hidden := false
	for _, line := range strings.Split(strings.TrimSuffix(string(listed), "\n"), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 4 && !strings.HasPrefix(fields[0], "#") && !mounted[fields[0]] {
			hidden = true
			continue
		}
		kept = append(kept, line)
	}
	if !hidden {
		return nil
	}
	copied := filepath.Join(dir, "proc-cgroups")
	if err := os.WriteFile(copied, []byte(strings.Join(kept, "\n")+"\n"), 0o444); err != nil {
		return err
	}
	if err := syscall.Mount(copied, "/proc/cgroups", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding the node's /proc/cgroups: %w", err)
	}
	return nil
}

// makeNodeDev mounts a /dev of the node's own: the usual devices, /dev/fuse, and fake GPUs, which are
// character devices with /dev/null's numbers (what a container opens is not the point; which names it
// sees is).
func makeNodeDev() error {
	if err := syscall.Mount("tmpfs", "/dev", "tmpfs", syscall.MS_NOSUID, "mode=0755"); err != nil {
		return fmt.Errorf("tmpfs on /dev: %w", err)
	}
	devices := map[string][2]uint32{"null": {1, 3}, "zero": {1, 5}, "full": {1, 7}, "random": {1, 8}, "urandom": {1, 9},
		"tty": {5, 0}, "kmsg": {1, 11}, "fuse": {10, 229}, "nvidiactl": {1, 3}}
	for minor := 0; minor < nodeGPUs; minor++ {
		devices["nvidia"+strconv.Itoa(minor)] = [2]uint32{1, 3}
	}
	for name, numbers := range devices {
		path := "/dev/" + name
		if err := syscall.Mknod(path, syscall.S_IFCHR|0o666, int(numbers[0]<<8|numbers[1])); err != nil {
			return fmt.Errorf("mknod %s: %w", path, err)
		}
		if err := os.Chmod(path, 0o666); err != nil { // past the umask
			return err
		}
	}
	for _, dir := range []string{"/dev/pts", "/dev/shm"} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
	}
	if err := syscall.Mount("devpts", "/dev/pts", "devpts", syscall.MS_NOSUID|syscall.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("devpts: %w", err)
	}
	if err := syscall.Mount("shm", "/dev/shm", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("/dev/shm: %w", err)
	}
	for link, target := range map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, "/dev/"+link); err != nil {
			return err
		}
	}
	return nil
}

// makeFakeDriver gives /proc/driver/nvidia the files the driver would have for two GPUs, as procfs
// discovery reads them.
func makeFakeDriver() error {
	if err := syscall.Mount("tmpfs", "/proc/driver", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("tmpfs on /proc/driver: %w", err)
	}
	for minor := 0; minor < nodeGPUs; minor++ {
		dir := fmt.Sprintf("/proc/driver/nvidia/gpus/0000:1%d:00.0", minor)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		information := fmt.Sprintf("Model: \t NVIDIA H100 80GB HBM3\nGPU UUID: \t %s\nDevice Minor: \t %d\n", fakeGPUUUID(minor), minor)
		if err := os.WriteFile(filepath.Join(dir, "information"), []byte(information), 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile("/proc/driver/nvidia/version", []byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05\n"), 0o644)
}

// writeNodeConfigs writes containerd's, NVIDIA's runtime's and the CNI's configs where a node has them
// (in the /etc overlay), so that the device plugin's node report reads this node as it is.
func (e *Env) writeNodeConfigs(n *Node) error {
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "gpuguard-e2e",
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
`, nodeBridge, podSubnet, nodeAddress)

	if err := os.MkdirAll(filepath.Join(n.dir, "static-pods"), 0o755); err != nil {
		return err
	}
	// The driver's programs, as nvidia-ctk's spec mounts them: stand-ins (e2e/cmd/mps-stand-in).
	standIns := filepath.Join(n.dir, "driver-stand-ins")
	if err := os.MkdirAll(standIns, 0o755); err != nil {
		return err
	}
	for _, name := range []string{"nvidia-smi", "nvidia-cuda-mps-control"} {
		if err := copyFile(e.component("mps-stand-in"), filepath.Join(standIns, name), 0o755); err != nil {
			return err
		}
	}
	files := map[string]string{
		"/etc/cdi/nvidia.yaml":                         nvidiaCtkSpec(standIns),
		"/etc/nvidia-container-runtime/config.toml":    nvidiaRuntimeConfig(e, "runc"),
		"/etc/cni/net.d/10-gpuguard-e2e.conflist":      cni,
		filepath.Join(n.dir, "kubelet", "config.yaml"): e.kubeletConfig(n),
	}
	// The runtime's own, which may run NVIDIA's runtime over something else than runc (runtime.go says why).
	own, err := n.runtime.configFiles(e, n)
	if err != nil {
		return err
	}
	for path, content := range own {
		files[path] = content
	}
	for path, content := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// containerdConfig is the node's containerd config as shipped: NRI at its defaults (on, its socket at
// /var/run/nri/nri.sock, no plugin required).
func (e *Env) containerdConfig(n *Node) string {
	return fmt.Sprintf(`version = 3
root = %q
state = "/run/containerd"

[grpc]
  address = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  # Root on this machine lacks CAP_SYS_RESOURCE, so no process may lower its OOM score: sandboxes and
  # containers keep containerd's instead of the kubelet's -998 and -997.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "nvidia"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
        BinaryName = %q
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "/etc/cni/net.d"
`, filepath.Join(n.dir, "containerd"), containerdSocket, pauseImage, e.component("nvidia-container-runtime"))
}

// nvidiaCtkSpec is the node's spec of NVIDIA's kind in the shape `nvidia-ctk cdi generate` writes it
// (which needs a driver): each GPU by index and by UUID, all, the control device and the driver's
// programs (here the stand-ins in standIns) for every container, and no device named none.
func nvidiaCtkSpec(standIns string) string {
	var devices strings.Builder
	var all []string
	for minor := 0; minor < nodeGPUs; minor++ {
		node := fmt.Sprintf("{path: /dev/nvidia%d}", minor)
		all = append(all, node)
		for _, name := range []string{strconv.Itoa(minor), fakeGPUUUID(minor)} {
			fmt.Fprintf(&devices, "  - name: %q\n    containerEdits: {deviceNodes: [%s]}\n", name, node)
		}
	}
	return fmt.Sprintf(`cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
%s  - name: all
    containerEdits: {deviceNodes: [%s]}
containerEdits:
  deviceNodes: [{path: /dev/nvidiactl}]
  mounts:
  - {hostPath: %s/nvidia-smi, containerPath: /usr/bin/nvidia-smi, options: [ro, nosuid, nodev, bind]}
  - {hostPath: %s/nvidia-cuda-mps-control, containerPath: /usr/bin/nvidia-cuda-mps-control, options: [ro, nosuid, nodev, bind]}
`, devices.String(), strings.Join(all, ", "), standIns, standIns)
}

func (e *Env) kubeletConfig(n *Node) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 only.
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
containerRuntimeEndpoint: unix://%s
# On the node's address, in the run's own network namespace, where the API server reaches it (kubectl
# logs and exec); only clients with a certificate of the cluster's CA, the API server's, get in.
address: %s
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: %q}}
authorization: {mode: AlwaysAllow}
# Fast volume updates: a ConfigMap or Secret change reaches the pod within seconds.
syncFrequency: 5s
configMapAndSecretChangeDetectionStrategy: Watch
nodeStatusUpdateFrequency: 4s
# A shared CI machine: its disk and memory are not the node's to evict for.
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: /etc/resolv.conf
# Static pods, which the kubelet runs whatever admission says.
staticPodPath: %s
fileCheckFrequency: 2s
`, os.Getenv(cgroupRootEnv), n.runtime.socket(), nodeAddress, n.cluster.caFile, filepath.Join(n.dir, "static-pods"))
}

func (e *Env) startNodeScheduler(n *Node) error {
	kubeconfig := filepath.Join(n.dir, "scheduler.kubeconfig")
	if err := n.cluster.writeKubeconfig(kubeconfig, schedulerToken); err != nil {
		return err
	}
	config := filepath.Join(n.dir, "scheduler.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: %q}
leaderElection: {leaderElect: false}
`, kubeconfig)), 0o644); err != nil {
		return err
	}
	_, err := e.start("node-kube-scheduler", e.component("kube-scheduler"), "--config="+config, "--secure-port=0")
	return err
}

func (e *Env) startKubelet(n *Node) error {
	if err := makeCgroupRoot(os.Getenv(cgroupRootEnv)); err != nil {
		return err
	}
	kubeconfig := filepath.Join(n.dir, "kubelet", "kubeconfig")
	if err := n.cluster.writeKubeconfig(kubeconfig, kubeletToken); err != nil {
		return err
	}
	kubelet, err := e.start("kubelet", e.component("kubelet"), "--config="+filepath.Join(n.dir, "kubelet", "config.yaml"),
		"--kubeconfig="+kubeconfig, "--hostname-override="+nodeName, "--node-ip="+nodeAddress,
		"--node-labels="+nodeGPULabel, "--v=2")
	if err != nil {
		return err
	}
	n.kubelet = kubelet
	return eventually(e.ctx, 2*time.Minute, func() error {
		if err := kubelet.alive(); err != nil {
			return err
		}
		node, err := n.cluster.client.CoreV1().Nodes().Get(e.ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, condition := range node.Status.Conditions {
			if condition.Type == corev1.NodeReady && condition.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node %s is not Ready: %v", nodeName, node.Status.Conditions)
	})
}

// run runs a host tool (ip, iptables) and returns its output with the error.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

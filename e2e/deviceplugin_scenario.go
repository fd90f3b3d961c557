// Scenario: gpuguard-device-plugin served to the kubelet's own device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager), over the real sockets, with a fake host tree of
// eight GPUs on two NUMA nodes and /dev/fuse; then, with NVML from the test suite's stand-in
// libnvidia-ml.so.1, time-sliced GPUs and MIG devices from a config file in NVIDIA's format. The device manager only works at the kubelet's fixed path,
// /var/lib/kubelet/device-plugins, so the scenario runs in a child process in a private mount namespace
// with a tmpfs there: the machine's own directory is never touched.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

const (
	deviceManagerChildArg = "__device-manager-child"
	fuseResource          = "github.com/fuse"
	migResource           = "nvidia.com/mig-2g.20gb"
	gpuCount              = 8
	migGPU                = 7 // the GPU in MIG mode in the NVML scenario
	migDevices            = 3
	replicas              = 4
)

// childConfig is what the parent hands the child on its command line.
type childConfig struct {
	Work     string `json:"work"`
	Gpuguard string `json:"gpuguard"`
}

func devicePlugin(t *T, e *Env) {
	config, err := json.Marshal(childConfig{Work: e.work, Gpuguard: e.cfg.Gpuguard})
	t.must(err, "encoding the child's configuration")
	self, err := os.Executable()
	t.must(err, "finding the harness binary")
	cmd := exec.CommandContext(t.ctx, self, deviceManagerChildArg, string(config))
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	var failures []string
	if jsonErr := json.Unmarshal(out, &failures); jsonErr != nil {
		t.Fatalf("the device manager child (in a private mount namespace, which needs root) failed: %v; output: %q", err, out)
	}
	for _, f := range failures {
		t.Errorf("%s", f)
	}
}

// deviceManagerChild runs in the private mount namespace (os/exec made every mount private); it prints
// its failures as a JSON array and returns the exit status.
func deviceManagerChild(args []string) int {
	var config childConfig
	report := func(failures []string) int {
		out, _ := json.Marshal(failures)
		fmt.Println(string(out))
		return 0
	}
	if len(args) != 1 || json.Unmarshal([]byte(args[0]), &config) != nil {
		return report([]string{"device manager child: bad arguments"})
	}
	if err := syscall.Mount("tmpfs", "/var/lib", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755"); err != nil {
		return report([]string{"mounting a private tmpfs on /var/lib: " + err.Error()})
	}
	if err := os.MkdirAll(filepath.Dir(pluginapi.KubeletSocket), 0o750); err != nil {
		return report([]string{err.Error()})
	}
	env := &Env{ctx: context.Background(), cfg: Config{Gpuguard: config.Gpuguard}, work: config.Work, keep: true}
	defer env.Close()
	t := runScenario(env.ctx, env, scenario{name: "device-plugin", run: deviceManagerScenario})
	return report(t.failures)
}

type fakeGPU struct {
	uuid  string
	minor int
	numa  int
	pci   string
}

// fakeHost writes what the NVIDIA driver shows a node with eight GPUs, even minors on NUMA node 0 and
// odd ones on node 1, plus the control device nodes and /dev/fuse.
func fakeHost(t *T, root string) []fakeGPU {
	var gpus []fakeGPU
	write := func(path, content string) {
		full := filepath.Join(root, path)
		t.must(os.MkdirAll(filepath.Dir(full), 0o755), "creating "+filepath.Dir(full))
		t.must(os.WriteFile(full, []byte(content), 0o644), "writing "+full)
	}
	for minor := 0; minor < gpuCount; minor++ {
		g := fakeGPU{uuid: fmt.Sprintf("GPU-e2e00000-0000-4000-8000-00000000000%d", minor), minor: minor, numa: minor % 2,
			pci: fmt.Sprintf("0000:%02x:00.0", 0x18+minor)}
		gpus = append(gpus, g)
		write("proc/driver/nvidia/gpus/"+g.pci+"/information", fmt.Sprintf(
			"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t %s\nVideo BIOS: \t 96.00.99.00.01\n"+
				"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\n"+
				"Device Minor: \t %d\nGPU Excluded:\t No\n", g.uuid, g.pci, g.minor))
		write("sys/bus/pci/devices/"+g.pci+"/numa_node", fmt.Sprintf("%d\n", g.numa))
		write(fmt.Sprintf("dev/nvidia%d", minor), "")
	}
	write("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n")
	for _, node := range []string{"dev/nvidiactl", "dev/nvidia-uvm", "dev/nvidia-uvm-tools", "dev/fuse"} {
		write(node, "")
	}
	return gpus
}

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

// kubelet is the part of a kubelet the device manager needs: the pods it considers active.
type kubelet struct {
	manager *devicemanager.ManagerImpl
	logger  klog.Logger
	active  []*corev1.Pod
}

func startDeviceManager(t *T, k *kubelet) {
	manager, err := devicemanager.NewManagerImpl(k.logger, nil, topologymanager.NewFakeManager(k.logger))
	t.must(err, "creating the device manager")
	t.must(manager.Start(k.logger, func() []*corev1.Pod { return k.active }, sourcesReady{}, containermap.NewContainerMap(), sets.New[string]()),
		"starting the device manager")
	k.manager = manager
}

// waitForResources waits until the device manager reports these capacities and allocatable counts.
func (k *kubelet) waitForResources(t *T, step string, capacity, allocatable map[string]int64) {
	var last string
	err := eventually(t.ctx, 20*time.Second, func() error {
		gotCapacity, gotAllocatable, _ := k.manager.GetCapacity(k.logger)
		last = fmt.Sprintf("capacity %v, allocatable %v", quantities(gotCapacity), quantities(gotAllocatable))
		for name, want := range capacity {
			q := gotCapacity[corev1.ResourceName(name)]
			if q.Value() != want {
				return fmt.Errorf("%s", last)
			}
		}
		for name, want := range allocatable {
			q := gotAllocatable[corev1.ResourceName(name)]
			if q.Value() != want {
				return fmt.Errorf("%s", last)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: the device manager reports %s; want capacity %v and allocatable %v", step, last, capacity, allocatable)
	}
}

func quantities(list corev1.ResourceList) map[string]int64 {
	out := map[string]int64{}
	for name, q := range list {
		out[string(name)] = q.Value()
	}
	return out
}

// allocate admits a pod with one container asking for the given resources, as the kubelet does, and
// returns what the runtime would be told for it and which device IDs were chosen.
func (k *kubelet) allocate(t *T, name string, limits map[string]int64) (*devicemanager.DeviceRunContainerOptions, []string) {
	resources := corev1.ResourceList{}
	for resourceName, count := range limits {
		resources[corev1.ResourceName(resourceName)] = *resource.NewQuantity(count, resource.DecimalSI)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: resources, Requests: resources}}}},
	}
	k.active = append(k.active, pod)
	t.must(k.manager.Allocate(t.ctx, pod, &pod.Spec.Containers[0], lifecycle.AddOperation), "allocating devices to "+name)
	options, err := k.manager.GetDeviceRunContainerOptions(t.ctx, pod, &pod.Spec.Containers[0])
	t.must(err, "reading the run options of "+name)
	var ids []string
	for _, devices := range k.manager.GetDevices(string(pod.UID), "main") {
		for id := range devices {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return options, ids
}

// release makes a pod inactive, so that the next allocation frees its devices.
func (k *kubelet) release(name string) {
	k.active = slices.DeleteFunc(k.active, func(p *corev1.Pod) bool { return p.Name == name })
}

type plugin struct {
	process *process
}

// The kubelet's device manager runs here without the kubelet's pod-resources API, so the plugin is told
// not to ask it what other plugins serve (docs/device-plugin.md#no-gpu-served-twice); none run here.
var noPodResources = []string{"--pod-resources-socket", ""}

func startPlugin(t *T, e *Env, host, strategy string, extra ...string) *plugin {
	args := append([]string{"--device-plugin-dir=" + filepath.Dir(pluginapi.KubeletSocket) + "/", "--host-root=" + host,
		"--discovery=procfs", "--resource-name=" + gpuResource, "--device-list-strategy=" + strategy,
		"--host-device=" + fuseResource + "=/dev/fuse:4", "--metrics-address=127.0.0.1:0"}, append(noPodResources, extra...)...)
	p, err := e.start("gpuguard-device-plugin", e.gpuguard("gpuguard-device-plugin"), args...)
	t.must(err, "starting gpuguard-device-plugin")
	return &plugin{process: p}
}

// startSharedPlugin starts the plugin with NVML from the stand-in library: GPU 7 in MIG mode with three
// 2g.20gb devices (their capability files in the host tree), and a config file in NVIDIA's format that
// serves MIG devices as their own resource and shares every whole GPU four ways.
func startSharedPlugin(t *T, e *Env, host string, gpus []fakeGPU) (*plugin, []string) {
	var nvmlGPUs []map[string]any
	var migUUIDs []string
	for _, g := range gpus {
		entry := map[string]any{"uuid": g.uuid, "minor": g.minor, "memoryMiB": 81559}
		if g.minor == migGPU {
			var migs []map[string]any
			for i := 0; i < migDevices; i++ {
				uuid := fmt.Sprintf("MIG-e2e00000-0000-4000-8000-00000000070%d", i)
				migUUIDs = append(migUUIDs, uuid)
				gi := 3 + 2*i
				migs = append(migs, map[string]any{"uuid": uuid, "gi": gi, "ci": 0, "profile": 1, "giSlices": 2,
					"ciSlices": 2, "memoryMiB": 19968})
				capabilities := filepath.Join(host, fmt.Sprintf("proc/driver/nvidia/capabilities/gpu%d/mig/gi%d", migGPU, gi))
				t.must(os.MkdirAll(filepath.Join(capabilities, "ci0"), 0o755), "creating MIG capability files")
				t.must(os.WriteFile(filepath.Join(capabilities, "access"), []byte(fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\n", 10*gi)), 0o644), "writing a GPU instance's access file")
				t.must(os.WriteFile(filepath.Join(capabilities, "ci0", "access"), []byte(fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\n", 10*gi+1)), 0o644), "writing a compute instance's access file")
			}
			entry["mig"] = migs
		}
		nvmlGPUs = append(nvmlGPUs, entry)
	}
	nvml, err := json.Marshal(map[string]any{"gpus": nvmlGPUs})
	t.must(err, "encoding the stand-in NVML's GPUs")
	t.must(os.WriteFile(e.path("nvml.json"), nvml, 0o644), "writing the stand-in NVML's GPUs")
	config := fmt.Sprintf("version: v1\nflags:\n  migStrategy: mixed\n  plugin:\n    passDeviceSpecs: true\n"+
		"sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: %d\n", replicas)
	t.must(os.WriteFile(e.path("device-plugin.yaml"), []byte(config), 0o644), "writing the plugin's config file")
	args := []string{"--device-plugin-dir=" + filepath.Dir(pluginapi.KubeletSocket) + "/", "--host-root=" + host,
		"--discovery=nvml", "--config-file=" + e.path("device-plugin.yaml"),
		"--host-device=" + fuseResource + "=/dev/fuse:4", "--metrics-address=127.0.0.1:0"}
	args = append(args, noPodResources...)
	env := []string{"LD_LIBRARY_PATH=" + e.gpuguard(filepath.Join("tests", "fake-nvml")), "GPUGUARD_FAKE_NVML=" + e.path("nvml.json")}
	p, err := e.startWithEnv("gpuguard-device-plugin", e.gpuguard("gpuguard-device-plugin"), env, args...)
	t.must(err, "starting gpuguard-device-plugin with the stand-in NVML")
	return &plugin{process: p}, migUUIDs
}

func envOf(options *devicemanager.DeviceRunContainerOptions) map[string]string {
	env := map[string]string{}
	for _, e := range options.Envs {
		env[e.Name] = e.Value
	}
	return env
}

func deviceManagerScenario(t *T, e *Env) {
	host := e.path("host")
	os.RemoveAll(host)
	gpus := fakeHost(t, host)
	uuid := func(minors ...int) []string {
		var ids []string
		for _, m := range minors {
			ids = append(ids, gpus[m].uuid)
		}
		sort.Strings(ids)
		return ids
	}

	logFile, err := os.Create(e.path("logs", "device-manager.log"))
	t.must(err, "creating the device manager's log")
	defer logFile.Close()
	flags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(flags)
	flags.Set("logtostderr", "false")
	flags.Set("stderrthreshold", "FATAL")
	klog.SetOutput(logFile)
	k := &kubelet{logger: klog.Background()}
	startDeviceManager(t, k)
	defer func() { k.manager.Stop(k.logger) }()

	p := startPlugin(t, e, host, "envvar")
	everything := map[string]int64{gpuResource: gpuCount, fuseResource: 4}
	k.waitForResources(t, "registration", everything, everything)

	// Preferred allocation: one GPU, then three. gpuguard prefers the lowest minor, then one NUMA node
	// with room, tried in the order of its lowest free device: {0}, then {1, 3, 5} on node 1. The device
	// manager alone would take any three of the seven.
	_, ids := k.allocate(t, "first", map[string]int64{gpuResource: 1})
	if !slices.Equal(ids, uuid(0)) {
		t.Errorf("preferred allocation: one GPU went to %v, want the lowest minor %v", ids, uuid(0))
	}
	_, ids = k.allocate(t, "second", map[string]int64{gpuResource: 3})
	if !slices.Equal(ids, uuid(1, 3, 5)) {
		t.Errorf("preferred allocation: three GPUs went to %v, want %v, on one NUMA node", ids, uuid(1, 3, 5))
	}
	k.release("first")
	k.release("second")

	for _, strategy := range []string{"envvar", "volume-mounts", "cdi"} {
		if strategy != "envvar" {
			p.process.stop()
			p = startPlugin(t, e, host, strategy, "--pass-device-specs")
			// The new process registers again; until then the resource may read zero.
			k.waitForResources(t, strategy+": re-registration", everything, everything)
		}
		name := "two-gpus-" + strategy
		options, ids := k.allocate(t, name, map[string]int64{gpuResource: 2, fuseResource: 1})
		k.release(name)
		var gpuIDs []string
		for _, id := range ids {
			if strings.HasPrefix(id, "GPU-") {
				gpuIDs = append(gpuIDs, id)
			}
		}
		if len(gpuIDs) != 2 {
			t.Errorf("%s: %v allocated, want two GPUs and a fuse slot", strategy, ids)
			continue
		}
		checkRunOptions(t, strategy, options, gpuIDs)
	}

	// Health: a GPU whose device node goes away leaves allocatable, and comes back with it.
	node := filepath.Join(host, "dev", "nvidia7")
	t.must(os.Remove(node), "removing /dev/nvidia7 from the host tree")
	k.waitForResources(t, "unhealthy GPU", map[string]int64{gpuResource: gpuCount}, map[string]int64{gpuResource: gpuCount - 1})
	t.must(os.WriteFile(node, nil, 0o644), "restoring /dev/nvidia7")
	k.waitForResources(t, "recovered GPU", everything, everything)

	// A kubelet restart: a new device manager wipes the plugin sockets and serves a new kubelet.sock; the
	// plugin must notice, serve again and register with it.
	k.manager.Stop(k.logger)
	startDeviceManager(t, k)
	k.waitForResources(t, "kubelet restart", everything, everything)
	p.process.stop()

	// Time-slicing and MIG, as NVIDIA's config file asks for them.
	p, migUUIDs := startSharedPlugin(t, e, host, gpus)
	defer p.process.stop()
	shared := map[string]int64{gpuResource: replicas * (gpuCount - 1), migResource: migDevices, fuseResource: 4}
	k.waitForResources(t, "time-slicing and MIG", shared, shared)
	// Two replicas: preferred allocation spreads them over the two least used GPUs, and the container is
	// told each GPU once.
	options, ids := k.allocate(t, "replicas", map[string]int64{gpuResource: 2})
	if want := []string{gpus[0].uuid + "::0", gpus[1].uuid + "::0"}; !slices.Equal(ids, want) {
		t.Errorf("time-slicing: two replicas went to %v, want %v, one on each of two GPUs", ids, want)
	}
	visible := strings.Split(envOf(options)[envVariable], ",")
	sort.Strings(visible) // the device manager passes the IDs in no particular order
	if want := []string{gpus[0].uuid, gpus[1].uuid}; !slices.Equal(visible, want) {
		t.Errorf("time-slicing: NVIDIA_VISIBLE_DEVICES names %v, want %v, each once", visible, want)
	}
	options, ids = k.allocate(t, "mig", map[string]int64{migResource: 1})
	if !slices.Equal(ids, migUUIDs[:1]) {
		t.Errorf("MIG: %s went to %v, want %v", migResource, ids, migUUIDs[:1])
	}
	if got := envOf(options)[envVariable]; got != migUUIDs[0] {
		t.Errorf("MIG: NVIDIA_VISIBLE_DEVICES is %q, want the MIG device's UUID %s", got, migUUIDs[0])
	}
	var devices []string
	for _, d := range options.Devices {
		devices = append(devices, d.PathOnHost)
	}
	for _, node := range []string{fmt.Sprintf("/dev/nvidia%d", migGPU), "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"} {
		if !slices.Contains(devices, node) {
			t.Errorf("MIG: device specs %v lack %s", devices, node)
		}
	}
}

// checkRunOptions checks what the device manager hands the runtime for a container given two GPUs and a
// fuse slot under each strategy (with --pass-device-specs beyond envvar).
func checkRunOptions(t *T, strategy string, options *devicemanager.DeviceRunContainerOptions, gpuIDs []string) {
	env := envOf(options)
	var devices []string
	for _, d := range options.Devices {
		devices = append(devices, d.PathInContainer+"="+d.PathOnHost+":"+d.Permissions)
	}
	sort.Strings(devices)
	if !slices.Contains(devices, "/dev/fuse=/dev/fuse:rw") {
		t.Errorf("%s: devices %v lack /dev/fuse (rw)", strategy, devices)
	}
	switch strategy {
	case "envvar":
		got := strings.Split(env[envVariable], ",")
		sort.Strings(got)
		if !slices.Equal(got, gpuIDs) {
			t.Errorf("envvar: NVIDIA_VISIBLE_DEVICES is %q, want the two allocated UUIDs %v", env[envVariable], gpuIDs)
		}
	case "volume-mounts":
		if env[envVariable] != "/var/run/nvidia-container-devices" {
			t.Errorf("volume-mounts: NVIDIA_VISIBLE_DEVICES is %q, want /var/run/nvidia-container-devices", env[envVariable])
		}
		var mounts []string
		for _, m := range options.Mounts {
			mounts = append(mounts, m.ContainerPath+"="+m.HostPath)
		}
		sort.Strings(mounts)
		want := []string{"/var/run/nvidia-container-devices/" + gpuIDs[0] + "=/dev/null", "/var/run/nvidia-container-devices/" + gpuIDs[1] + "=/dev/null"}
		if !slices.Equal(mounts, want) {
			t.Errorf("volume-mounts: mounts %v, want %v", mounts, want)
		}
	case "cdi":
		var names []string
		for _, d := range options.CDIDevices {
			names = append(names, d.Name)
		}
		sort.Strings(names)
		want := []string{"k8s.gpuguard.io/gpu=" + gpuIDs[0], "k8s.gpuguard.io/gpu=" + gpuIDs[1]}
		if !slices.Equal(names, want) {
			t.Errorf("cdi: CDI devices %v, want %v", names, want)
		}
		if env[envVariable] != "void" {
			t.Errorf("cdi: NVIDIA_VISIBLE_DEVICES is %q, want void: the CDI devices alone carry the GPUs", env[envVariable])
		}
	}
	if strategy != "envvar" {
		for _, control := range []string{"/dev/nvidiactl=/dev/nvidiactl:rw", "/dev/nvidia-uvm=/dev/nvidia-uvm:rw"} {
			if !slices.Contains(devices, control) {
				t.Errorf("%s with --pass-device-specs: devices %v lack %s", strategy, devices, control)
			}
		}
	}
}

// The node enforcer's benchmark (make bench-node, not part of make e2e): the time gpuguard-node-enforcer
// adds to a container's creation through the runtime's CRI on the real node (containerd v2.4.2, or CRI-O
// with -runtime crio), measured as CRI
// CreateContainer calls with and without the enforcer registered, in the same run, alternating, and under
// 16 concurrent creates; and the enforcer's memory. It reports figures and fails only when it cannot
// measure: speed is judged in docs/benchmarks.md, not by a timed test.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

const (
	benchCreates    = 100 // per phase
	benchRounds     = 4
	benchConcurrent = 16
	benchNamespace  = "e2e-bench"
	// Pods the fake kubelet lists, as many as a node holds by default, two containers each.
	benchListedPods = 110
	podResourcesDir = "/var/lib/kubelet/pod-resources"
)

var benchmarks = []scenario{
	{"node/enforcer-create", "CRI CreateContainer through the node's runtime (containerd, or CRI-O with -runtime crio) with and without gpuguard-node-enforcer, sequential and 16 at once; its memory", benchEnforcerCreate},
	{"backstop/create", "pod creates through the API server with gpuguard installed, with and without the backstop's binding, one at a time and 8 at once", benchBackstopCreate},
	{"backstop/gpu-node-taints", "pod creates through the API server with gpuguard installed, one at a time, under the backstop as installed and as the chart renders it with webhook.gpuNodeTaints, alternating, of pods that tolerate nothing and pods that tolerate the taint", benchBackstopGpuNodeTaints},
	{"backstop/update", "pod UPDATEs through the API server with gpuguard installed, an annotation's value (judged by the backstop) and a label's (not evaluated), with and without the backstop's binding", benchBackstopUpdate},
	{"node/pod-start", "pod create to container running on the real node, with gpuguard installed and without, in turn; one at a time and 8 at once", benchPodStart},
	{"node/pod-start-parts", "pod create to container running, one at a time, with gpuguard uninstalled, installed, without its enforcer, and with nothing of it on the path: where its cost lies", benchPodStartParts},
	{"scale/scheduling", "pods bound per second over kwok GPU nodes (500 and 5,000): kube-scheduler's defaults, MostAllocated and gpuguard's extender in one run", benchScaleScheduling},
	{"scale/admission", "pod creates at 100 and 500 per second through the API server with the webhook (two replicas) and the backstop, and without: the API server's admission latency for the webhook, and the throughput", benchScaleAdmission},
	{"scale/cluster-caches", "5,000 kwok nodes and 150,000 pods bound to them: the audit's full pass, the extender's memory and prioritize latency through its watch, the webhook's claim cache", benchScaleCaches},
	{"scale/packing", "arrivals and departures to a steady state over 150 kwok GPU nodes, three ways: nodes wholly free, 8-GPU pods that fit, pods Pending while there was room", benchScalePacking},
}

// fakePodResources answers List as a kubelet with a full node would: the bench's pod and 109 others.
type fakePodResources struct {
	podresources.UnimplementedPodResourcesListerServer
	pods []*podresources.PodResources
}

func (f *fakePodResources) List(context.Context, *podresources.ListPodResourcesRequest) (*podresources.ListPodResourcesResponse, error) {
	return &podresources.ListPodResourcesResponse{PodResources: f.pods}, nil
}

func (f *fakePodResources) Get(_ context.Context, request *podresources.GetPodResourcesRequest) (*podresources.GetPodResourcesResponse, error) {
	for _, pod := range f.pods {
		if pod.Name == request.PodName && pod.Namespace == request.PodNamespace {
			return &podresources.GetPodResourcesResponse{PodResources: pod}, nil
		}
	}
	return &podresources.GetPodResourcesResponse{}, nil
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

func summarize(durations []time.Duration) string {
	sorted := slices.Clone(durations)
	slices.Sort(sorted)
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s, max %s (n=%d)", percentile(sorted, 0.5).Round(time.Microsecond),
		percentile(sorted, 0.9).Round(time.Microsecond), percentile(sorted, 0.99).Round(time.Microsecond),
		sorted[len(sorted)-1].Round(time.Microsecond), len(sorted))
}

func benchEnforcerCreate(t *T, e *Env) {
	n := e.nodeWithoutGpuguard(t)
	// The kubelet would remove a sandbox it did not make: it is stopped, and the harness serves its
	// pod-resources socket, listing the bench's pod among a full node's.
	n.kubelet.stop()
	t.must(os.MkdirAll(podResourcesDir, 0o755), "making the pod-resources directory")
	socket := filepath.Join(podResourcesDir, "kubelet.sock")
	os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	t.must(err, "listening on the pod-resources socket")
	fake := &fakePodResources{}
	for i := 0; i < benchListedPods; i++ {
		name := "bench"
		if i > 0 {
			name = "other-" + strconv.Itoa(i)
		}
		fake.pods = append(fake.pods, &podresources.PodResources{Name: name, Namespace: benchNamespace, Containers: []*podresources.ContainerResources{
			{Name: "main"}, {Name: "sidecar", Devices: []*podresources.ContainerDevices{{ResourceName: "github.com/fuse", DeviceIds: []string{"fuse-0"}}}}}})
	}
	server := grpc.NewServer()
	podresources.RegisterPodResourcesListerServer(server, fake)
	go server.Serve(listener)
	defer server.Stop()

	conn, err := grpc.NewClient("unix://"+e.nodeRuntime().socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	t.must(err, "connecting to the runtime's CRI")
	defer conn.Close()
	cri := runtimeapi.NewRuntimeServiceClient(conn)
	// A sandbox of its own for each phase, made after the phase's enforcer started, as a pod's is: the
	// enforcer fetches the kubelet's answer then, and the phase's creates are its containers.
	sandboxes := 0
	newSandbox := func() (string, *runtimeapi.PodSandboxConfig) {
		sandboxes++
		config := &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "bench", Namespace: benchNamespace, Uid: fmt.Sprintf("e2e-bench-%04d", sandboxes)},
			Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
		}
		sandbox, err := cri.RunPodSandbox(t.ctx, &runtimeapi.RunPodSandboxRequest{Config: config})
		t.must(err, "running a sandbox")
		return sandbox.PodSandboxId, config
	}
	defer func() {
		sandboxes, err := cri.ListPodSandbox(context.Background(), &runtimeapi.ListPodSandboxRequest{
			Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{}}})
		if err != nil {
			t.Errorf("listing the bench's sandboxes: %v", err)
			return
		}
		for _, sandbox := range sandboxes.Items {
			if sandbox.Metadata.Namespace != benchNamespace {
				continue
			}
			cri.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandbox.Id})
			cri.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandbox.Id})
		}
	}()
	var sandboxID string
	var sandboxConfig *runtimeapi.PodSandboxConfig

	var serial sync.Mutex
	next := 0
	// One CreateContainer of the CUDA-like image (NVIDIA_VISIBLE_DEVICES=all in its config, no GPU
	// allocated: the enforcer's adjustment every time), timed, then removed.
	create := func() (time.Duration, error) {
		serial.Lock()
		next++
		name := "main-" + strconv.Itoa(next)
		serial.Unlock()
		config := &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: name},
			// The image as a pod names it, as the kubelet sends it too: CRI-O refuses a create without it
			// ("user specified image not specified, cannot verify image signature").
			Image:   &runtimeapi.ImageSpec{Image: cudaLikeImage, UserSpecifiedImage: cudaLikeImage},
			Command: []string{"sleep", "3600"},
		}
		started := time.Now()
		created, err := cri.CreateContainer(t.ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxID, Config: config, SandboxConfig: sandboxConfig})
		took := time.Since(started)
		if err != nil {
			return took, err
		}
		_, err = cri.RemoveContainer(t.ctx, &runtimeapi.RemoveContainerRequest{ContainerId: created.ContainerId})
		return took, err
	}
	sequential := func(what string) []time.Duration {
		sandboxID, sandboxConfig = newSandbox()
		var durations []time.Duration
		for i := 0; i < benchCreates; i++ {
			took, err := create()
			t.must(err, what+": a create")
			durations = append(durations, took)
		}
		t.Logf("%s, sequential: %s", what, summarize(durations))
		return durations
	}
	concurrent := func(what string) {
		sandboxID, sandboxConfig = newSandbox()
		var mu sync.Mutex
		var durations []time.Duration
		var wg sync.WaitGroup
		var failure error
		for w := 0; w < benchConcurrent; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < benchCreates/benchConcurrent*2; i++ {
					took, err := create()
					mu.Lock()
					durations = append(durations, took)
					if err != nil && failure == nil {
						failure = err
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		t.must(failure, what+": a concurrent create")
		t.Logf("%s, %d at once: %s", what, benchConcurrent, summarize(durations))
	}

	port, err := freePort()
	t.must(err, "finding a port")
	metrics := "http://127.0.0.1:" + strconv.Itoa(port) + "/metrics"
	var enforcer *process
	startEnforcer := func() {
		enforcer, err = e.start("bench-node-enforcer", e.gpuguard("gpuguard-node-enforcer"), "--nri-socket=/var/run/nri/nri.sock",
			"--pod-resources-socket="+socket, "--metrics-address=127.0.0.1:"+strconv.Itoa(port), "--log-level=warn")
		t.must(err, "starting the enforcer")
		t.must(eventually(t.ctx, 30*time.Second, func() error {
			if err := enforcer.alive(); err != nil {
				return err
			}
			resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/readyz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/readyz: %d", resp.StatusCode)
			}
			return nil
		}), "waiting for the enforcer to register")
	}
	defer func() {
		if enforcer != nil {
			enforcer.stop()
		}
	}()

	// Alternating rounds, so that the machine's drift falls on both sides alike.
	sequential("warm-up, without the enforcer")
	var without, with []time.Duration
	for round := 1; round <= benchRounds; round++ {
		without = append(without, sequential(fmt.Sprintf("round %d, without the enforcer", round))...)
		startEnforcer()
		with = append(with, sequential(fmt.Sprintf("round %d, with the enforcer", round))...)
		if round < benchRounds {
			enforcer.stop()
		}
	}
	t.Logf("without the enforcer, all rounds: %s", summarize(without))
	t.Logf("with the enforcer, all rounds: %s", summarize(with))
	concurrent("with the enforcer")
	// The enforcer's own time per create (its histogram: from the request's arrival to its answer).
	sum, count := seriesOf(t, metrics, "gpuguard_node_enforcer_create_duration_seconds_sum"), seriesOf(t, metrics, "gpuguard_node_enforcer_create_duration_seconds_count")
	t.Logf("the enforcer's own time per create, mean over the last round and the 16 at once: %s (%v creates)",
		time.Duration(sum/count*float64(time.Second)).Round(time.Microsecond), count)
	if adjusted := seriesOf(t, metrics, `gpuguard_node_enforcer_decisions_total{action="adjust",why="enforced"}`); adjusted < benchCreates {
		t.Errorf("the enforcer adjusted %v creates of its last round, want every one: the benchmark did not measure it", adjusted)
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(enforcer.cmd.Process.Pid) + "/status")
	t.must(err, "reading the enforcer's memory")
	for _, line := range strings.Split(string(status), "\n") {
		for _, field := range []string{"VmHWM:", "VmRSS:", "RssAnon:", "RssFile:"} {
			if strings.HasPrefix(line, field) {
				t.Logf("the enforcer's %s", strings.Join(strings.Fields(line), " "))
			}
		}
	}
	enforcer.stop()
	concurrent("without the enforcer")

	median := func(d []time.Duration) time.Duration {
		sorted := slices.Clone(d)
		slices.Sort(sorted)
		return percentile(sorted, 0.5)
	}
	t.Logf("added at p50: %s (with %s, without %s)", (median(with) - median(without)).Round(time.Microsecond),
		median(with).Round(time.Microsecond), median(without).Round(time.Microsecond))
}

// seriesOf reads one sample of a Prometheus text page.
func seriesOf(t *T, url, name string) float64 {
	resp, err := http.Get(url)
	t.must(err, "reading "+url)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	t.must(err, "reading "+url)
	v := series(string(body), name)
	if v < 0 {
		t.Fatalf("%s has no %s", url, name)
	}
	return v
}

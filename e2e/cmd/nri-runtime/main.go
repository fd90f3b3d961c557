// nri-runtime is the runtime's side of NRI as containerd and CRI-O run it: NRI's own adaptation library
// (github.com/containerd/nri/pkg/adaptation, the version containerd v2.4.2 builds with), listening on a
// socket, synchronizing each plugin that registers with the containers a script says exist, then sending
// the script's CreateContainer and RemoveContainer events and printing, one JSON line each, what came back.
// gpuguard-node-enforcer's integration tests drive it: an implementation of the protocol that is not
// gpuguard's, and the decision's fixtures sent through it.
//
//	nri-runtime --socket PATH --script FILE [--required-plugins gpuguard] [--request-timeout 2s] [--runtime-name cri-o]
//	  [--runtime-version 2.2.0] [--hide-nri-version] [--cut-sync]
//
// --hide-nri-version says no NRI version in each Configure, as NRI before v0.11.0 (containerd 2.2, CRI-O
// 1.34) did; --cut-sync gives up on the first Synchronize after its first message has reached the plugin,
// as NRI does when its request timeout passes between two messages of a split one.
//
// The script: {"existing": {"pods": [PodSandbox], "containers": [Container]}, "steps": [step...][, "hold_sync": path]}, each
// step one of {"wait_plugin": seconds[, "count": plugins]}, {"run_pod": PodSandbox}, {"create": {"pod": PodSandbox, "container": Container}[, "concurrent": n]},
// {"remove": {...}}, {"sleep": seconds}, {"wait_file": path[, "seconds": limit]}; the messages in NRI's protojson.
// wait_file is how a test holds the runtime between two steps for as long as it needs, instead of for a fixed
// time: the runtime makes PATH.reached when it gets there, then waits (30 s unless told) until the test makes
// PATH, and says whether it came ("released"). A create prints the adjustment's
// env ("env"), its mounts ("mounts"), its createRuntime hooks ("create_runtime_hooks": the path, the args
// after the first, the timeout) and the container's environment after NRI's own generator applied it as
// containerd does ("final_env").
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/runtime-tools/generate"
	validator "github.com/containerd/nri/plugins/default-validator/builtin"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
)

type event struct {
	Pod       json.RawMessage `json:"pod"`
	Container json.RawMessage `json:"container"`
}

type step struct {
	WaitPlugin *float64        `json:"wait_plugin"`
	Count      int64           `json:"count"` // with wait_plugin: how many plugins (1 when not given)
	RunPod     json.RawMessage `json:"run_pod"`
	Create     *event          `json:"create"`
	Concurrent int             `json:"concurrent"` // with create: that many creates of it at once (each its own container ID)
	Remove     *event          `json:"remove"`
	Sleep      *float64        `json:"sleep"`
	WaitFile   string          `json:"wait_file"`
	Seconds    float64         `json:"seconds"` // with wait_file: how long at most (30 when not given)
}

type script struct {
	Existing struct {
		Pods       []json.RawMessage `json:"pods"`
		Containers []json.RawMessage `json:"containers"`
	} `json:"existing"`
	Steps []step `json:"steps"`
	// A wait_file's path, held at each plugin's synchronization: the plugin has registered and been
	// configured, and NRI has not yet sent it the first Synchronize message.
	HoldSync string `json:"hold_sync"`
}

// envSpec is the environment part of containerd v2.4.2's spec generator for NRI
// (internal/cri/nri/spec_generator_linux.go): a variable already in the spec has its first entry replaced
// in place. NRI's generate.Generator.AdjustEnv calls nothing else.
type envSpec struct {
	generate.UnderlyingGenerator
	spec *rspec.Spec
}

func (g *envSpec) Spec() *rspec.Spec { return g.spec }
func (g *envSpec) ClearProcessEnv()  { g.spec.Process.Env = []string{} }
func (g *envSpec) AddProcessEnv(name, value string) {
	prefix := name + "="
	for i, e := range g.spec.Process.Env {
		if strings.HasPrefix(e, prefix) {
			g.spec.Process.Env[i] = prefix + value
			return
		}
	}
	g.spec.Process.Env = append(g.spec.Process.Env, prefix+value)
}

// finalEnv is the container's environment once the adjustment's env is applied.
func finalEnv(container *api.Container, adjust *api.ContainerAdjustment) []string {
	spec := &envSpec{spec: &rspec.Spec{Process: &rspec.Process{Env: append([]string{}, container.GetEnv()...)}}}
	generate.SpecGenerator(spec).AdjustEnv(adjust.GetEnv())
	return spec.spec.Process.Env
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nri-runtime: "+format+"\n", args...)
	os.Exit(2)
}

func decode[M proto.Message](raw json.RawMessage, message M) M {
	if err := protojson.Unmarshal(raw, message); err != nil {
		fail("%v in %s", err, raw)
	}
	return message
}

func main() {
	socket := flag.String("socket", "", "the socket plugins connect to")
	scriptFile := flag.String("script", "", "the script (JSON)")
	required := flag.String("required-plugins", "", "comma-separated: NRI's default validator refuses every create while one of them is not registered")
	requestTimeout := flag.Duration("request-timeout", 2*time.Second, "how long a plugin has to answer a request")
	runtimeName := flag.String("runtime-name", "nri-runtime", "the runtime's name, as Configure tells plugins (containerd, cri-o)")
	runtimeVersion := flag.String("runtime-version", "v0.0.0", "the runtime's version, as Configure tells plugins")
	hideVersion := flag.Bool("hide-nri-version", false, "say no NRI version in Configure, as NRI before v0.11.0")
	cutSync := flag.Bool("cut-sync", false, "give up on the first Synchronize after its first message reached the plugin")
	flag.Parse()
	text, err := os.ReadFile(*scriptFile)
	if err != nil {
		fail("%v", err)
	}
	var run script
	if err := json.Unmarshal(text, &run); err != nil {
		fail("%s: %v", *scriptFile, err)
	}
	var pods []*api.PodSandbox
	for _, raw := range run.Existing.Pods {
		pods = append(pods, decode(raw, &api.PodSandbox{}))
	}
	var containers []*api.Container
	for _, raw := range run.Existing.Containers {
		containers = append(containers, decode(raw, &api.Container{}))
	}

	nri.SetPluginRequestTimeout(*requestTimeout)
	// Start synchronizes the plugins NRI launches itself (none here) once; every later call is a plugin
	// that connected and registered.
	var started atomic.Bool
	var synced atomic.Int64
	synchronize := func(ctx context.Context, cb nri.SyncCB) error {
		if run.HoldSync != "" && started.Load() {
			waitFile(run.HoldSync, 0)
		}
		_, err := cb(ctx, pods, containers)
		if err == nil && started.Load() {
			synced.Add(1)
		}
		return err
	}
	update := func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil }
	empty, err := os.MkdirTemp("", "nri-runtime-")
	if err != nil {
		fail("%v", err)
	}
	defer os.RemoveAll(empty)
	options := []nri.Option{nri.WithSocketPath(*socket), nri.WithPluginPath(empty), nri.WithPluginConfigPath(empty)}
	if *required != "" {
		options = append(options, nri.WithDefaultValidator(&validator.DefaultValidatorConfig{
			Enable: true, RequiredPlugins: strings.Split(*required, ","),
		}))
	}
	if interceptors := clientInterceptors(*hideVersion, *cutSync); len(interceptors) > 0 {
		options = append(options, nri.WithTTRPCOptions([]ttrpc.ClientOpts{ttrpc.WithChainUnaryClientInterceptor(interceptors...)}, nil))
	}
	runtime, err := nri.New(*runtimeName, *runtimeVersion, synchronize, update, options...)
	if err != nil {
		fail("%v", err)
	}
	if err := runtime.Start(); err != nil {
		fail("%v", err)
	}
	started.Store(true)
	defer runtime.Stop()
	out := json.NewEncoder(os.Stdout)
	for i, s := range run.Steps {
		result := map[string]any{"step": i}
		switch {
		case s.WaitPlugin != nil:
			deadline := time.Now().Add(time.Duration(*s.WaitPlugin * float64(time.Second)))
			for synced.Load() < max(s.Count, 1) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			result["synced"] = synced.Load()
		case s.RunPod != nil:
			if err := runtime.RunPodSandbox(context.Background(), &api.RunPodSandboxRequest{Pod: decode(s.RunPod, &api.PodSandbox{})}); err != nil {
				result["error"] = err.Error()
			}
		case s.Create != nil && s.Concurrent > 1:
			// As a kubelet starting many pods does: the runtime's creates come at once, and NRI answers them
			// one plugin call at a time. Each one's time, from the burst's start.
			started := time.Now()
			pod := decode(s.Create.Pod, &api.PodSandbox{})
			micros := make([]int64, s.Concurrent)
			errs := make([]string, s.Concurrent)
			var wg sync.WaitGroup
			for n := 0; n < s.Concurrent; n++ {
				wg.Add(1)
				go func(n int) {
					defer wg.Done()
					container := decode(s.Create.Container, &api.Container{})
					container.Id = fmt.Sprintf("%s-%d", container.Id, n)
					if _, err := runtime.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: container}); err != nil {
						errs[n] = err.Error()
					}
					micros[n] = time.Since(started).Microseconds()
				}(n)
			}
			wg.Wait()
			result["micros_each"] = micros
			result["errors"] = errs
		case s.Create != nil:
			started := time.Now()
			container := decode(s.Create.Container, &api.Container{})
			// NRI's adaptation strips the variables a plugin set from the request it passes on; containerd
			// applies the adjustment to its own spec, which still has them where they were.
			original := proto.Clone(container).(*api.Container)
			response, err := runtime.CreateContainer(context.Background(), &api.CreateContainerRequest{
				Pod: decode(s.Create.Pod, &api.PodSandbox{}), Container: container,
			})
			result["micros"] = time.Since(started).Microseconds()
			if err != nil {
				result["error"] = err.Error()
			} else {
				env := []string{}
				for _, kv := range response.GetAdjust().GetEnv() {
					env = append(env, kv.GetKey()+"="+kv.GetValue())
				}
				result["env"] = env
				mounts := []string{}
				for _, m := range response.GetAdjust().GetMounts() {
					mounts = append(mounts, strings.TrimSpace(m.GetDestination()+" "+m.GetType()+" "+strings.Join(m.GetOptions(), ",")))
				}
				result["mounts"] = mounts
				hooks := []string{}
				for _, h := range response.GetAdjust().GetHooks().GetCreateRuntime() {
					hooks = append(hooks, h.GetPath()+" "+strings.Join(h.GetArgs()[1:], " ")+fmt.Sprintf(" timeout %d", h.GetTimeout().GetValue()))
				}
				result["create_runtime_hooks"] = hooks
				result["final_env"] = finalEnv(original, response.GetAdjust())
			}
		case s.Remove != nil:
			err := runtime.RemoveContainer(context.Background(), &api.RemoveContainerRequest{
				Pod: decode(s.Remove.Pod, &api.PodSandbox{}), Container: decode(s.Remove.Container, &api.Container{}),
			})
			if err != nil {
				result["error"] = err.Error()
			}
		case s.Sleep != nil:
			time.Sleep(time.Duration(*s.Sleep * float64(time.Second)))
		case s.WaitFile != "":
			result["released"] = waitFile(s.WaitFile, s.Seconds)
		default:
			fail("step %d: nothing to do", i)
		}
		if err := out.Encode(result); err != nil {
			fail("%v", err)
		}
	}
}

// clientInterceptors change what NRI's library sends each plugin, for --hide-nri-version and --cut-sync.
func clientInterceptors(hideVersion, cutSync bool) []ttrpc.UnaryClientInterceptor {
	var interceptors []ttrpc.UnaryClientInterceptor
	if hideVersion {
		interceptors = append(interceptors, func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
			if strings.HasSuffix(info.FullMethod, "/Configure") {
				configure := &api.ConfigureRequest{}
				if err := proto.Unmarshal(req.Payload, configure); err != nil {
					return err
				}
				configure.NRIVersion = ""
				payload, err := proto.Marshal(configure)
				if err != nil {
					return err
				}
				req.Payload = payload
			}
			return invoke(ctx, req, resp)
		})
	}
	if cutSync {
		// Synchronize messages the plugin answered since its Configure (every connection is configured first),
		// and whether the one Synchronize given up on has been.
		var answered atomic.Int64
		var cut atomic.Bool
		interceptors = append(interceptors, func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
			sync := strings.HasSuffix(info.FullMethod, "/Synchronize")
			if strings.HasSuffix(info.FullMethod, "/Configure") {
				answered.Store(0)
			} else if sync && answered.Load() > 0 && cut.CompareAndSwap(false, true) {
				return context.DeadlineExceeded
			}
			err := invoke(ctx, req, resp)
			if sync && err == nil {
				answered.Add(1)
			}
			return err
		})
	}
	return interceptors
}

// waitFile says it has reached the step (PATH.reached), then waits until PATH exists or the limit passes.
func waitFile(path string, seconds float64) bool {
	if seconds <= 0 {
		seconds = 30
	}
	if err := os.WriteFile(path+".reached", nil, 0o644); err != nil {
		fail("wait_file: %v", err)
	}
	deadline := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

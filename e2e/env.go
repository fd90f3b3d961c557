// What every scenario shares: the run's configuration, the working directory, the lazily started control
// plane and webhook installation, child processes, and the small test vocabulary (T).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type Config struct {
	Components string
	// ControlPlane, when set, holds another minor's kube-apiserver, kube-controller-manager and
	// kube-scheduler (make e2e K8S=1.30), used instead of those in Components.
	ControlPlane string
	Gpuguard     string
	Source       string
	// Peers, when set, holds what scripts/build-peers built: NVIDIA's device plugin and DRA kubelet plugin.
	Peers string
	// Runtime is the real node's container runtime: containerd (the default) or crio, built with the peers.
	Runtime string
	Work    string
	Keep    bool
}

func (c *Config) validate() error {
	for flagName, dir := range map[string]*string{"-components": &c.Components, "-gpuguard": &c.Gpuguard, "-source": &c.Source} {
		if *dir == "" {
			return fmt.Errorf("%s is required (see -h)", flagName)
		}
		abs, err := filepath.Abs(*dir)
		if err != nil {
			return err
		}
		*dir = abs
	}
	if c.Peers != "" {
		abs, err := filepath.Abs(c.Peers)
		if err != nil {
			return err
		}
		c.Peers = abs
		for _, peer := range []string{"nvidia-device-plugin", "gpu-kubelet-plugin"} {
			if _, err := os.Stat(filepath.Join(c.Peers, peer)); err != nil {
				return fmt.Errorf("-peers: %w (make e2e E2E_PEERS=../shared/peers builds it)", err)
			}
		}
	}
	switch c.Runtime {
	case runtimeContainerd:
	case runtimeCRIO:
		if c.Peers == "" {
			return fmt.Errorf("-runtime crio: CRI-O is built with the peers; give -peers (make e2e E2E_RUNTIME=crio E2E_PEERS=../shared/peers)")
		}
		for _, path := range []string{filepath.Join(c.Peers, "crio"), filepath.Join(c.Peers, "pinns"), filepath.Join(c.Peers, "crio-import"), "/usr/bin/conmon"} {
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("-runtime crio: %w (scripts/build-peers builds CRI-O; scripts/install-deps.sh installs conmon)", err)
			}
		}
	default:
		return fmt.Errorf("-runtime %q: containerd or crio", c.Runtime)
	}
	if c.ControlPlane != "" {
		abs, err := filepath.Abs(c.ControlPlane)
		if err != nil {
			return err
		}
		c.ControlPlane = abs
		for _, name := range controlPlaneComponents {
			if _, err := os.Stat(filepath.Join(c.ControlPlane, name)); err != nil {
				return fmt.Errorf("missing %s (make e2e K8S=<minor> builds it)", filepath.Join(c.ControlPlane, name))
			}
		}
	}
	for _, path := range []string{
		filepath.Join(c.Components, "etcd"), filepath.Join(c.Components, "kube-apiserver"),
		filepath.Join(c.Components, "kube-controller-manager"), filepath.Join(c.Components, "kube-scheduler"),
		filepath.Join(c.Components, "kustomize"), filepath.Join(c.Components, "helm"), filepath.Join(c.Components, "kubectl"),
		filepath.Join(c.Components, "kubelet"), filepath.Join(c.Components, "containerd"),
		filepath.Join(c.Components, "containerd-shim-runc-v2"), filepath.Join(c.Components, "ctr"),
		filepath.Join(c.Components, "nvidia-container-runtime"), filepath.Join(c.Components, "nvidia-cdi-hook"),
		filepath.Join(c.Components, "pause"),
		filepath.Join(c.Components, "mps-stand-in"),
		filepath.Join(c.Gpuguard, "gpuguard-webhook"),
		filepath.Join(c.Gpuguard, "gpuguard-scheduler-extender"), filepath.Join(c.Gpuguard, "gpuguard-device-plugin"),
		filepath.Join(c.Gpuguard, "gpuguard-node-enforcer"), filepath.Join(c.Gpuguard, "gpuguard-mask-check"),
		filepath.Join(c.Source, "manifests", "default", "kustomization.yaml"),
	} {
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("missing %s (make e2e builds it)", path)
		}
	}
	return nil
}

type Env struct {
	ctx  context.Context
	cfg  Config
	work string
	keep bool

	mu          sync.Mutex
	processes   []*process
	cluster     *Cluster
	install     *webhookInstall
	node        *Node
	nodeFailure error // why the node did not start, for the scenarios after the first
}

func newEnv(ctx context.Context, cfg Config) (*Env, error) {
	work := cfg.Work
	if work == "" {
		var err error
		if work, err = os.MkdirTemp("", "gpuguard-e2e-"); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(work, "logs"), 0o755); err != nil {
		return nil, err
	}
	// The webhook and the extender are reached on 127.0.0.1; a proxy in the environment must not be used.
	os.Setenv("NO_PROXY", "127.0.0.1,localhost")
	os.Setenv("no_proxy", "127.0.0.1,localhost")
	return &Env{ctx: ctx, cfg: cfg, work: work, keep: cfg.Keep}, nil
}

// Close stops every process still running, control plane last, and removes the working directory unless
// it is to be kept.
func (e *Env) Close() {
	e.mu.Lock()
	processes := e.processes
	e.processes = nil
	e.mu.Unlock()
	for i := len(processes) - 1; i >= 0; i-- {
		processes[i].stop()
	}
	if !e.keep {
		// What the runtime left mounted under the working directory (CRI-O's storage) would keep its mount
		// points from being removed, and leave them behind once the run's mount namespace is gone.
		if err := unmountUnder(e.work + "/"); err != nil {
			fmt.Fprintf(os.Stderr, "gpuguard-e2e: %v\n", err)
		}
		os.RemoveAll(e.work)
	}
}

// unmountUnder detaches every mount of this process's mount namespace under one of the directories (each
// ending in "/"), deepest first, so that nothing is left mounted on what is unmounted.
func unmountUnder(dirs ...string) error {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("reading the mounts: %w", err)
	}
	var points []string
	for _, line := range strings.Split(string(mountinfo), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		for _, under := range dirs {
			if strings.HasPrefix(fields[4], under) {
				points = append(points, fields[4])
			}
		}
	}
	slices.SortFunc(points, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var failed []error
	for _, point := range points {
		if err := syscall.Unmount(point, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
			failed = append(failed, fmt.Errorf("unmounting %s: %w", point, err))
		}
	}
	return errors.Join(failed...)
}

func (e *Env) path(parts ...string) string {
	return filepath.Join(append([]string{e.work}, parts...)...)
}

// The programs that -control-plane replaces.
var controlPlaneComponents = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

func (e *Env) component(name string) string {
	if e.cfg.ControlPlane != "" && slices.Contains(controlPlaneComponents, name) {
		return filepath.Join(e.cfg.ControlPlane, name)
	}
	return filepath.Join(e.cfg.Components, name)
}
func (e *Env) gpuguard(name string) string { return filepath.Join(e.cfg.Gpuguard, name) }
func (e *Env) peer(name string) string     { return filepath.Join(e.cfg.Peers, name) }
func (e *Env) source(parts ...string) string {
	return filepath.Join(append([]string{e.cfg.Source}, parts...)...)
}

// T collects a scenario's failures; Fatalf also ends the scenario.
type T struct {
	ctx      context.Context
	name     string
	failures []string
	notes    []string
}

type fatal struct{}

func (t *T) Errorf(format string, args ...any) {
	t.failures = append(t.failures, fmt.Sprintf(format, args...))
}

func (t *T) Fatalf(format string, args ...any) {
	t.Errorf(format, args...)
	panic(fatal{})
}

// Logf records a note that is printed only when the scenario fails.
func (t *T) Logf(format string, args ...any) {
	t.notes = append(t.notes, fmt.Sprintf(format, args...))
}

func (t *T) failed() bool { return len(t.failures) > 0 }

// must ends the scenario on an error, naming the step.
func (t *T) must(err error, step string) {
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
}

func runScenario(ctx context.Context, e *Env, s scenario) (t *T) {
	t = &T{ctx: ctx, name: s.name}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(fatal); !ok {
				t.Errorf("panic: %v", r)
			}
		}
	}()
	s.run(t, e)
	return t
}

// eventually calls check until it returns nil or the timeout passes; the last error is returned.
func eventually(ctx context.Context, timeout time.Duration, check func() error) error {
	return eventuallyEvery(ctx, timeout, 200*time.Millisecond, check)
}

// eventuallyEvery is eventually with another pause between checks.
func eventuallyEvery(ctx context.Context, timeout, every time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}

// freePort finds a port free on every address, below the kernel's ephemeral range. A port from that
// range (what port 0 gives) can be taken as the source port of any connection made before the server that
// was to listen on it has started; with the audit's replicas and the control plane connecting all the
// time, that happened (a node's apiserver: "bind: address already in use"). Each port is handed out once.
func freePort() (int, error) {
	low := 32768
	if text, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if fields := strings.Fields(string(text)); len(fields) == 2 {
			if n, err := strconv.Atoi(fields[0]); err == nil && n > 11000 {
				low = n
			}
		}
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	for tries := 0; tries < 1000; tries++ {
		port := 10000 + rand.IntN(low-10000)
		if portsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		portsGiven[port] = true
		return port, nil
	}
	return 0, errors.New("no free port below the ephemeral range after 1000 tries")
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

func mustFreePort(t *T) int {
	port, err := freePort()
	t.must(err, "finding a free port")
	return port
}

// process is a child the run started; its output goes to logs/<name>.log.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (e *Env) start(name, binary string, args ...string) (*process, error) {
	return e.startWithEnv(name, binary, nil, args...)
}

// startWithEnv starts a child with NAME=value entries added to the harness's environment.
func (e *Env) startWithEnv(name, binary string, env []string, args ...string) (*process, error) {
	log, err := os.OpenFile(e.path("logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "--- %s %s %s\n", time.Now().Format(time.RFC3339), binary, strings.Join(args, " "))
	cmd := exec.Command(binary, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	// A child must not outlive the harness, even when the harness is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	e.mu.Lock()
	e.processes = append(e.processes, p)
	e.mu.Unlock()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits up to 30 s (the webhook drains for a few seconds), then kills.
func (p *process) stop() {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

var errExited = errors.New("exited")

// scrape reads one series' integer value from a Prometheus text endpoint.
func scrape(client *http.Client, url, series string) (int, error) {
	value, err := scrapeFloat(client, url, series)
	if err == nil && value != math.Trunc(value) {
		err = fmt.Errorf("%s is %v in %s, not a whole number", series, value, url)
	}
	return int(value), err
}

// scrapeFloat reads one series' value from a Prometheus text endpoint.
func scrapeFloat(client *http.Client, url, series string) (float64, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0, fmt.Errorf("no %s in %s", series, url)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// alive fails once the process has exited, so that waits on it end at once with its log's name.
func (p *process) alive() error {
	if p.exited() {
		return fmt.Errorf("%s %w (%v); see logs/%s.log", p.name, errExited, p.err, p.name)
	}
	return nil
}

// The pod-start benchmark (make bench-pod-start, not part of make e2e): the time from a pod's create to
// its container running on the real node, as a user sees it, with gpuguard installed by Helm (the
// webhook and the backstop on the create's path, the node enforcer on the container's) and without it,
// installed and uninstalled in turn in one run. The pod is the CUDA-like image asking for no GPU, so
// NVIDIA's runtime handles it either way: all GPUs without gpuguard, the CDI device none with it. Each
// phase starts its pods one at a time and then 8 at once, each deleted once it runs (the kubelet holds
// at most 110 pods). It reports figures and fails only when it cannot measure.
package main

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

const (
	podStartNamespace  = "e2e-bench-start"
	podStartPods       = 100 // per phase, one at a time, and again 8 at once
	podStartRounds     = 2   // phases each way, alternating
	podStartConcurrent = 8
)

// podStarter creates the bench's pods and times each from its create to its container running.
type podStarter struct {
	t       *T
	client  kubernetes.Interface
	pods    typedcorev1.PodInterface
	mu      sync.Mutex
	waiting map[string]chan struct{} // by pod name, closed when its container runs
	made    int
}

// newPodStarter watches the bench's namespace on the node's cluster; stop ends the watch.
func newPodStarter(t *T, n *Node) (starter *podStarter, stop func()) {
	c := n.cluster
	c.namespace(t, podStartNamespace, nil)
	unlimited := rest.CopyConfig(c.config)
	unlimited.QPS = -1 // client-go's limiter would be part of what is measured
	client, err := kubernetes.NewForConfig(unlimited)
	t.must(err, "making a client without a rate limit")
	s := &podStarter{t: t, client: client, pods: client.CoreV1().Pods(podStartNamespace), waiting: map[string]chan struct{}{}}
	// One watch over the namespace tells each waiting create when its container runs.
	watcher, err := s.pods.Watch(t.ctx, metav1.ListOptions{})
	t.must(err, "watching the bench's pods")
	go func() {
		for event := range watcher.ResultChan() {
			pod, ok := event.Object.(*corev1.Pod)
			if !ok || event.Type == watch.Deleted {
				continue
			}
			for _, status := range pod.Status.ContainerStatuses {
				if status.State.Running == nil {
					continue
				}
				s.mu.Lock()
				if ready, found := s.waiting[pod.Name]; found {
					close(ready)
					delete(s.waiting, pod.Name)
				}
				s.mu.Unlock()
			}
		}
	}()
	return s, watcher.Stop
}

// start creates one pod, waits for its container to run, deletes it, and returns how long it took.
func (s *podStarter) start() (time.Duration, error) {
	s.mu.Lock()
	s.made++
	name := fmt.Sprintf("start-%05d", s.made)
	ready := make(chan struct{})
	s.waiting[name] = ready
	s.mu.Unlock()
	began := time.Now()
	if _, err := s.pods.Create(s.t.ctx, cudaPod(name), metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	select {
	case <-ready:
	case <-time.After(2 * time.Minute):
		return 0, fmt.Errorf("pod %s did not run within 2 minutes", name)
	}
	took := time.Since(began)
	if err := s.pods.Delete(s.t.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		return 0, err
	}
	return took, nil
}

// oneAtATime starts count pods in turn, then waits until they are gone, so what follows starts on an
// empty node.
func (s *podStarter) oneAtATime(count int) []time.Duration {
	var took []time.Duration
	for i := 0; i < count; i++ {
		d, err := s.start()
		s.t.must(err, "starting a pod")
		took = append(took, d)
	}
	waitForNoPods(s.t, s.client, podStartNamespace)
	return took
}

// atOnce starts count pods with `workers` creates under way at once, then waits until they are gone.
func (s *podStarter) atOnce(count, workers int) []time.Duration {
	var took []time.Duration
	var wg sync.WaitGroup
	var times sync.Mutex
	failed := make(chan error, workers)
	for worker := 0; worker < workers; worker++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < count/workers; i++ {
				d, err := s.start()
				if err != nil {
					failed <- err
					return
				}
				times.Lock()
				took = append(took, d)
				times.Unlock()
			}
		}()
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		s.t.Fatalf("starting pods %d at once: %v", workers, err)
	}
	waitForNoPods(s.t, s.client, podStartNamespace)
	return took
}

func benchPodStart(t *T, e *Env) {
	n := e.nodeWithoutGpuguard(t)
	starter, stop := newPodStarter(t, n)
	defer stop()
	type phase struct{ sequential, concurrent []time.Duration }
	measure := func(p *phase) {
		p.sequential = append(p.sequential, starter.oneAtATime(podStartPods)...)
		p.concurrent = append(p.concurrent, starter.atOnce(podStartPods, podStartConcurrent)...)
	}

	var with, without phase
	var enforcerSeconds, enforcerCreates float64 // the enforcer's own time, from its histogram
	for round := 1; round <= podStartRounds; round++ {
		measure(&without)
		n.installForPodStart(t, e)
		measure(&with)
		page, err := n.enforcerMetrics(t)
		t.must(err, "reading the node enforcer's metrics")
		enforcerSeconds += series(page, "gpuguard_node_enforcer_create_duration_seconds_sum")
		enforcerCreates += series(page, "gpuguard_node_enforcer_create_duration_seconds_count")
		n.uninstallForPodStart(t, e)
	}
	if enforcerCreates > 0 {
		t.Logf("the node enforcer's own time per container create, mean: %.0f µs over %.0f creates",
			1e6*enforcerSeconds/enforcerCreates, enforcerCreates)
	}
	for _, mode := range []struct {
		name          string
		with, without []time.Duration
	}{{"one at a time", with.sequential, without.sequential}, {fmt.Sprintf("%d at once", podStartConcurrent), with.concurrent, without.concurrent}} {
		t.Logf("%s, without gpuguard: %s", mode.name, summarize(mode.without))
		t.Logf("%s, with gpuguard:    %s", mode.name, summarize(mode.with))
		t.Logf("%s: p50 with/without %.3f, p99 with/without %.3f", mode.name,
			ratio(mode.with, mode.without, 0.5), ratio(mode.with, mode.without, 0.99))
	}
}

// benchPodStartParts places gpuguard's cost to a pod's start, one pod at a time, among its parts: each
// round measures gpuguard uninstalled, installed, installed with the node enforcer kept off the node,
// and with the webhook configuration and the backstop's binding deleted too (gpuguard's pods run and
// its device plugin is registered, but nothing of it is on a create's path, and the container gets
// the image's all). A control: gpuguard uninstalled and as many other idle pods running as gpuguard
// runs on the node. The second round runs them in the reverse order, so a drift of the machine weighs on
// each alike. The CPU each command used over each part's pods says where the time went.
func benchPodStartParts(t *T, e *Env) {
	n := e.nodeWithoutGpuguard(t)
	starter, stop := newPodStarter(t, n)
	defer stop()
	const (
		without = iota
		otherPods
		full
		noEnforcer
		nothingOnPath
		parts
	)
	names := [parts]string{"without gpuguard", "as many other pods", "gpuguard installed", "without the enforcer", "nothing on the path"}
	var took [parts][]time.Duration
	var cpu [parts]map[string]time.Duration // CPU time by command over each part's pods
	measure := func(part int) {
		before := cpuByCommand()
		took[part] = append(took[part], starter.oneAtATime(podStartPods)...)
		if cpu[part] == nil {
			cpu[part] = map[string]time.Duration{}
		}
		for command, used := range cpuByCommand() {
			cpu[part][command] += used - before[command]
		}
	}
	// The control's pods: idle pods of the bench's image, as many as gpuguard's on the node.
	const idleNamespace = "e2e-bench-idle"
	n.cluster.namespace(t, idleNamespace, nil)
	gpuguardPods := 0
	countGpuguardPods := func() {
		pods, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{})
		t.must(err, "listing gpuguard's pods")
		gpuguardPods = len(pods.Items)
	}
	withOtherPods := func() {
		for i := 0; i < gpuguardPods; i++ {
			n.runPodIn(t, idleNamespace, cudaPod(fmt.Sprintf("idle-%d", i)))
		}
		measure(otherPods)
		t.must(n.cluster.client.CoreV1().Pods(idleNamespace).DeleteCollection(t.ctx,
			metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}, metav1.ListOptions{}), "deleting the idle pods")
		waitForNoPods(t, n.cluster.client, idleNamespace)
	}

	// Round 1: without, full, no enforcer, nothing on the path, then the control.
	measure(without)
	n.installForPodStart(t, e)
	countGpuguardPods()
	measure(full)
	enforcerBack := n.withoutEnforcer(t)
	measure(noEnforcer)
	admissionBack := n.bypassAdmission(t)
	measure(nothingOnPath)
	admissionBack()
	enforcerBack()
	n.uninstallForPodStart(t, e)
	withOtherPods()
	// Round 2, reversed.
	withOtherPods()
	n.installForPodStart(t, e)
	enforcerBack = n.withoutEnforcer(t)
	admissionBack = n.bypassAdmission(t)
	measure(nothingOnPath)
	admissionBack()
	measure(noEnforcer)
	enforcerBack()
	measure(full)
	n.uninstallForPodStart(t, e)
	measure(without)

	t.Logf("gpuguard's pods on the node, and the control's: %d", gpuguardPods)
	for part := range parts {
		t.Logf("one at a time, %-22s %s; p50 over without gpuguard's %.4f", names[part]+":", summarize(took[part]),
			ratio(took[part], took[without], 0.5))
	}
	// Where the CPU went, per pod, in each part: the commands that used over 1 ms a pod in any part.
	commands := map[string]bool{}
	for part := range parts {
		for command, used := range cpu[part] {
			if used > time.Duration(len(took[part]))*time.Millisecond {
				commands[command] = true
			}
		}
	}
	for _, command := range slices.Sorted(maps.Keys(commands)) {
		line := fmt.Sprintf("CPU a pod, %-18s", command+":")
		for part := range parts {
			line += fmt.Sprintf("  %s %6.2f ms", names[part], float64(cpu[part][command])/float64(time.Millisecond)/float64(len(took[part])))
		}
		t.Logf("%s", line)
	}
}

// cpuByCommand sums the user and system CPU time of every process alive now by its command name, with
// what it has reaped of its children (a shim's runc, say): processes that came and went between two
// calls are counted in their parent's share, or not at all.
func cpuByCommand() map[string]time.Duration {
	const tick = 10 * time.Millisecond // USER_HZ
	used := map[string]time.Duration{}
	entries, _ := os.ReadDir("/proc")
	for _, entry := range entries {
		if entry.Name()[0] < '0' || entry.Name()[0] > '9' {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", entry.Name(), "stat"))
		if err != nil {
			continue
		}
		open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(string(stat[end+1:])) // from the state on: utime is the 12th, cutime the 14th
		if len(fields) < 15 {
			continue
		}
		var ticks int64
		for _, i := range []int{11, 12, 13, 14} {
			n, _ := strconv.ParseInt(fields[i], 10, 64)
			ticks += n
		}
		used[string(stat[open+1:end])] += time.Duration(ticks) * tick
	}
	return used
}

// cpuPerUnit says, for each command, the CPU milliseconds it spent between two cpuByCommand reads per unit
// of work (a pod bound, a create), in the order given.
func cpuPerUnit(before, after map[string]time.Duration, units int, commands ...string) string {
	spent := make([]string, 0, len(commands))
	for _, command := range commands {
		spent = append(spent, fmt.Sprintf("%s %.2f", command, ms(after[command]-before[command])/float64(max(units, 1))))
	}
	return strings.Join(spent, ", ")
}

// installForPodStart installs gpuguard with Helm and waits until its enforcer is registered.
func (n *Node) installForPodStart(t *T, e *Env) {
	e.gpuguardFor(t)
	n.waitForEnforcerRegistered(t)
}

// uninstallForPodStart uninstalls gpuguard and waits until its pods are gone and no webhook patches
// creates.
func (n *Node) uninstallForPodStart(t *T, e *Env) {
	n.helm(t, e, "uninstall")
	n.installed = false
	waitForNoPods(t, n.cluster.client, gpuguardNamespace)
	n.waitUntilValue(t, "unset", time.Minute)
}

// waitForNoPods waits until the namespace holds no pod.
func waitForNoPods(t *T, client kubernetes.Interface, namespace string) {
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		left, err := client.CoreV1().Pods(namespace).List(t.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(left.Items) != 0 {
			return fmt.Errorf("%d pods remain in %s", len(left.Items), namespace)
		}
		return nil
	}), "waiting for the pods of "+namespace+" to go")
}

// ratio is the p-th percentile of a over that of b.
func ratio(a, b []time.Duration, p float64) float64 {
	return float64(percentileOf(a, p)) / float64(percentileOf(b, p))
}

func percentileOf(durations []time.Duration, p float64) time.Duration {
	sorted := slices.Clone(durations)
	slices.Sort(sorted)
	return percentile(sorted, p)
}

// make bench-scale (not part of make e2e): kube-scheduler over kwok GPU nodes (scale.go), three ways in
// one run — its defaults, the native MostAllocated profile (native-most-allocated.yaml) and gpuguard's
// extender (scheduler-config.yaml) — for the two things users choose between them by:
//   - throughput: pods bound per second, all created before the scheduler starts, at 500 and 5,000 nodes;
//   - packing: arrivals and departures to a steady state, then the nodes wholly free, the 8-GPU pods that
//     still fit, and the pods that went Pending while the cluster had room in total.
//
// It reports figures and fails only when it cannot measure: docs/benchmarks.md and docs/scheduler.md
// judge them, each beside its peers from the same run.
package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// The scheduling ways, each a KubeSchedulerConfiguration (nil: the defaults) and whether the extender
// is the one to wait for.
type schedulingWay struct {
	name   string
	config func() map[string]any
}

func schedulingWays(t *T, e *Env, extender *runningExtender) []schedulingWay {
	return []schedulingWay{
		{"default", func() map[string]any { return nil }},
		{"most-allocated", func() map[string]any { return shippedSchedulerConfig(t, e, "native-most-allocated.yaml") }},
		{"extender", func() map[string]any { return shippedExtenderConfig(t, e, extender) }},
	}
}

// The GPU pods' sizes: 1, 2, 4 and 8 GPUs, four, three, two and one in ten.
func workloadSizes(n int, seed uint64) []int {
	r := rand.New(rand.NewPCG(seed, seed))
	sizes := make([]int, n)
	for i := range sizes {
		switch k := r.IntN(10); {
		case k < 4:
			sizes[i] = 1
		case k < 7:
			sizes[i] = 2
		case k < 9:
			sizes[i] = 4
		default:
			sizes[i] = 8
		}
	}
	return sizes
}

// Environment knobs, so that a quicker run can be asked for: SCALE_NODES (comma-separated, default
// 500,5000), SCALE_PODS (GPU pods per throughput run, default 1000, as many GPU-less beside them),
// SCALE_PACKING_NODES (default 150) and SCALE_ARRIVALS (default 1200).
func envInts(name string, fallback []int) []int {
	text := os.Getenv(name)
	if text == "" {
		return fallback
	}
	var values []int
	for _, field := range strings.Split(text, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "%s=%q: not a list of positive numbers; using %v\n", name, text, fallback)
			return fallback
		}
		values = append(values, n)
	}
	return values
}

func benchScaleScheduling(t *T, e *Env) {
	for _, nodes := range envInts("SCALE_NODES", []int{500, 5000}) {
		s := e.startScaleCluster(t, fmt.Sprintf("scale-%d", nodes))
		s.namespace(t, gpuguardNamespace, nil)
		s.namespace(t, scaleNamespace, nil)
		started := time.Now()
		s.addNodes(t, nodes, nodes/10)
		t.Logf("%d GPU nodes and %d CPU nodes created and made Ready by kwok in %.1f s", nodes, nodes/10, time.Since(started).Seconds())
		gpuPods := envInts("SCALE_PODS", []int{1000})[0]
		sizes := workloadSizes(gpuPods, 1)
		var rates []float64
		// The extender runs only for its own way: its watch of every pod costs CPU the other ways would
		// otherwise pay on this small machine.
		extender := &runningExtender{}
		for _, way := range schedulingWays(t, e, extender) {
			var running *runningExtender
			if way.name == "extender" {
				*extender = *startExtender(t, e, s.Cluster)
				running = extender
			}
			rate := s.throughput(t, e, way, sizes, running)
			rates = append(rates, rate)
			t.Logf("throughput at %d nodes, %s: %.1f pods bound per second (%d GPU pods, %d GPU-less)", nodes, way.name, rate, gpuPods, gpuPods)
		}
		t.Logf("throughput at %d nodes against the default scheduler: most-allocated %.2f, extender %.2f", nodes, rates[1]/rates[0], rates[2]/rates[0])
		extender.process.stop()
		s.stop()
	}
}

// throughput creates the workload with no scheduler running, then starts one and times the bindings
// from the first to the last, read from a watch.
func (s *scaleCluster) throughput(t *T, e *Env, way schedulingWay, sizes []int, extender *runningExtender) float64 {
	pods := s.bulk.CoreV1().Pods(scaleNamespace)
	t.must(inParallel(2*len(sizes), func(i int) error {
		var pod *corev1.Pod
		if i < len(sizes) {
			pod = scalePod(fmt.Sprintf("gpu-%05d-x%d", i, sizes[i]), sizes[i])
		} else {
			pod = scalePod(fmt.Sprintf("cpu-%05d", i-len(sizes)), 0)
		}
		_, err := pods.Create(t.ctx, pod, metav1.CreateOptions{})
		return err
	}), "creating the workload")
	list, err := pods.List(t.ctx, metav1.ListOptions{})
	t.must(err, "listing the workload")
	// The API server ends a watch that falls behind a burst (its cacher's buffer); it is resumed from
	// the last version seen, so that no binding is missed.
	version := list.ResourceVersion
	watcher, err := pods.Watch(t.ctx, metav1.ListOptions{ResourceVersion: version})
	t.must(err, "watching the workload")
	defer func() { watcher.Stop() }()

	cpuBefore := cpuByCommand()
	scheduler := s.startScheduler(t, e, way.name, way.config())
	bound := map[string]bool{}
	var first, last time.Time
	deadline := time.After(10 * time.Minute)
	for len(bound) < 2*len(sizes) {
		select {
		case event, open := <-watcher.ResultChan():
			if !open {
				watcher, err = pods.Watch(t.ctx, metav1.ListOptions{ResourceVersion: version})
				t.must(err, fmt.Sprintf("%s: resuming the watch after %d bindings", way.name, len(bound)))
				continue
			}
			if event.Type == watch.Error { // the version is gone too: list what is bound now, and go on from there
				watcher.Stop()
				list, err := pods.List(t.ctx, metav1.ListOptions{})
				t.must(err, "listing the workload again")
				for _, pod := range list.Items {
					if pod.Spec.NodeName != "" && !bound[pod.Name] {
						bound[pod.Name] = true
						if first.IsZero() {
							first = time.Now()
						}
						last = time.Now()
					}
				}
				version = list.ResourceVersion
				watcher, err = pods.Watch(t.ctx, metav1.ListOptions{ResourceVersion: version})
				t.must(err, "watching the workload again")
				continue
			}
			pod, ok := event.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			version = pod.ResourceVersion
			if event.Type != watch.Modified || pod.Spec.NodeName == "" || bound[pod.Name] {
				continue
			}
			bound[pod.Name] = true
			if first.IsZero() {
				first = time.Now()
			}
			last = time.Now()
		case <-deadline:
			t.Fatalf("%s: %d of %d pods bound in 10 minutes", way.name, len(bound), 2*len(sizes))
		}
	}
	cpuAfter := cpuByCommand()
	scheduler.stop()
	t.Logf("CPU ms per pod bound, %s (from the scheduler's start to the last binding): %s", way.name,
		cpuPerUnit(cpuBefore, cpuAfter, len(bound), "kube-scheduler", "gpuguard-schedu", "kube-apiserver", "etcd", "kwok"))
	deletePods(t, s.bulk, scaleNamespace, extender)
	return float64(len(bound)-1) / last.Sub(first).Seconds()
}

// promptly is eventually at a 5 ms pace: a packing run waits for about 2,000 bindings and deletions one
// after the other, and eventually's 200 ms between checks would be most of its time.
func promptly(t *T, timeout time.Duration, check func() error) error {
	return eventuallyEvery(t.ctx, timeout, 5*time.Millisecond, check)
}

// packingResult is what a steady state leaves.
type packingResult struct {
	wholeFree, eightGPUFits, pendingWithRoom, pendingAtAll, arrivals int
}

func benchScalePacking(t *T, e *Env) {
	nodes := envInts("SCALE_PACKING_NODES", []int{150})[0]
	arrivals := envInts("SCALE_ARRIVALS", []int{1200})[0]
	s := e.startScaleCluster(t, fmt.Sprintf("scale-packing-%d", nodes))
	defer s.stop()
	s.namespace(t, gpuguardNamespace, nil)
	s.namespace(t, scaleNamespace, nil)
	gpuNames := s.addNodes(t, nodes, 0)
	extender := startExtender(t, e, s.Cluster)
	defer extender.process.stop()
	for _, way := range schedulingWays(t, e, extender) {
		var wait *runningExtender
		if way.name == "extender" {
			wait = extender
		}
		r := s.packing(t, e, way, gpuNames, arrivals, wait)
		t.Logf("packing at %d nodes after %d arrivals, %s: %d nodes wholly free, %d 8-GPU pods still fit, %d pods Pending while the cluster had room in total (%d Pending at all)",
			nodes, r.arrivals, way.name, r.wholeFree, r.eightGPUFits, r.pendingWithRoom, r.pendingAtAll)
	}
}

// packing runs one way's steady state: the same seeded arrivals for every way, each pod created once the
// last is placed, and departures (a seeded choice among the live pods) whenever the GPUs in use pass 85 %
// of the cluster's. A pod that goes Pending is counted and withdrawn, as a job that gives up would be.
func (s *scaleCluster) packing(t *T, e *Env, way schedulingWay, gpuNodes []string, arrivals int, extender *runningExtender) packingResult {
	pods := s.bulk.CoreV1().Pods(scaleNamespace)
	scheduler := s.startScheduler(t, e, "packing-"+way.name, way.config())
	defer scheduler.stop()
	sizes := workloadSizes(arrivals, 2)
	departures := rand.New(rand.NewPCG(3, 3))
	capacity := len(gpuNodes) * gpusPerNode
	type livePod struct {
		name string
		gpus int
	}
	var live []livePod
	inUse, result := 0, packingResult{arrivals: arrivals}
	remove := func(name string) {
		err := pods.Delete(t.ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.must(err, "deleting pod "+name)
		}
		t.must(promptly(t, time.Minute, func() error {
			_, err := pods.Get(t.ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("pod %s is still there (%v)", name, err)
		}), "waiting for pod "+name+" to go")
	}
	for i, gpus := range sizes {
		name := fmt.Sprintf("pack-%s-%05d-x%d", way.name, i, gpus)
		_, err := pods.Create(t.ctx, scalePod(name, gpus), metav1.CreateOptions{})
		t.must(err, "creating pod "+name)
		placed := false
		t.must(promptly(t, time.Minute, func() error {
			if err := scheduler.alive(); err != nil {
				return err
			}
			pod, err := pods.Get(t.ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if pod.Spec.NodeName != "" {
				placed = true
				return nil
			}
			for _, condition := range pod.Status.Conditions {
				if condition.Type == corev1.PodScheduled && condition.Reason == corev1.PodReasonUnschedulable {
					return nil
				}
			}
			return fmt.Errorf("pod %s is neither bound nor unschedulable", name)
		}), "placing pod "+name)
		if !placed {
			result.pendingAtAll++
			if capacity-inUse >= gpus {
				result.pendingWithRoom++
			}
			remove(name)
			continue
		}
		live = append(live, livePod{name, gpus})
		inUse += gpus
		if extender != nil {
			want := len(live)
			t.must(promptly(t, 30*time.Second, func() error {
				cached, err := extender.cachedPods()
				if err == nil && cached != want {
					err = fmt.Errorf("the extender caches %d pods, want %d", cached, want)
				}
				return err
			}), "waiting for the extender to see the binding")
		}
		for inUse*100 > capacity*85 {
			k := departures.IntN(len(live))
			remove(live[k].name)
			inUse -= live[k].gpus
			live = slices.Delete(live, k, k+1)
		}
	}
	use, _, _ := s.gpuUse(t)
	for _, node := range gpuNodes {
		if use[node] == 0 {
			result.wholeFree++
		}
		if gpusPerNode-use[node] >= 8 {
			result.eightGPUFits++
		}
	}
	deletePods(t, s.bulk, scaleNamespace, extender)
	return result
}

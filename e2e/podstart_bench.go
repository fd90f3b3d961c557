// The pod-start benchmark (make bench-pod-start, not part of make e2e): the time from a pod's create to
// its container running on the real node, as a user sees it, with gpuguard installed by Helm (the
// webhook and the backstop on the create's path, the node enforcer on the container's) and without it,
// installed and uninstalled in turn in one run. The pod is the CUDA-like image asking for no GPU, so
// NVIDIA's runtime handles it either way: all GPUs without gpuguard, the CDI device none with it. Each
// phase starts its pods one at a time and then 8 at once, each deleted once it runs (the kubelet holds
// at most 110 pods). It reports figures and fails only when it cannot measure.
package main

import (
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	podStartNamespace  = "e2e-bench-start"
	podStartPods       = 100 // per phase, one at a time, and again 8 at once
	podStartRounds     = 2   // phases each way, alternating
	podStartConcurrent = 8
)

func benchPodStart(t *T, e *Env) {
	n := e.nodeWithoutGpuguard(t)
	c := n.cluster
	c.namespace(t, podStartNamespace, nil)
	unlimited := rest.CopyConfig(c.config)
	unlimited.QPS = -1 // client-go's limiter would be part of what is measured
	client, err := kubernetes.NewForConfig(unlimited)
	t.must(err, "making a client without a rate limit")
	pods := client.CoreV1().Pods(podStartNamespace)

	// One watch over the namespace tells each waiting create when its container runs.
	var mu sync.Mutex
	waiting := map[string]chan struct{}{}
	watcher, err := pods.Watch(t.ctx, metav1.ListOptions{})
	t.must(err, "watching the bench's pods")
	defer watcher.Stop()
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
				mu.Lock()
				if ready, found := waiting[pod.Name]; found {
					close(ready)
					delete(waiting, pod.Name)
				}
				mu.Unlock()
			}
		}
	}()

	made := 0
	start := func() (time.Duration, error) {
		mu.Lock()
		made++
		name := fmt.Sprintf("start-%05d", made)
		ready := make(chan struct{})
		waiting[name] = ready
		mu.Unlock()
		began := time.Now()
		if _, err := pods.Create(t.ctx, cudaPod(name), metav1.CreateOptions{}); err != nil {
			return 0, err
		}
		select {
		case <-ready:
		case <-time.After(2 * time.Minute):
			return 0, fmt.Errorf("pod %s did not run within 2 minutes", name)
		}
		took := time.Since(began)
		if err := pods.Delete(t.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
			return 0, err
		}
		return took, nil
	}
	type phase struct{ sequential, concurrent []time.Duration }
	measure := func(p *phase) {
		for i := 0; i < podStartPods; i++ {
			took, err := start()
			t.must(err, "starting a pod")
			p.sequential = append(p.sequential, took)
		}
		var wg sync.WaitGroup
		var times sync.Mutex
		failed := make(chan error, podStartConcurrent)
		for worker := 0; worker < podStartConcurrent; worker++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < podStartPods/podStartConcurrent; i++ {
					took, err := start()
					if err != nil {
						failed <- err
						return
					}
					times.Lock()
					p.concurrent = append(p.concurrent, took)
					times.Unlock()
				}
			}()
		}
		wg.Wait()
		close(failed)
		for err := range failed {
			t.Fatalf("starting pods %d at once: %v", podStartConcurrent, err)
		}
		waitForNoPods(t, client, podStartNamespace) // the next phase starts on an empty node
	}
	install := func() {
		e.gpuguardFor(t)
		n.waitForEnforcerRegistered(t)
	}
	uninstall := func() {
		n.helm(t, e, "uninstall")
		n.installed = false
		waitForNoPods(t, c.client, gpuguardNamespace)
		n.waitUntilValue(t, "unset", time.Minute) // no webhook patches creates any more
	}

	var with, without phase
	var enforcerSeconds, enforcerCreates float64 // the enforcer's own time, from its histogram
	for round := 1; round <= podStartRounds; round++ {
		measure(&without)
		install()
		measure(&with)
		page, err := n.enforcerMetrics(t)
		t.must(err, "reading the node enforcer's metrics")
		enforcerSeconds += series(page, "gpuguard_node_enforcer_create_duration_seconds_sum")
		enforcerCreates += series(page, "gpuguard_node_enforcer_create_duration_seconds_count")
		uninstall()
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

// The backstop's benchmark (make bench-backstop, not part of make e2e): what the ValidatingAdmissionPolicy
// adds to a pod's creation through the real API server, with gpuguard installed as manifests/default
// installs it (the webhook patching every pod, the policy judging it after). Pod creates are timed with
// the policy's binding in place and deleted, alternating in the same run, one at a time and 8 at once.
// It reports figures and fails only when it cannot measure: speed is judged in docs/benchmarks.md.
package main

import (
	"fmt"
	"slices"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	backstopBenchNamespace  = "e2e-bench-backstop"
	backstopUpdateNamespace = "e2e-bench-backstop-update"
	backstopCreates         = 200 // per phase and round, each way of creating
	backstopRounds          = 4
	backstopConcurrent      = 8
	// The API server's policy informer takes a new or deleted binding within a second; twice that.
	backstopSettle = 2 * time.Second
)

func benchBackstopCreate(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	c.namespace(t, backstopBenchNamespace, nil)
	defer func() {
		if err := c.client.CoreV1().Namespaces().Delete(t.ctx, backstopBenchNamespace, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting %s: %v", backstopBenchNamespace, err)
		}
	}()
	// A client of its own without client-go's rate limiter: the harness's (100 per second) would be what
	// is measured.
	unlimited := rest.CopyConfig(c.config)
	unlimited.QPS = -1
	client, err := kubernetes.NewForConfig(unlimited)
	t.must(err, "making a client without a rate limit")
	bindings := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	installed, err := bindings.Get(t.ctx, backstopBinding, metav1.GetOptions{})
	t.must(err, "reading the backstop's binding")
	binding := func(on bool) {
		if on {
			restored := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
				ObjectMeta: metav1.ObjectMeta{Name: installed.Name, Labels: installed.Labels},
				Spec:       installed.Spec,
			}
			_, err := bindings.Create(t.ctx, restored, metav1.CreateOptions{})
			t.must(err, "creating the backstop's binding again")
		} else {
			t.must(bindings.Delete(t.ctx, backstopBinding, metav1.DeleteOptions{}), "deleting the backstop's binding")
		}
		time.Sleep(backstopSettle)
	}
	defer func() {
		if _, err := bindings.Get(t.ctx, backstopBinding, metav1.GetOptions{}); err != nil {
			binding(true)
		}
	}()

	var names sync.Mutex
	created := 0
	create := func() (time.Duration, error) {
		names.Lock()
		created++
		name := fmt.Sprintf("bench-%05d", created)
		names.Unlock()
		started := time.Now()
		pod, err := client.CoreV1().Pods(backstopBenchNamespace).Create(t.ctx, podWith(name, container("app")), metav1.CreateOptions{})
		took := time.Since(started)
		if err == nil && pod.Spec.Containers[0].Env == nil {
			err = fmt.Errorf("pod %s was stored without the webhook's variable", name)
		}
		return took, err
	}
	type phase struct {
		sequential []time.Duration
		perSecond  []float64
	}
	measure := func(p *phase) {
		for i := 0; i < backstopCreates; i++ {
			took, err := create()
			if err != nil {
				t.Errorf("a create failed: %v", err)
				return
			}
			p.sequential = append(p.sequential, took)
		}
		var wg sync.WaitGroup
		failed := make(chan error, backstopConcurrent)
		started := time.Now()
		for worker := 0; worker < backstopConcurrent; worker++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < backstopCreates/backstopConcurrent; i++ {
					if _, err := create(); err != nil {
						failed <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(failed)
		for err := range failed {
			t.Errorf("a concurrent create failed: %v", err)
		}
		p.perSecond = append(p.perSecond, float64(backstopCreates)/time.Since(started).Seconds())
	}

	var with, without phase
	for round := 1; round <= backstopRounds; round++ {
		// Alternating which goes first, so that a drift over the run weighs on both alike.
		if round%2 == 1 {
			measure(&with)
			binding(false)
			measure(&without)
			binding(true)
		} else {
			binding(false)
			measure(&without)
			binding(true)
			measure(&with)
		}
	}
	if len(with.sequential) == 0 || len(without.sequential) == 0 {
		t.Fatalf("nothing was measured")
	}
	median := func(values []float64) float64 {
		sorted := slices.Clone(values)
		slices.Sort(sorted)
		return sorted[len(sorted)/2]
	}
	t.Logf("with the backstop, one at a time: %s", summarize(with.sequential))
	t.Logf("without it, one at a time: %s", summarize(without.sequential))
	t.Logf("with the backstop, %d at once: %.0f creates/s (median of %d rounds: %v)", backstopConcurrent,
		median(with.perSecond), len(with.perSecond), with.perSecond)
	t.Logf("without it, %d at once: %.0f creates/s (median of %d rounds: %v)", backstopConcurrent,
		median(without.perSecond), len(without.perSecond), without.perSecond)
}

// benchBackstopUpdate: what the backstop adds to pod UPDATEs, now that it judges those that change
// annotations. One pod; its annotation's value changed (evaluated by the policy) and its label's (not
// evaluated: the policy's matchConditions), each timed with the binding in place and deleted, alternating.
func benchBackstopUpdate(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	c.namespace(t, backstopUpdateNamespace, nil)
	defer func() {
		if err := c.client.CoreV1().Namespaces().Delete(t.ctx, backstopUpdateNamespace, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting %s: %v", backstopUpdateNamespace, err)
		}
	}()
	unlimited := rest.CopyConfig(c.config)
	unlimited.QPS = -1
	client, err := kubernetes.NewForConfig(unlimited)
	t.must(err, "making a client without a rate limit")
	bindings := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	installed, err := bindings.Get(t.ctx, backstopBinding, metav1.GetOptions{})
	t.must(err, "reading the backstop's binding")
	binding := func(on bool) {
		if on {
			_, err := bindings.Create(t.ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
				ObjectMeta: metav1.ObjectMeta{Name: installed.Name, Labels: installed.Labels}, Spec: installed.Spec}, metav1.CreateOptions{})
			t.must(err, "creating the backstop's binding again")
		} else {
			t.must(bindings.Delete(t.ctx, backstopBinding, metav1.DeleteOptions{}), "deleting the backstop's binding")
		}
		time.Sleep(backstopSettle)
	}
	defer func() {
		if _, err := bindings.Get(t.ctx, backstopBinding, metav1.GetOptions{}); err != nil {
			binding(true)
		}
	}()
	_, err = client.CoreV1().Pods(backstopUpdateNamespace).Create(t.ctx, podWith("updated", container("app")), metav1.CreateOptions{})
	t.must(err, "creating the pod the bench updates")
	updates := 0
	update := func(field string) time.Duration {
		updates++
		patch := fmt.Sprintf(`{"metadata":{%q:{"bench":"%d"}}}`, field, updates)
		started := time.Now()
		_, err := client.CoreV1().Pods(backstopUpdateNamespace).Patch(t.ctx, "updated", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		took := time.Since(started)
		t.must(err, "updating the pod's "+field)
		return took
	}
	timings := map[string][]time.Duration{}
	measure := func(on bool) {
		for _, field := range []string{"annotations", "labels"} {
			key := fmt.Sprintf("%s, binding %v", field, on)
			for i := 0; i < backstopCreates; i++ {
				timings[key] = append(timings[key], update(field))
			}
		}
	}
	for round := 1; round <= backstopRounds; round++ {
		if round%2 == 1 {
			measure(true)
			binding(false)
			measure(false)
			binding(true)
		} else {
			binding(false)
			measure(false)
			binding(true)
			measure(true)
		}
	}
	for _, key := range []string{"annotations, binding true", "annotations, binding false", "labels, binding true", "labels, binding false"} {
		t.Logf("%s: %s", key, summarize(timings[key]))
	}
}

// The backstop's benchmark (make bench-backstop, not part of make e2e): what the ValidatingAdmissionPolicy
// adds to a pod's creation through the real API server, with gpuguard installed as manifests/default
// installs it (the webhook patching every pod, the policy judging it after). Pod creates are timed with
// the policy's binding in place and deleted, alternating in the same run, one at a time and 8 at once.
// It reports figures and fails only when it cannot measure: speed is judged in docs/benchmarks.md.
package main

import (
	"fmt"
	"os/exec"
	"slices"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	backstopBenchNamespace  = "e2e-bench-backstop"
	backstopUpdateNamespace = "e2e-bench-backstop-update"
	// Each bench its own: a namespace deleted by the one before is still terminating when the next starts.
	backstopTaintsNamespace = "e2e-bench-backstop-taints"
	backstopCreates         = 200 // per phase and round, each way of creating
	backstopRounds          = 4
	backstopConcurrent      = 8
	// The API server's policy informer takes a new or deleted binding within a second; twice that.
	backstopSettle = 2 * time.Second
)

func benchBackstopCreate(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	defer c.benchNamespace(t, backstopBenchNamespace)()
	client := c.unlimitedClient(t)
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
	defer c.benchNamespace(t, backstopUpdateNamespace)()
	client := c.unlimitedClient(t)
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

// benchBackstopGpuNodeTaints: what webhook.gpuNodeTaints costs a create. What the chart renders with one
// taint listed (nvidia.com/gpu, NoSchedule) replaces what is installed, and back, alternating over the
// rounds: the backstop's policy (which works out whether a pod may land on a GPU node, and judges only
// those that may) and the webhook configuration's two entries, each with its matchConditions (the
// installed entry's clientConfig kept). In each phase, pods created one at a time that tolerate nothing
// (reviewed by the second entry; the policy judges nothing of them) and pods that tolerate the taint
// (reviewed by the first; judged).
func benchBackstopGpuNodeTaints(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	defer c.benchNamespace(t, backstopTaintsNamespace)()
	client := c.unlimitedClient(t)
	policies := client.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	webhooks := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	installedPolicy, err := policies.Get(t.ctx, backstopBinding, metav1.GetOptions{})
	t.must(err, "reading the backstop's policy")
	// manifests/default names its webhook configuration gpuguard, as the chart does for release gpuguard.
	installedWebhook, err := webhooks.Get(t.ctx, helmRelease, metav1.GetOptions{})
	t.must(err, "reading the webhook configuration")
	if len(installedWebhook.Webhooks) != 1 {
		t.Fatalf("the installed webhook configuration has %d entries, want 1", len(installedWebhook.Webhooks))
	}

	version, err := c.client.Discovery().ServerVersion()
	t.must(err, "reading the apiserver's version")
	out, err := exec.Command(e.component("helm"), "template", helmRelease, e.source("charts", "gpuguard"), "--namespace", gpuguardNamespace,
		"--kube-version", version.GitVersion, "--set-json", `webhook.gpuNodeTaints=[{"key":"nvidia.com/gpu","effect":"NoSchedule"}]`).Output()
	t.must(err, "helm template with webhook.gpuNodeTaints")
	var taintedPolicy *admissionregistrationv1.ValidatingAdmissionPolicy
	var taintedWebhooks []admissionregistrationv1.MutatingWebhook
	for _, obj := range decodeObjects(t, out) {
		switch {
		case obj.GetKind() == "ValidatingAdmissionPolicy" && obj.GetName() == backstopBinding:
			taintedPolicy = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			t.must(runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, taintedPolicy), "reading the rendered policy")
		case obj.GetKind() == "MutatingWebhookConfiguration" && obj.GetName() == helmRelease:
			var rendered admissionregistrationv1.MutatingWebhookConfiguration
			t.must(runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &rendered), "reading the rendered webhook configuration")
			for i, entry := range rendered.Webhooks {
				made := *installedWebhook.Webhooks[0].DeepCopy()
				made.Name, made.MatchConditions = entry.Name, entry.MatchConditions
				if i > 0 {
					made.FailurePolicy = entry.FailurePolicy
				}
				taintedWebhooks = append(taintedWebhooks, made)
			}
		}
	}
	if taintedPolicy == nil || len(taintedWebhooks) != 2 {
		t.Fatalf("the chart renders no ValidatingAdmissionPolicy %s, or not two webhook entries (%d)", backstopBinding, len(taintedWebhooks))
	}
	use := func(spec admissionregistrationv1.ValidatingAdmissionPolicySpec, entries []admissionregistrationv1.MutatingWebhook) {
		policy, err := policies.Get(t.ctx, backstopBinding, metav1.GetOptions{})
		t.must(err, "reading the backstop's policy")
		policy.Spec = spec
		stored, err := policies.Update(t.ctx, policy, metav1.UpdateOptions{})
		t.must(err, "replacing the backstop's policy")
		if got, want := stored.Spec.MatchConditions[0].Name, spec.MatchConditions[0].Name; got != want {
			t.Fatalf("the stored policy's first matchCondition is %s, want %s", got, want)
		}
		configuration, err := webhooks.Get(t.ctx, helmRelease, metav1.GetOptions{})
		t.must(err, "reading the webhook configuration")
		configuration.Webhooks = entries
		storedWebhooks, err := webhooks.Update(t.ctx, configuration, metav1.UpdateOptions{})
		t.must(err, "replacing the webhook configuration")
		if len(storedWebhooks.Webhooks) != len(entries) {
			t.Fatalf("the stored webhook configuration has %d entries, want %d", len(storedWebhooks.Webhooks), len(entries))
		}
		time.Sleep(backstopSettle)
	}
	defer use(installedPolicy.Spec, installedWebhook.Webhooks)

	created := 0
	create := func(tolerates bool) time.Duration {
		created++
		pod := podWith(fmt.Sprintf("bench-%05d", created), container("app"))
		if tolerates {
			pod.Spec.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists,
				Effect: corev1.TaintEffectNoSchedule}}
		}
		started := time.Now()
		stored, err := client.CoreV1().Pods(backstopTaintsNamespace).Create(t.ctx, pod, metav1.CreateOptions{})
		took := time.Since(started)
		t.must(err, "creating "+pod.Name)
		if stored.Spec.Containers[0].Env == nil {
			t.Fatalf("pod %s was stored without the webhook's variable", pod.Name)
		}
		return took
	}
	timings := map[string][]time.Duration{}
	measure := func(policy string) {
		for _, tolerates := range []bool{false, true} {
			key := fmt.Sprintf("%s, pod tolerating the taint %v", policy, tolerates)
			for i := 0; i < backstopCreates; i++ {
				timings[key] = append(timings[key], create(tolerates))
			}
		}
	}
	for round := 1; round <= backstopRounds; round++ {
		if round%2 == 1 {
			measure("as installed")
			use(taintedPolicy.Spec, taintedWebhooks)
			measure("gpuNodeTaints")
			use(installedPolicy.Spec, installedWebhook.Webhooks)
		} else {
			use(taintedPolicy.Spec, taintedWebhooks)
			measure("gpuNodeTaints")
			use(installedPolicy.Spec, installedWebhook.Webhooks)
			measure("as installed")
		}
	}
	for _, policy := range []string{"as installed", "gpuNodeTaints"} {
		for _, tolerates := range []bool{false, true} {
			key := fmt.Sprintf("%s, pod tolerating the taint %v", policy, tolerates)
			t.Logf("%s: %s", key, summarize(timings[key]))
		}
	}
}

// benchNamespace makes the bench's namespace and returns what deletes it.
func (c *Cluster) benchNamespace(t *T, name string) func() {
	c.namespace(t, name, nil)
	return func() {
		if err := c.client.CoreV1().Namespaces().Delete(t.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting %s: %v", name, err)
		}
	}
}

// unlimitedClient is a client of the bench's own without client-go's rate limiter: the harness's (100 per
// second) would be what is measured.
func (c *Cluster) unlimitedClient(t *T) kubernetes.Interface {
	unlimited := rest.CopyConfig(c.config)
	unlimited.QPS = -1
	client, err := kubernetes.NewForConfig(unlimited)
	t.must(err, "making a client without a rate limit")
	return client
}

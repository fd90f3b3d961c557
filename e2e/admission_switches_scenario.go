// admission-switches: the webhook's own watch of what takes pods out of its admission without a review
// reaching it (a namespace labelled gpuguard.io/ignore, the webhook configuration or the backstop's binding
// or policy deleted), and whether each of its watches works, through the real API server under the shipped RBAC (list and watch of namespaces selected by
// the label; of the three objects by name, which RBAC's resourceNames allows only with the name's field
// selector), read off the webhook's /metrics as the alerts GPUGuardAdmissionBreakGlass and
// GPUGuardAdmissionObjectMissing read them; and that the backstop's binding made again follows its
// parameter, which gpuguard-keep-configmap-params keeps the API server watching.
package main

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const (
	breakGlassNamespaces    = `gpuguard_ignored_namespaces{value="break-glass"}`
	configurationPresent    = `gpuguard_admission_object_present{object="webhook-configuration"}`
	backstopBindingPresent  = `gpuguard_admission_object_present{object="backstop-binding"}`
	backstopPolicyPresent   = `gpuguard_admission_object_present{object="backstop-policy"}`
	admissionSwitchesWithin = 30 * time.Second
)

func admissionSwitches(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	client := w.httpClient(t)
	url := fmt.Sprintf("https://127.0.0.1:%d/metrics", w.port)
	reads := func(series string, want int, what string) {
		t.must(eventually(t.ctx, admissionSwitchesWithin, func() error {
			got, err := scrape(client, url, series)
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("%s is %d, want %d", series, got, want)
			}
			return nil
		}), what)
	}
	reads(configurationPresent, 1, "the webhook configuration said present")
	reads(backstopBindingPresent, 1, "the backstop's binding said present")
	reads(backstopPolicyPresent, 1, "the backstop's policy said present")
	for _, object := range []string{"keeper-policy", "keeper-binding"} {
		reads(`gpuguard_admission_object_present{object="`+object+`"}`, 1,
			"the pair that keeps the backstop's parameter watched said present ("+object+")")
	}
	for _, resource := range []string{"namespaces", "mutatingwebhookconfigurations", "validatingadmissionpolicybindings", "validatingadmissionpolicies"} {
		reads(`gpuguard_admission_switches_watched{resource="`+resource+`"}`, 1, "the webhook's watch of "+resource+" said working")
	}
	before, err := scrape(client, url, breakGlassNamespaces)
	t.must(err, "reading "+breakGlassNamespaces)

	// The break glass's label on one namespace, then taken off by its value.
	const ns = "e2e-switches"
	c.namespace(t, ns, map[string]string{"gpuguard.io/ignore": "break-glass"})
	defer c.client.CoreV1().Namespaces().Delete(t.ctx, ns, metav1.DeleteOptions{})
	reads(breakGlassNamespaces, before+1, "a namespace labelled gpuguard.io/ignore=break-glass counted")
	patch := []byte(`{"metadata":{"labels":{"gpuguard.io/ignore":null}}}`)
	_, err = c.client.CoreV1().Namespaces().Patch(t.ctx, ns, "application/merge-patch+json", patch, metav1.PatchOptions{})
	t.must(err, "taking the label off")
	reads(breakGlassNamespaces, before, "the label taken off, no longer counted")

	// The other break glass: the binding, then the configuration, deleted (as operations.md's command does,
	// the binding first), each said gone; made again as an apply would, present.
	var configuration, binding, policy *unstructured.Unstructured
	for _, obj := range w.objects {
		switch {
		case obj.GetKind() == "MutatingWebhookConfiguration":
			configuration = obj
		case obj.GetKind() == "ValidatingAdmissionPolicyBinding" && obj.GetLabels()["gpuguard.io/refuses-pods"] == "true":
			binding = obj
		}
	}
	if binding != nil {
		policyName, _, _ := unstructured.NestedString(binding.Object, "spec", "policyName")
		for _, obj := range w.objects {
			if obj.GetKind() == "ValidatingAdmissionPolicy" && obj.GetName() == policyName {
				policy = obj
			}
		}
	}
	if configuration == nil || binding == nil || policy == nil {
		t.Fatalf("manifests/default: the webhook configuration %v, the backstop's binding %v and policy %v; want all three",
			configuration != nil, binding != nil, policy != nil)
	}
	restored := false
	defer func() {
		if !restored {
			c.apply(t, binding)
			c.apply(t, configuration)
		}
	}()
	admission := c.client.AdmissionregistrationV1()
	// The policy is not deleted here, as the break glass leaves it; its deletion is shown against the fake
	// API server (switches_test.cpp).
	t.must(admission.ValidatingAdmissionPolicyBindings().Delete(t.ctx, binding.GetName(), metav1.DeleteOptions{}), "deleting the binding")
	reads(backstopBindingPresent, 0, "the backstop's binding deleted, said gone")
	reads(configurationPresent, 1, "the webhook configuration still said present")
	t.must(admission.MutatingWebhookConfigurations().Delete(t.ctx, configuration.GetName(), metav1.DeleteOptions{}), "deleting the webhook configuration")
	reads(configurationPresent, 0, "the webhook configuration deleted, said gone")
	// The binding gone for longer than the API server's refresh of its policies (a second), after which, but
	// for gpuguard-keep-configmap-params, it would stop watching ConfigMaps as parameters for good
	// (kubernetes/kubernetes#130887); then made again, the configuration not yet.
	time.Sleep(2 * time.Second)
	c.apply(t, binding)
	reads(backstopBindingPresent, 1, "the backstop's binding made again, said present")
	backstopFollowsItsParameter(t, w)
	c.apply(t, configuration)
	restored = true
	reads(configurationPresent, 1, "the webhook configuration made again, said present")
	w.waitUntilPatching(t)
	t.Logf("the webhook's /metrics, within %s of each change: its four watches working and the backstop's policy present; a namespace labelled gpuguard.io/ignore=break-glass counted (%d to %d) and not once the label is off; the backstop's binding and the configuration deleted, 0 each; applied again, 1", admissionSwitchesWithin, before, before+1)
}

// backstopFollowsItsParameter: the backstop's binding made again, while no webhook configuration sends pods to
// the webhook, judges pods by gpuguard-policy as it is now: a GPU-less pod, unpatched, is refused in a
// namespace, then admitted once that namespace is exempted. An API server that had stopped watching ConfigMaps
// as parameters would go on refusing it.
func backstopFollowsItsParameter(t *T, w *webhookInstall) {
	c := w.cluster
	const exempt = "e2e-switches-exempt"
	c.namespace(t, exempt, nil)
	defer c.client.CoreV1().Namespaces().Delete(t.ctx, exempt, metav1.DeleteOptions{})
	create := func() error {
		pod, err := c.client.CoreV1().Pods(exempt).Create(t.ctx, podWith("exempt", container("app")),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil && len(pod.Spec.Containers[0].Env) > 0 {
			t.Fatalf("a pod was patched with no webhook configuration: %v", pod.Spec.Containers[0].Env)
		}
		return err
	}
	var refusal error
	t.must(eventually(t.ctx, 30*time.Second, func() error {
		if refusal = create(); refusal == nil || !strings.Contains(refusal.Error(), "ValidatingAdmissionPolicy") {
			return fmt.Errorf("want the backstop's refusal, got %v", refusal)
		}
		return nil
	}), "the backstop made again refusing a GPU-less unpatched pod")
	w.setPolicy(t, map[string]*string{"exemptNamespaces": ptr(exempt)})
	defer w.defaultPolicy(t)
	start := time.Now()
	t.must(eventually(t.ctx, 30*time.Second, create), "the backstop made again admitting that pod once its namespace is exempted")
	t.Logf("the backstop's binding made again 2 s after its deletion: a GPU-less unpatched pod refused (%v); %s then exempted in gpuguard-policy, admitted within %s", refusal, exempt, time.Since(start).Round(100*time.Millisecond))
}

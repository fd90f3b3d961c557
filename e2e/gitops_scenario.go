// The chart as GitOps tools install it (docs/operations.md#gitops), with stand-ins for the tools: Argo
// CD's render-then-apply in sync waves, and Flux's drift correction to a release's stored manifest.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const syncWave = "argocd.argoproj.io/sync-wave"

// armedState reads a release's webhook configuration's failurePolicy and its backstop binding's actions.
func (n *Node) armedState(t *T, release, when string) string {
	configuration, err := n.cluster.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.ctx, release, metav1.GetOptions{})
	t.must(err, "reading the webhook configuration "+when)
	binding, err := n.cluster.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(t.ctx, release+"-visible-devices", metav1.GetOptions{})
	t.must(err, "reading the backstop binding "+when)
	return fmt.Sprintf("%s %v", *configuration.Webhooks[0].FailurePolicy, binding.Spec.ValidationActions)
}

// renderedState is the same, as rendered.
func renderedState(t *T, objects []*unstructured.Unstructured) string {
	var policy string
	var actions []any
	for _, o := range objects {
		switch o.GetKind() {
		case "MutatingWebhookConfiguration":
			webhooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
			if len(webhooks) > 0 {
				policy, _ = webhooks[0].(map[string]any)["failurePolicy"].(string)
			}
		case "ValidatingAdmissionPolicyBinding":
			// The backstop's, which arming changes; not the trusted namespaces' guard, always Deny.
			if strings.HasSuffix(o.GetName(), "-visible-devices") {
				actions, _, _ = unstructured.NestedSlice(o.Object, "spec", "validationActions")
			}
		}
	}
	return fmt.Sprintf("%s %v", policy, actions)
}

// applyObjects applies objects with kubectl, server-side, as the field manager named.
func (n *Node) applyObjects(t *T, e *Env, manager string, objects []*unstructured.Unstructured) {
	out, err := n.tryApplyObjects(t, e, manager, objects)
	t.must(err, "kubectl apply: "+out)
}

// tryApplyObjects is applyObjects, saying what kubectl said.
func (n *Node) tryApplyObjects(t *T, e *Env, manager string, objects []*unstructured.Unstructured) (string, error) {
	var items []any
	for _, o := range objects {
		items = append(items, o.Object)
	}
	list, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	t.must(err, "encoding the objects to apply")
	file := e.path("gitops-" + manager + ".json")
	t.must(os.WriteFile(file, list, 0o644), "writing the objects to apply")
	// No client-side validation: a drift correction applies objects without the fields it leaves alone,
	// which the API server merges with what is live, as helm-controller's server-side apply does.
	return n.kubectl(t, e, "apply", "--server-side", "--force-conflicts", "--validate=false", "--field-manager="+manager, "-f", file)
}

// nodeGitOps: Argo CD's way, the chart rendered by helm template with webhook.armAfterReady=false (refused
// without cert-manager, a new CA at every render, unless selfSigned.renderWithoutCluster says it is
// rendered once; no hook rendered, both refusing objects refusing), applied wave by wave: wave 0, then,
// once the webhook's Deployment has an available replica, wave 1 (the webhook configuration and the
// backstop binding). It is
// armed, patches a GPU-less pod, and what is live is what was rendered: nothing for self-heal to revert.
// Rendered with the defaults instead, the refusing objects admit and a hook arms them, which self-heal
// would revert. Flux's way: installed by Helm, hooks run, armed; its drift correction applies revision 1's
// manifest without the fields the docs tell it to ignore, and it stays armed; applied whole (the
// control), it is disarmed.
func nodeGitOps(t *T, e *Env) {
	n := e.nodeWithoutGpuguard(t)
	image := []string{"--set", "image.repository=" + gpuguardRepo, "--set", "image.tag=" + gpuguardTag}

	// Argo CD.
	const argo = "gpuguard-argo"
	defer n.removeRelease(t, e, argo)
	tryRender := func(extra ...string) (string, error) {
		return n.helmOther(t, e, "template", argo, append(append(append([]string{"--namespace", argo}, image...), withoutPlugins...), extra...)...)
	}
	render := func(extra ...string) []*unstructured.Unstructured {
		out, err := tryRender(extra...)
		t.must(err, "helm template: "+out)
		return decodeObjects(t, []byte(out))
	}
	defaults := render()
	hooks := 0
	for _, o := range defaults {
		if o.GetAnnotations()["helm.sh/hook"] != "" {
			hooks++
		}
	}
	if got := renderedState(t, defaults); got != "Ignore [Warn Audit]" || hooks == 0 {
		t.Errorf("helm template with the defaults: %s and %d hooks; want Ignore [Warn Audit] and the arm hook (the drift Argo's self-heal reverts)", got, hooks)
	}
	// Without cert-manager, refused: each render would make a new CA, and each sync would move the caBundle
	// ahead of the mounted Secret. The harness has no cert-manager and applies one render once, whole: the
	// case selfSigned.renderWithoutCluster is for.
	if out, err := tryRender("--set", "webhook.armAfterReady=false"); err == nil ||
		!strings.Contains(out, "Use cert-manager (--set certManager.enabled=true)") {
		t.Errorf("helm template with webhook.armAfterReady=false and without cert-manager: %v, %.300s; want the refusal naming cert-manager", err, out)
	}
	objects := render("--set", "webhook.armAfterReady=false", "--set", "selfSigned.renderWithoutCluster=true")
	waves := map[string][]*unstructured.Unstructured{}
	for _, o := range objects {
		if o.GetAnnotations()["helm.sh/hook"] != "" {
			t.Errorf("with webhook.armAfterReady=false, %s %s is a hook", o.GetKind(), o.GetName())
			continue
		}
		wave := o.GetAnnotations()[syncWave]
		if wave == "" {
			wave = "0"
		}
		waves[wave] = append(waves[wave], o)
	}
	var later []string
	for _, o := range waves["1"] {
		later = append(later, o.GetKind())
	}
	slices.Sort(later)
	if len(waves) != 2 || !slices.Equal(later, []string{"MutatingWebhookConfiguration", "ValidatingAdmissionPolicyBinding"}) {
		t.Fatalf("sync waves: %d, wave 1 holding %v; want 0 and 1, wave 1 the webhook configuration and the backstop binding", len(waves), later)
	}
	n.cluster.namespace(t, argo, nil)
	n.applyObjects(t, e, "argocd-controller", waves["0"])
	t.must(eventually(t.ctx, 3*time.Minute, func() error {
		d, err := n.cluster.client.AppsV1().Deployments(argo).Get(t.ctx, argo+"-webhook", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.AvailableReplicas != *d.Spec.Replicas {
			return fmt.Errorf("%d of %d webhook replicas available", d.Status.AvailableReplicas, *d.Spec.Replicas)
		}
		return nil
	}), "waiting for wave 0 to be healthy, as Argo CD waits")
	n.applyObjects(t, e, "argocd-controller", waves["1"])
	live := n.armedState(t, argo, "after wave 1")
	if want := renderedState(t, objects); live != "Fail [Deny]" || live != want {
		t.Errorf("Argo CD's way: live %s, rendered %s; want both Fail [Deny]", live, want)
	}
	n.waitUntilPatching(t)
	t.Logf("Argo CD's way: helm template with webhook.armAfterReady=false, waves 0 then 1: live %s, as rendered; pods patched", live)
	n.breakGlassUnderGitOps(t, e, argo, func() {
		n.applyObjects(t, e, "argocd-controller", waves["0"])
		n.applyObjects(t, e, "argocd-controller", waves["1"])
	})
	n.removeRelease(t, e, argo)

	// Flux.
	const flux = "gpuguard-flux"
	defer n.removeRelease(t, e, flux)
	out, err := n.helmOther(t, e, "install", flux, append(append([]string{"--namespace", flux, "--create-namespace",
		"--wait", "--timeout", "5m"}, image...), withoutPlugins...)...)
	t.must(err, "helm install: "+out)
	if got := n.armedState(t, flux, "after the install"); got != "Fail [Deny]" {
		t.Fatalf("after helm install with its hooks: %s; want Fail [Deny]", got)
	}
	stored, err := n.helmOther(t, e, "get", "manifest", flux, "--namespace", flux)
	t.must(err, "helm get manifest: "+stored)
	var refusing []*unstructured.Unstructured
	for _, o := range decodeObjects(t, []byte(stored)) {
		if o.GetLabels()["gpuguard.io/refuses-pods"] == "true" {
			refusing = append(refusing, o)
		}
	}
	if got := renderedState(t, refusing); got != "Ignore [Warn Audit]" {
		t.Fatalf("revision 1's stored manifest: %s; want Ignore [Warn Audit] (rendered before the hook armed it)", got)
	}
	// The ignore rules: /webhooks/0/failurePolicy and /spec/validationActions.
	var corrected []*unstructured.Unstructured
	for _, o := range refusing {
		c := o.DeepCopy()
		if c.GetKind() == "MutatingWebhookConfiguration" {
			webhooks, _, _ := unstructured.NestedSlice(c.Object, "webhooks")
			delete(webhooks[0].(map[string]any), "failurePolicy")
			t.must(unstructured.SetNestedSlice(c.Object, webhooks, "webhooks"), "dropping failurePolicy")
		} else {
			unstructured.RemoveNestedField(c.Object, "spec", "validationActions")
		}
		corrected = append(corrected, c)
	}
	n.applyObjects(t, e, "helm-controller", corrected)
	if got := n.armedState(t, flux, "after the drift correction with the ignore rules"); got != "Fail [Deny]" {
		t.Errorf("Flux's drift correction with the docs' ignore rules: %s; want Fail [Deny]", got)
	}
	// The control, without the rules. The webhook configuration's failurePolicy is a field of its own: put
	// back to Ignore. The binding's actions are a set, which server-side apply joins with the hook's Deny:
	// the API server refuses Deny beside Warn, so that correction fails, loudly, and the binding stays.
	for _, o := range refusing {
		if o.GetKind() == "MutatingWebhookConfiguration" {
			n.applyObjects(t, e, "helm-controller", []*unstructured.Unstructured{o})
		} else if out, err := n.tryApplyObjects(t, e, "helm-controller", []*unstructured.Unstructured{o}); err == nil ||
			!strings.Contains(out, "must not contain both Deny and Warn") {
			t.Errorf("the control, the binding's drift correction without the ignore rule: %v %s; want the API server to refuse Deny beside Warn", err, out)
		}
	}
	control := n.armedState(t, flux, "after the drift correction without them")
	if control != "Ignore [Deny]" {
		t.Errorf("the control, Flux's drift correction without the ignore rules: %s; want the webhook configuration disarmed, Ignore [Deny]", control)
	}
	t.Logf("Flux's way: armed by the hook; drift correction to revision 1's manifest keeps Fail [Deny] with the ignore rules, and without them (the control) disarms the webhook configuration: %s", control)
}

// breakGlassUnderGitOps: the break glass a GitOps tool does not revert (docs/operations.md#break-glass). The
// outage stand-in lies outside what the tool applied: the node cordoned and the release's webhook pods
// deleted, so that no replica answers, and GPU-less pods are refused. The admin labels every namespace not
// already labelled gpuguard.io/ignore=break-glass, which takes them out of the webhook and the backstop:
// admitted, unpatched. selfHeal (the tool applying what it rendered again) touches no namespace, so they
// stay admitted. The label taken off by its value, refused again; the node uncordoned, patched.
func (n *Node) breakGlassUnderGitOps(t *T, e *Env, release string, selfHeal func()) {
	run := func(what string, args ...string) {
		out, err := n.kubectl(t, e, args...)
		t.must(err, what+": "+out)
	}
	admitted := func(want bool, what string) {
		t.must(eventually(t.ctx, time.Minute, func() error {
			pod, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, cudaPod("break-glass"),
				metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			switch {
			case want && err != nil:
				return err
			case want && visibleDevices(pod.Spec.Containers[0]) == "none":
				return fmt.Errorf("a GPU-less pod is patched, with no webhook replica to patch it")
			case !want && err == nil:
				return fmt.Errorf("a GPU-less pod is admitted (NVIDIA_VISIBLE_DEVICES %s)", visibleDevices(pod.Spec.Containers[0]))
			}
			return nil
		}), what)
	}
	run("kubectl cordon", "cordon", nodeName)
	cordoned := true
	defer func() {
		if cordoned {
			n.kubectl(t, e, "uncordon", nodeName)
		}
	}()
	run("deleting the webhook's pods", "delete", "pods", "--namespace", release, "--wait=true",
		"-l", "app.kubernetes.io/name="+release+"-webhook")
	admitted(false, "waiting for the outage to refuse GPU-less pods")

	const glass = "gpuguard.io/ignore=break-glass"
	run("the break glass", "label", "namespace", "-l", "!gpuguard.io/ignore", glass)
	labelled := true
	defer func() {
		if labelled {
			n.kubectl(t, e, "label", "namespace", "-l", glass, "gpuguard.io/ignore-")
		}
	}()
	admitted(true, "waiting for the break glass to admit GPU-less pods")
	selfHeal()
	if state := n.armedState(t, release, "after self-heal"); state != "Fail [Deny]" {
		t.Errorf("self-heal left the release %s; want Fail [Deny], as rendered", state)
	}
	admitted(true, "GPU-less pods admitted after self-heal, the break glass kept")

	run("taking the break glass off", "label", "namespace", "-l", glass, "gpuguard.io/ignore-")
	labelled = false
	admitted(false, "waiting for GPU-less pods to be refused again, the webhook still down")
	run("kubectl uncordon", "uncordon", nodeName)
	cordoned = false
	n.waitUntilPatching(t)
	t.Logf("break glass under GitOps: with no webhook replica, refused; %s on every namespace, admitted, and still after self-heal; taken off, refused; the node back, patched", glass)
}

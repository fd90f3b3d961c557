// Scenario: an upgrade from the chart before this one, and back, as real Helm releases against this API
// server. The previous chart is frozen in tests/fixtures/chart-previous.tgz (helm_test.sh holds its
// content to the digest tests/fixtures/chart-versions.txt records for that version). It is installed with
// values of an admin's own, then upgraded to this chart with --reuse-values (which hands the templates the
// old chart's values, defaults and all) and rolled back to it, then the same with --reset-then-reuse-values. The exemptions (the namespaces the webhook never looks at, the GPU
// infrastructure the node enforcer lets through) must survive each step. Hooks are left out and nothing
// waits: this control plane has no node, and what is checked is what each revision applies. Last, a
// rollback between two revisions of this chart must say, in helm status, what it restored.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// exemptions is what a revision lets through: the webhook's excluded namespaces and the node enforcer's
// --exempt-service-accounts entries, each sorted.
type exemptions struct{ namespaces, accounts []string }

func exemptionsOf(t *T, webhook *admissionv1.MutatingWebhookConfiguration, enforcer *appsv1.DaemonSet) exemptions {
	var x exemptions
	for _, w := range webhook.Webhooks {
		if w.NamespaceSelector == nil {
			continue
		}
		for _, expr := range w.NamespaceSelector.MatchExpressions {
			if expr.Key == "kubernetes.io/metadata.name" && expr.Operator == metav1.LabelSelectorOpNotIn {
				x.namespaces = append(x.namespaces, expr.Values...)
			}
		}
	}
	for _, c := range enforcer.Spec.Template.Spec.Containers {
		for _, arg := range c.Args {
			if list, ok := strings.CutPrefix(arg, "--exempt-service-accounts="); ok {
				x.accounts = append(x.accounts, strings.Split(list, ",")...)
			}
		}
	}
	if len(x.namespaces) == 0 || len(x.accounts) == 0 {
		t.Fatalf("no exemptions read (webhook %s, enforcer %s): %+v", webhook.Name, enforcer.Name, x)
	}
	sort.Strings(x.namespaces)
	sort.Strings(x.accounts)
	return x
}

// missing: what `want` holds that `got` lacks.
func missing(want, got []string) []string {
	have := map[string]bool{}
	for _, g := range got {
		have[g] = true
	}
	var lacking []string
	for _, w := range want {
		if !have[w] {
			lacking = append(lacking, w)
		}
	}
	return lacking
}

func chartUpgrade(t *T, e *Env) {
	c := e.clusterFor(t)
	const release = "gpuguard-upgrade"
	c.namespace(t, release, nil)
	kubeconfig := filepath.Join(e.path("control-plane"), "admin.kubeconfig")
	previous := e.source("tests", "fixtures", "chart-previous.tgz")
	helm := func(args ...string) (string, error) {
		args = append(args, "--namespace", release, "--kubeconfig", kubeconfig)
		out, err := exec.CommandContext(t.ctx, e.component("helm"), args...).CombinedOutput()
		os.WriteFile(e.path("logs", "helm-"+release+"-"+args[0]+".log"), out, 0o644)
		return string(out), err
	}
	image := []string{"--set", "image.repository=" + gpuguardRepo, "--set", "image.tag=" + gpuguardTag}
	defer func() {
		if out, err := helm("uninstall", release, "--no-hooks", "--wait"); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
	}()
	live := func(when string) exemptions {
		webhook, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.ctx, release, metav1.GetOptions{})
		t.must(err, "reading the webhook configuration "+when)
		enforcer, err := c.client.AppsV1().DaemonSets(release).Get(t.ctx, release+"-node-enforcer", metav1.GetOptions{})
		t.must(err, "reading the node enforcer's DaemonSet "+when)
		return exemptionsOf(t, webhook, enforcer)
	}

	// The release's own additions, as an admin's values hold them: --reset-then-reuse-values once failed to
	// render on a release that had customised webhook.excludedNamespaces.
	values := append([]string{"--set", "webhook.excludedNamespaces={team-infra}",
		"--set", "gpuInfrastructure={team-infra/dcgm-exporter:app=dcgm-exporter}"}, image...)
	out, err := helm(append([]string{"install", release, previous, "--no-hooks"}, values...)...)
	t.must(err, "helm install of the previous chart: "+out)
	before := live("as the previous chart installed it")
	if len(missing([]string{"team-infra"}, before.namespaces)) > 0 ||
		len(missing([]string{"team-infra/dcgm-exporter:app=dcgm-exporter"}, before.accounts)) > 0 {
		t.Fatalf("the previous chart did not apply the release's own additions: %+v", before)
	}

	// What this chart renders fresh with its defaults: what it lets through whatever an admin adds.
	rendered, err := helm(append([]string{"template", release, e.source("charts", "gpuguard")}, image...)...)
	t.must(err, "helm template of this chart: "+rendered)
	var webhook admissionv1.MutatingWebhookConfiguration
	var enforcer appsv1.DaemonSet
	for _, obj := range decodeObjects(t, []byte(rendered)) {
		switch {
		case obj.GetKind() == "MutatingWebhookConfiguration":
			t.must(runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &webhook), "reading the rendered webhook configuration")
		case obj.GetKind() == "DaemonSet" && obj.GetName() == release+"-node-enforcer":
			t.must(runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &enforcer), "reading the rendered enforcer")
		}
	}
	fresh := exemptionsOf(t, &webhook, &enforcer)

	// Each way of reusing a release's values, each from revision 1, the previous chart's; then back to it.
	revision := 1
	var counts []string
	for _, reuse := range []string{"--reuse-values", "--reset-then-reuse-values"} {
		out, err = helm("upgrade", release, e.source("charts", "gpuguard"), reuse, "--no-hooks")
		t.must(err, "helm upgrade "+reuse+" from the previous chart: "+out)
		revision++
		upgraded := live("after helm upgrade " + reuse)
		for what, lacking := range map[string][]string{
			"the previous release's excluded namespaces": missing(before.namespaces, upgraded.namespaces),
			"the previous release's GPU infrastructure":  missing(before.accounts, upgraded.accounts),
			"this chart's default excluded namespaces":   missing(fresh.namespaces, upgraded.namespaces),
			"this chart's default GPU infrastructure":    missing(fresh.accounts, upgraded.accounts),
		} {
			if len(lacking) > 0 {
				t.Errorf("helm upgrade %s from the previous chart lost %s: %v", reuse, what, lacking)
			}
		}
		out, err = helm("rollback", release, "1", "--no-hooks")
		t.must(err, "helm rollback to the previous chart after "+reuse+": "+out)
		revision++
		back := live("after the rollback from " + reuse)
		if fmt.Sprint(back) != fmt.Sprint(before) {
			t.Errorf("rolled back from %s to the previous chart: %+v; want what it installed, %+v", reuse, back, before)
		}
		counts = append(counts, fmt.Sprintf("%s: excluded namespaces %d → %d → %d, GPU infrastructure %d → %d → %d",
			reuse, len(before.namespaces), len(upgraded.namespaces), len(back.namespaces), len(before.accounts),
			len(upgraded.accounts), len(back.accounts)))
	}
	t.Logf("previous chart → this one → rollback (revision %d): %s", revision, strings.Join(counts, "; "))

	// A rollback says what it restores: Helm copies the notes of the revision it goes back to, and this
	// chart's notes open with what their revision applies, so helm status says it after the rollback.
	chartYAML, err := os.ReadFile(e.source("charts", "gpuguard", "Chart.yaml"))
	t.must(err, "reading Chart.yaml")
	version := regexp.MustCompile(`(?m)^version: (\S+)$`).FindSubmatch(chartYAML)
	if version == nil {
		t.Fatalf("Chart.yaml has no version line")
	}
	out, err = helm("upgrade", release, e.source("charts", "gpuguard"), "--reset-then-reuse-values", "--no-hooks")
	t.must(err, "helm upgrade to this chart: "+out)
	revision++
	restored := revision
	out, err = helm("upgrade", release, e.source("charts", "gpuguard"), "--reuse-values", "--no-hooks", "--set", "policy.mode=audit")
	t.must(err, "helm upgrade to policy mode audit: "+out)
	revision++
	out, err = helm("rollback", release, strconv.Itoa(restored), "--no-hooks")
	t.must(err, "helm rollback from policy mode audit: "+out)
	status, err := helm("status", release)
	t.must(err, "helm status after the rollback: "+status)
	for _, want := range []string{
		fmt.Sprintf("Revision %d applies chart gpuguard-%s", restored, version[1]),
		"policy mode enforce, node enforcement enforce",
		"namespaces the webhook and the backstop never look at: kube-system, kube-node-lease, gpu-operator, nvidia-device-plugin, dra-driver-nvidia-gpu, nvidia-dra-driver-gpu, team-infra, " + release,
		"team-infra/dcgm-exporter:app=dcgm-exporter",
	} {
		if !strings.Contains(status, want) {
			t.Errorf("helm status after a rollback to revision %d does not say %q:\n%s", restored, want, status)
		}
	}
	if strings.Contains(status, "policy mode audit") {
		t.Errorf("helm status after the rollback says the mode rolled back from:\n%s", status)
	}
}

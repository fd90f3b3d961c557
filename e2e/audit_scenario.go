// Scenario: the in-cluster audit (gpuguard-webhook audit-controller) against the real apiserver. The chart
// rendered with charts/gpuguard/ci/audit-values.yaml gives the PolicyReport CRD, the audit's service
// account and RBAC, which are applied; two replicas run with the Deployment's own arguments and that
// service account's token (no kubelet runs pods here). What they write is read back from the API.
package main

import (
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

var policyReports = schema.GroupVersionResource{Group: "wgpolicyk8s.io", Version: "v1alpha2", Resource: "policyreports"}

const (
	auditName       = "gpuguard-audit"
	auditReportName = "gpuguard-gpu-exposure"
	backstopBinding = "gpuguard-visible-devices"
	// What the audit promises (docs/audit.md): a change is in the reports within a pass (at most a second
	// after the watch delivers it); a dead leader's successor leads within lease duration + 2 retry periods.
	auditReportBound   = 15 * time.Second
	auditTakeoverBound = 15*time.Second + 2*2*time.Second + 5*time.Second
)

type auditReplica struct {
	process *process
	port    int
}

func (r *auditReplica) metric(series string) (int, error) {
	return scrape(http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/metrics", r.port), series)
}

// installAudit applies what the chart renders for the audit, less its Deployment, and returns the
// Deployment's container arguments.
func (e *Env) installAudit(t *T, w *webhookInstall) []string {
	c := w.cluster
	version, err := c.client.Discovery().ServerVersion()
	t.must(err, "reading the apiserver's version")
	out, err := exec.Command(e.component("helm"), "template", "gpuguard", e.source("charts", "gpuguard"), "--namespace",
		gpuguardNamespace, "--kube-version", version.GitVersion, "-f", e.source("charts", "gpuguard", "ci", "audit-values.yaml")).Output()
	t.must(err, "helm template with audit-values.yaml")
	var args []string
	for _, obj := range decodeObjects(t, out) {
		isAudit := strings.HasPrefix(obj.GetName(), auditName) || obj.GetKind() == "CustomResourceDefinition"
		switch {
		// prometheus-operator's kinds are not served here; the Service is the Deployment's, which does not run.
		case !isAudit || obj.GetKind() == "PrometheusRule" || obj.GetKind() == "ServiceMonitor" || obj.GetKind() == "ConfigMap" ||
			obj.GetKind() == "Service":
		case obj.GetKind() == "Deployment":
			args = shippedArgs(t, obj, map[string]string{"listen-address": "127.0.0.1:PORT", "policy-dir": w.policyDir})
		default:
			c.apply(t, obj)
		}
	}
	if args == nil {
		t.Fatalf("the chart renders no %s Deployment with audit-values.yaml", auditName)
	}
	t.must(eventually(t.ctx, 30*time.Second, func() error {
		_, err := c.dynamic.Resource(policyReports).List(t.ctx, metav1.ListOptions{})
		return err
	}), "waiting for the PolicyReport API")
	return append(args, "--apiserver-url="+c.server, "--token-file="+c.serviceAccountToken(t, e, auditName), "--ca-file="+c.caFile)
}

func (e *Env) startAuditReplica(t *T, name string, args []string) *auditReplica {
	port := mustFreePort(t)
	args = append([]string{}, args...)
	for i, arg := range args {
		args[i] = strings.Replace(arg, "127.0.0.1:PORT", "127.0.0.1:"+strconv.Itoa(port), 1)
	}
	p, err := e.startWithEnv(name, e.gpuguard("gpuguard-webhook"), []string{"POD_NAME=" + name, "POD_NAMESPACE=" + gpuguardNamespace}, args...)
	t.must(err, "starting "+name)
	r := &auditReplica{process: p, port: port}
	t.must(eventually(t.ctx, 30*time.Second, func() error {
		if err := p.alive(); err != nil {
			return err
		}
		if _, err := r.metric("gpuguard_audit_synced"); err != nil {
			return err
		}
		if synced, _ := r.metric("gpuguard_audit_synced"); synced != 1 {
			return fmt.Errorf("%s has not listed pods and nodes", name)
		}
		return nil
	}), "waiting for "+name+" to be synced")
	return r
}

// report is the namespace's PolicyReport, or nil.
func report(t *T, c *Cluster, namespace string) *unstructured.Unstructured {
	r, err := c.dynamic.Resource(policyReports).Namespace(namespace).Get(t.ctx, auditReportName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	t.must(err, "reading the PolicyReport of "+namespace)
	return r
}

// resultFor is the report's result for the pod ("" when the report names it not).
func resultFor(r *unstructured.Unstructured, pod string) string {
	if r == nil {
		return ""
	}
	results, _, _ := unstructured.NestedSlice(r.Object, "results")
	for _, item := range results {
		result, _ := item.(map[string]any)
		resources, _ := result["resources"].([]any)
		for _, resource := range resources {
			if ref, _ := resource.(map[string]any); ref["name"] == pod {
				verdict, _ := result["result"].(string)
				return verdict
			}
		}
	}
	return ""
}

func auditReports(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	args := e.installAudit(t, w)
	replicas := []*auditReplica{e.startAuditReplica(t, "audit-1", args), e.startAuditReplica(t, "audit-2", args)}
	defer func() {
		for _, r := range replicas {
			r.process.stop()
		}
	}()
	leader := func() (*auditReplica, error) {
		var found []*auditReplica
		for _, r := range replicas {
			if r.process.exited() {
				continue
			}
			if n, err := r.metric("gpuguard_audit_leader"); err == nil && n == 1 {
				found = append(found, r)
			}
		}
		if len(found) != 1 {
			return nil, fmt.Errorf("%d replicas lead, want 1", len(found))
		}
		return found[0], nil
	}
	t.must(eventually(t.ctx, 30*time.Second, func() error { _, err := leader(); return err }), "one leader")

	// The pod made before gpuguard was installed is reported.
	t.must(eventually(t.ctx, auditReportBound, func() error {
		if got := resultFor(report(t, c, olderPodNamespace), olderPodName); got != "fail" {
			return fmt.Errorf("the pod older than gpuguard has result %q, want fail", got)
		}
		return nil
	}), "the pod older than gpuguard in its namespace's PolicyReport")

	const ns, exempt = "e2e-audit", "e2e-audit-exempt"
	c.namespace(t, ns, nil)
	c.namespace(t, exempt, nil)

	// An exempt namespace's offender is reported as exempt (skip), not hidden.
	w.setPolicy(t, map[string]*string{"exemptNamespaces": ptr(exempt)})
	defer w.defaultPolicy(t)
	// The backstop reads the same ConfigMap through its own informer, so its exemption follows a moment later.
	t.must(eventually(t.ctx, time.Minute, func() error {
		_, err := c.client.CoreV1().Pods(exempt).Create(t.ctx, podWith("exempt", container("app")), metav1.CreateOptions{})
		return err
	}), "creating a pod in an exempt namespace")
	t.must(eventually(t.ctx, 30*time.Second, func() error {
		if got := resultFor(report(t, c, exempt), "exempt"); got != "skip" {
			return fmt.Errorf("result %q, want skip", got)
		}
		return nil
	}), "the exempt namespace's pod in its report as skip")

	// The webhook down under failurePolicy: Ignore, and the backstop only auditing (as an install with
	// backstop.enabled=false has none): a pod is admitted unpatched, and appears in its namespace's report
	// and in the leader's series.
	setBackstopActions := func(actions string) {
		patch := fmt.Sprintf(`{"spec":{"validationActions":%s}}`, actions)
		_, err := c.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Patch(t.ctx, backstopBinding,
			types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		t.must(err, "setting the backstop's validationActions to "+actions)
	}
	setFailurePolicy := func(policy admissionregistrationv1.FailurePolicyType) {
		patch := fmt.Sprintf(`[{"op":"replace","path":"/webhooks/0/failurePolicy","value":%q}]`, policy)
		_, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(t.ctx, webhookConfig, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
		t.must(err, "setting failurePolicy "+string(policy))
	}
	setBackstopActions(`["Audit"]`)
	setFailurePolicy(admissionregistrationv1.Ignore)
	w.stop()
	var created time.Time
	t.must(eventually(t.ctx, 30*time.Second, func() error {
		_, err := c.client.CoreV1().Pods(ns).Create(t.ctx, podWith("while-webhook-down", container("app")), metav1.CreateOptions{})
		created = time.Now()
		return err
	}), "creating a pod while the webhook is down under Ignore")
	w.start(t, e)
	setFailurePolicy(admissionregistrationv1.Fail)
	setBackstopActions(`["Deny"]`)
	t.must(eventually(t.ctx, auditReportBound, func() error {
		if got := resultFor(report(t, c, ns), "while-webhook-down"); got != "fail" {
			return fmt.Errorf("result %q, want fail", got)
		}
		lead, err := leader()
		if err != nil {
			return err
		}
		if n, err := lead.metric(`gpuguard_audit_exposed_pods{namespace="` + ns + `",reason="image-default",result="fail"}`); err != nil || n != 1 {
			return fmt.Errorf("the leader's series: %d, %v", n, err)
		}
		return nil
	}), "the pod admitted unpatched in its namespace's PolicyReport and the leader's series")
	t.Logf("a pod admitted unpatched was reported %v after its creation (bound %v)", time.Since(created).Round(100*time.Millisecond), auditReportBound)

	// The leader dies without giving the Lease up: the other takes over within the bound and writes no
	// report again that is already true.
	versions := map[string]string{}
	for _, namespace := range []string{olderPodNamespace, ns, exempt} {
		versions[namespace] = report(t, c, namespace).GetResourceVersion()
	}
	lead, err := leader()
	t.must(err, "finding the leader")
	killed := time.Now()
	lead.process.cmd.Process.Kill()
	<-lead.process.done
	t.must(eventually(t.ctx, auditTakeoverBound, func() error { _, err := leader(); return err }), "a new leader")
	took := time.Since(killed)
	next, _ := leader()
	t.must(eventually(t.ctx, 10*time.Second, func() error {
		_, err := next.metric("gpuguard_audit_pods")
		return err
	}), "the new leader's first pass")
	time.Sleep(2 * time.Second)
	for namespace, version := range versions {
		if got := report(t, c, namespace).GetResourceVersion(); got != version {
			t.Errorf("the new leader wrote the report of %s again (resourceVersion %s, was %s)", namespace, got, version)
		}
	}
	t.Logf("the leader killed, the other led %v later (bound %v); no report written again", took.Round(100*time.Millisecond), auditTakeoverBound)

	// Deleting the pod takes it out of the report; its namespace has nothing else, so the report goes.
	t.must(c.client.CoreV1().Pods(ns).Delete(t.ctx, "while-webhook-down", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}),
		"deleting the reported pod")
	t.must(eventually(t.ctx, auditReportBound, func() error {
		if report(t, c, ns) != nil {
			return fmt.Errorf("the report of %s is still there", ns)
		}
		return nil
	}), "the report gone with the pod, written by the new leader")
}

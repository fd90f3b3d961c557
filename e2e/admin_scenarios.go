// The admin's first day and worst day on the real node (issue 36): an install whose image cannot be pulled
// refuses no pod anywhere, measured against the same install armed at once; and a cluster whose gpuguard
// namespace was deleted without an uninstall, refusing pods until the break-glass steps of
// docs/operations.md are taken, and one uninstalled as documented, which refuses nothing. Each uses a
// release of its own, without the device plugins, before the node's own install. A rollback re-arms (issue
// 44), and every runbook command of docs/operations.md runs against the installed release.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// refusingLabel marks what refuses pods: the webhook configuration and the backstop's binding.
const refusingLabel = "gpuguard.io/refuses-pods=true"

// helmOther runs helm for a release other than the node's own (command, release, then flags), and
// returns its output and error; the output is kept in the run's logs.
func (n *Node) helmOther(t *T, e *Env, command, release string, args ...string) (string, error) {
	all := []string{command, release}
	if command == "install" || command == "upgrade" || command == "template" {
		all = append(append(all, e.source("charts", "gpuguard")), n.runtime.helmValues()...)
	}
	all = append(append(all, "--kubeconfig", e.path("node-control-plane", "admin.kubeconfig")), args...)
	out, err := exec.CommandContext(t.ctx, e.component("helm"), all...).CombinedOutput()
	os.WriteFile(e.path("logs", "helm-"+release+"-"+command+".log"), out, 0o644)
	return string(out), err
}

// kubectl runs the repo's kubectl against the node's cluster.
func (n *Node) kubectl(t *T, e *Env, args ...string) (string, error) {
	args = append([]string{"--kubeconfig", e.path("node-control-plane", "admin.kubeconfig")}, args...)
	out, err := exec.CommandContext(t.ctx, e.component("kubectl"), args...).CombinedOutput()
	return string(out), err
}

// withoutPlugins: a second release must not serve nvidia.com/gpu beside the node's own, nor register a
// second NRI plugin named gpuguard.
var withoutPlugins = []string{"--set", "devicePlugin.enabled=false", "--set", "hostDevices.enabled=false",
	"--set", "nodeEnforcer.enabled=false"}

// dryRunCreate asks the API server to admit a GPU-less pod in the node's namespace, and says why not.
func (n *Node) dryRunCreate(t *T, name string) error {
	_, err := n.cluster.client.CoreV1().Pods(nodeNamespace).Create(t.ctx, cudaPod(name), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// admissions counts the dry-run creates admitted and refused, every 200 ms from the moment the release's
// webhook configuration exists (helm makes it a moment after it starts) until stopped.
type admissions struct {
	admitted, refused atomic.Int64
	first             atomic.Value
	done              chan struct{}
	wg                sync.WaitGroup
}

func (n *Node) countAdmissions(t *T, release string) *admissions {
	a := &admissions{done: make(chan struct{})}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			_, made := n.cluster.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.ctx, release, metav1.GetOptions{})
			if made == nil {
				if err := n.dryRunCreate(t, "first-day"); err != nil {
					a.refused.Add(1)
					a.first.CompareAndSwap(nil, err.Error())
				} else {
					a.admitted.Add(1)
				}
			}
			select {
			case <-a.done:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return a
}

func (a *admissions) stop() (admitted, refused int64, first string) {
	close(a.done)
	a.wg.Wait()
	if f := a.first.Load(); f != nil {
		first = f.(string)
	}
	return a.admitted.Load(), a.refused.Load(), first
}

// waitNamespaceGone deletes a namespace and waits until the API server has removed it.
func (n *Node) waitNamespaceGone(t *T, name string) {
	err := n.cluster.client.CoreV1().Namespaces().Delete(t.ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.must(err, "deleting namespace "+name)
	}
	t.must(eventually(t.ctx, 3*time.Minute, func() error {
		_, err := n.cluster.client.CoreV1().Namespaces().Get(t.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("namespace %s is still there (%v)", name, err)
	}), "waiting for namespace "+name+" to be removed")
}

// removeRelease takes away whatever a scenario's release left, whichever step failed: the release without
// its hooks, its namespace, and its cluster-wide objects by the release's label; so that the node's own
// install after it is not reviewed by a leftover webhook.
func (n *Node) removeRelease(t *T, e *Env, release string) {
	n.helmOther(t, e, "uninstall", release, "--namespace", release, "--no-hooks", "--wait", "--timeout", "1m")
	n.kubectl(t, e, "delete", "mutatingwebhookconfigurations,validatingadmissionpolicybindings,validatingadmissionpolicies,"+
		"clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/instance="+release, "--ignore-not-found")
	n.waitNamespaceGone(t, release)
}

// refusing lists the objects labelled as refusing pods, as kind/name.
func (n *Node) refusing(t *T, e *Env) []string {
	out, err := n.kubectl(t, e, "get", "mutatingwebhookconfigurations,validatingadmissionpolicybindings", "-l", refusingLabel, "-o", "name")
	t.must(err, "listing what refuses pods: "+out)
	return strings.Fields(out)
}

// nodeInstallUnpullable: the README's helm install, with an image no node can pull. Armed after readiness
// (the default), no pod anywhere is refused while it fails; armed at once (armAfterReady=false, the
// control), every GPU-less pod in a covered namespace is refused for as long as it is installed.
func nodeInstallUnpullable(t *T, e *Env) {
	n := e.nodeWithoutGpuguard(t)
	const release = "gpuguard-unpullable"
	defer n.removeRelease(t, e, release)
	for _, arm := range []bool{false, true} {
		values := append([]string{"--namespace", release, "--create-namespace", "--wait", "--timeout", "20s",
			"--set", "image.repository=registry.invalid/gpuguard", "--set", "image.tag=absent",
			"--set", fmt.Sprintf("webhook.armAfterReady=%t", arm)}, withoutPlugins...)
		counting := n.countAdmissions(t, release)
		started := time.Now()
		out, err := n.helmOther(t, e, "install", release, values...)
		took := time.Since(started)
		admitted, refused, first := counting.stop()
		if err == nil {
			t.Errorf("armAfterReady=%t: helm install with an image that cannot be pulled succeeded: %s", arm, out)
		}
		configuration, getErr := n.cluster.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.ctx, release, metav1.GetOptions{})
		t.must(getErr, "reading the release's webhook configuration")
		policy := string(*configuration.Webhooks[0].FailurePolicy)
		t.Logf("armAfterReady=%t: helm install failed after %s (%s); meanwhile %d dry-run creates admitted, %d refused; failurePolicy %s",
			arm, took.Round(time.Second), strings.TrimSpace(lastLine(out)), admitted, refused, policy)
		if admitted+refused < 50 {
			t.Errorf("armAfterReady=%t: only %d creates while the release was installed", arm, admitted+refused)
		}
		if arm {
			if refused != 0 || policy != "Ignore" {
				t.Errorf("armed after readiness, an install that never became ready refused %d of %d creates (first: %s), failurePolicy %s",
					refused, admitted+refused, first, policy)
			}
			// And after it failed, still nothing refuses.
			if err := n.dryRunCreate(t, "after-failed-install"); err != nil {
				t.Errorf("after the failed install, a GPU-less pod is refused: %v", err)
			}
		} else if admitted != 0 || !strings.Contains(first, "failed calling webhook") {
			t.Errorf("armed at once (the control), %d of %d creates were admitted while no replica could answer; first refusal: %s",
				admitted, admitted+refused, first)
		}
		out, err = n.helmOther(t, e, "uninstall", release, "--namespace", release, "--wait", "--timeout", "2m")
		t.must(err, "helm uninstall of the failed release: "+out)
		n.waitNamespaceGone(t, release)
		if left := n.refusing(t, e); len(left) != 0 {
			t.Errorf("after helm uninstall, still refusing pods: %v", left)
		}
	}
}

// nodeBreakGlass: the worst day. A working install, armed by its hook; its namespace deleted without an
// uninstall, so that no replica can answer and the backstop's parameter is gone: pods are refused. The
// break-glass command of docs/operations.md (delete what carries the label) lets them in again, and what
// else is left is named by the release's label. Then the orderly way: helm uninstall, delete the namespace,
// create a pod: admitted, and nothing is left that refuses.
func nodeBreakGlass(t *T, e *Env) {
	n := e.nodeWithoutGpuguard(t)
	const release = "gpuguard-glass"
	defer n.removeRelease(t, e, release)
	install := append([]string{"--namespace", release, "--create-namespace", "--wait", "--timeout", "5m",
		"--set", "image.repository=" + gpuguardRepo, "--set", "image.tag=" + gpuguardTag}, withoutPlugins...)
	started := time.Now()
	out, err := n.helmOther(t, e, "install", release, install...)
	t.must(err, "helm install: "+out)
	configuration, err := n.cluster.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.ctx, release, metav1.GetOptions{})
	t.must(err, "reading the webhook configuration")
	binding, err := n.cluster.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(t.ctx, release+"-visible-devices", metav1.GetOptions{})
	t.must(err, "reading the backstop binding")
	actions := fmt.Sprint(binding.Spec.ValidationActions)
	if policy := string(*configuration.Webhooks[0].FailurePolicy); policy != "Fail" || actions != "[Deny]" {
		t.Errorf("after helm install --wait, the hook left failurePolicy %s and the backstop %s; want Fail and [Deny]", policy, actions)
	}
	t.Logf("helm install --wait, armed by its hook: %s", time.Since(started).Round(time.Second))
	if err := n.dryRunCreate(t, "glass-armed"); err != nil {
		t.Errorf("with the release installed and armed, a GPU-less pod is refused: %v", err)
	}

	// The worst day: the namespace is deleted, the release's cluster-wide objects stay.
	n.waitNamespaceGone(t, release)
	refused := n.dryRunCreate(t, "glass-locked")
	if refused == nil {
		t.Errorf("with the namespace gone and the webhook configuration left at Fail, a pod was admitted")
	} else {
		t.Logf("namespace deleted without an uninstall: a GPU-less pod is refused: %v", refused)
	}
	// Break glass, as docs/operations.md says.
	out, err = n.kubectl(t, e, "delete", "validatingadmissionpolicybinding,mutatingwebhookconfiguration", "-l", refusingLabel)
	t.must(err, "breaking glass: "+out)
	t.must(eventually(t.ctx, 30*time.Second, func() error { return n.dryRunCreate(t, "glass-broken") }),
		"waiting for pods to be admitted after breaking glass")
	out, err = n.kubectl(t, e, "get", "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings", "-l",
		"app.kubernetes.io/instance="+release, "-o", "name")
	t.must(err, "listing the release's leftovers: "+out)
	t.Logf("left after breaking glass, none of which refuses a pod: %s", strings.Join(strings.Fields(out), ", "))
	out, err = n.kubectl(t, e, "delete", "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings", "-l",
		"app.kubernetes.io/instance="+release)
	t.must(err, "deleting the release's leftovers: "+out)
	out, err = n.kubectl(t, e, "delete", "roles,rolebindings", "--all-namespaces", "-l", "app.kubernetes.io/instance="+release)
	t.must(err, "deleting the release's leftovers in other namespaces: "+out)

	// The orderly way: uninstall, then the namespace, then a pod.
	out, err = n.helmOther(t, e, "install", release, install...)
	t.must(err, "helm install again: "+out)
	out, err = n.helmOther(t, e, "uninstall", release, "--namespace", release, "--wait", "--timeout", "2m")
	t.must(err, "helm uninstall: "+out)
	n.waitNamespaceGone(t, release)
	if err := n.dryRunCreate(t, "glass-uninstalled"); err != nil {
		t.Errorf("after helm uninstall and the namespace deleted, a GPU-less pod is refused: %v", err)
	}
	if left := n.refusing(t, e); len(left) != 0 {
		t.Errorf("after helm uninstall, still refusing pods: %v", left)
	}
	out, err = n.kubectl(t, e, "get", "clusterroles,clusterrolebindings,validatingadmissionpolicies,mutatingwebhookconfigurations", "-l",
		"app.kubernetes.io/instance="+release, "-o", "name")
	t.must(err, "listing what the uninstall left: "+out)
	if left := strings.Fields(out); len(left) != 0 {
		t.Errorf("helm uninstall left %v", left)
	}
}

// nodeRollback: a rollback re-arms. A release armed by its hook (revision 1 rendered admitting), upgraded
// (revision 2 rendered armed, since the chart looks the objects up, with a Job that only probes), then rolled back to
// revision 1, whose manifest is admitting: Helm re-applies it, and the post-rollback hook arms it again.
// The control is the same rollback without hooks, which is what every rollback did before: it leaves
// failurePolicy Ignore and the backstop at Warn and Audit, with nothing to arm them.
func nodeRollback(t *T, e *Env) {
	n := e.nodeWithoutGpuguard(t)
	const release = "gpuguard-rollback"
	defer n.removeRelease(t, e, release)
	armed := func(when string) string {
		configuration, err := n.cluster.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.ctx, release, metav1.GetOptions{})
		t.must(err, "reading the webhook configuration "+when)
		binding, err := n.cluster.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(t.ctx, release+"-visible-devices", metav1.GetOptions{})
		t.must(err, "reading the backstop binding "+when)
		return fmt.Sprintf("%s %v", *configuration.Webhooks[0].FailurePolicy, binding.Spec.ValidationActions)
	}
	const armedState, admittingState = "Fail [Deny]", "Ignore [Warn Audit]"
	in := []string{"--namespace", release, "--wait", "--timeout", "5m"}
	install := append(append([]string{"--create-namespace", "--set", "image.repository=" + gpuguardRepo,
		"--set", "image.tag=" + gpuguardTag}, in...), withoutPlugins...)
	out, err := n.helmOther(t, e, "install", release, install...)
	t.must(err, "helm install: "+out)
	if got := armed("after the install"); got != armedState {
		t.Fatalf("after helm install --wait: %s; want %s", got, armedState)
	}
	out, err = n.helmOther(t, e, "upgrade", release, append([]string{"--reuse-values"}, in...)...)
	t.must(err, "helm upgrade: "+out)
	if got := armed("after the upgrade"); got != armedState {
		t.Errorf("after helm upgrade: %s; want %s", got, armedState)
	}
	// Nothing left to arm: the upgrade took away the hook's rights to patch the two objects (and to read the
	// policy ConfigMap), and its Job only probed (--verify-only), through the account and Role it keeps.
	if _, err := n.cluster.client.RbacV1().ClusterRoles().Get(t.ctx, release+"-arm", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after an upgrade that found everything armed, the arm hook's ClusterRole: %v; want it gone", err)
	}
	if _, err := n.cluster.client.RbacV1().ClusterRoleBindings().Get(t.ctx, release+"-arm", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after an upgrade that found everything armed, the arm hook's ClusterRoleBinding: %v; want it gone", err)
	}
	role, err := n.cluster.client.RbacV1().Roles(release).Get(t.ctx, release+"-arm", metav1.GetOptions{})
	t.must(err, "reading the verifying hook's Role")
	for _, rule := range role.Rules {
		if slices.Contains(rule.Resources, "configmaps") {
			t.Errorf("after an upgrade that found everything armed, the arm hook's Role still reads %v", rule.ResourceNames)
		}
	}
	hooks, err := n.helmOther(t, e, "get", "hooks", release, "--namespace", release)
	t.must(err, "helm get hooks: "+hooks)
	if !strings.Contains(hooks, "- --verify-only") || strings.Contains(hooks, "--webhook-configuration=") || strings.Contains(hooks, "--backstop-binding=") {
		t.Errorf("the armed release's upgrade rendered a hook Job that does not only verify:\n%s", hooks)
	}

	// The control: revision 1's manifest without its hook.
	out, err = n.helmOther(t, e, "rollback", release, append([]string{"1", "--no-hooks"}, in...)...)
	t.must(err, "helm rollback --no-hooks: "+out)
	control := armed("after the rollback without hooks")
	if control != admittingState {
		t.Errorf("the control: helm rollback to revision 1 without hooks left %s; want revision 1's manifest, %s", control, admittingState)
	}
	// The rollback as it is run.
	started := time.Now()
	out, err = n.helmOther(t, e, "rollback", release, append([]string{"1"}, in...)...)
	t.must(err, "helm rollback: "+out)
	got := armed("after the rollback")
	if _, err := n.cluster.client.CoreV1().ServiceAccounts(release).Get(t.ctx, release+"-arm", metav1.GetOptions{}); err != nil {
		t.Errorf("after the rollback, revision 1's arm hook account: %v", err)
	}
	if got != armedState {
		t.Errorf("after helm rollback to revision 1: %s; want %s (the post-rollback hook re-arms)", got, armedState)
	}
	t.Logf("rolled back to revision 1: without hooks %s (the control), with them %s after %s", control, got,
		time.Since(started).Round(time.Second))
	if err := n.dryRunCreate(t, "rolled-back"); err != nil {
		t.Errorf("after the rollback, a GPU-less pod is refused: %v", err)
	}
}

// runbookNotRun: runbook commands the e2e cluster cannot answer, by a word of the command, and why.
var runbookNotRun = map[string]string{
	" top ": "kubectl top needs the metrics API (metrics-server), which the e2e cluster does not serve",
}

// runRunbook runs the first command of each runbook entry of docs/operations.md (its "*First:*"), as an
// admin pastes it, with NODE, NAMESPACE and POD filled in, against the node's cluster with gpuguard and
// its audit installed: each must exit 0, and print something unless it reads logs (a window of a healthy
// program's log may hold nothing). A trailing "| grep …" is left off, since on a healthy cluster it
// rightly finds nothing.
func (n *Node) runRunbook(t *T, e *Env, namespace string) {
	text, err := os.ReadFile(e.source("docs", "operations.md"))
	t.must(err, "reading docs/operations.md")
	parts := strings.SplitN(string(text), "\n## Runbook\n", 2)
	if len(parts) != 2 {
		t.Fatalf("docs/operations.md has no Runbook section")
	}
	runbook := strings.SplitN(parts[1], "\n## ", 2)[0]
	firsts := regexp.MustCompile("\\*First:\\* `([^`]+)`").FindAllStringSubmatch(runbook, -1)
	entries := strings.Count(runbook, "\n### ")
	if len(firsts) != entries || entries < 10 {
		t.Fatalf("docs/operations.md: %d runbook entries, %d first commands found", entries, len(firsts))
	}
	// A pod of the webhook that stays: a helm upgrade just before may still be replacing them, and a
	// command naming one that is going away fails for that alone.
	pod := ""
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		pods, err := n.cluster.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + webhookDeploy})
		if err != nil {
			return err
		}
		pod = ""
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				return fmt.Errorf("the webhook's pod %s is going away (a rollout under way)", p.Name)
			}
			if pod == "" && p.Status.Phase == corev1.PodRunning {
				pod = p.Name
			}
		}
		if pod == "" {
			return fmt.Errorf("no webhook pod running")
		}
		return nil
	}), "waiting for a webhook pod to fill POD with")
	fill := strings.NewReplacer("NODE", nodeName, "NAMESPACE", namespace, "POD", pod)
	environment := append(os.Environ(), "PATH="+filepath.Dir(e.component("kubectl"))+":"+os.Getenv("PATH"),
		"KUBECONFIG="+e.path("node-control-plane", "admin.kubeconfig"))
	ran := 0
	for _, first := range firsts {
		command := fill.Replace(first[1])
		if !strings.HasPrefix(command, "kubectl ") {
			t.Errorf("runbook: %q is not a kubectl command", first[1])
			continue
		}
		skipped := false
		for word, why := range runbookNotRun {
			if strings.Contains(command, word) {
				t.Logf("runbook: not run here: %s (%s)", command, why)
				skipped = true
			}
		}
		if skipped {
			continue
		}
		if grep := strings.Index(command, " | grep "); grep >= 0 {
			command = command[:grep]
		}
		run := exec.CommandContext(t.ctx, "bash", "-o", "pipefail", "-c", command)
		run.Env = environment
		out, err := run.CombinedOutput()
		if err != nil || (strings.TrimSpace(string(out)) == "" && !strings.Contains(command, " logs ")) {
			t.Errorf("runbook: %s: %v\n%s", command, err, out)
			continue
		}
		ran++
	}
	t.Logf("runbook: %d of %d first commands ran against the cluster", ran, len(firsts))
}

// lastLine is the last non-empty line of a command's output.
func lastLine(out string) string {
	lines := slices.DeleteFunc(strings.Split(out, "\n"), func(l string) bool { return strings.TrimSpace(l) == "" })
	if len(lines) == 0 {
		return ""
	}
	return lines[len(lines)-1]
}

// releaseWarning is the message of the one Warning Event of a reason on the release's webhook Deployment, which
// `kubectl describe deployment` shows (the docs send admins there); when there is not exactly one, the test
// fails saying what there is.
func (n *Node) releaseWarning(t *T, e *Env, release, reason string) (string, bool) {
	events, err := n.cluster.client.CoreV1().Events(release).List(t.ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
	t.must(err, "listing the release's "+reason+" events")
	if len(events.Items) != 1 || events.Items[0].InvolvedObject.Name != release+"-webhook" || events.Items[0].Type != "Warning" {
		t.Errorf("%s events: %+v; want one Warning on Deployment %s-webhook", reason, events.Items, release)
		return "", false
	}
	if err := n.describeShows(t, e, reason, "--namespace", release, "deployment", release+"-webhook"); err != nil {
		t.Errorf("%v", err)
	}
	return events.Items[0].Message, true
}

// describeShows says why `kubectl describe` of an object does not list an event of the reason among its
// Events, or nil: it lists only those that name the object by its UID too, and this is where admins look.
// Events are listed by the API server as soon as they are made, so one look is enough.
func (n *Node) describeShows(t *T, e *Env, reason string, object ...string) error {
	out, err := n.kubectl(t, e, append([]string{"describe"}, object...)...)
	if err != nil {
		return fmt.Errorf("kubectl describe %s: %v: %s", strings.Join(object, " "), err, out)
	}
	at := strings.LastIndex(out, "\nEvents:")
	if at < 0 {
		return fmt.Errorf("kubectl describe %s has no Events section:\n%s", strings.Join(object, " "), out)
	}
	events := out[at:]
	if !strings.Contains(events, reason) {
		return fmt.Errorf("kubectl describe %s shows no %s event:%s", strings.Join(object, " "), reason, events)
	}
	t.Logf("kubectl describe %s shows the %s event", strings.Join(object, " "), reason)
	return nil
}

// nodeArmProbe: arming shows that the API server reaches the webhook, not only the kubelet. As soon as the
// release's webhook Service exists, it is pointed at a port nothing listens on: the stand-in for a
// NetworkPolicy the API server's calls do not match (cilium/cilium#14724; this node's CNI enforces none).
// The kubelet's probes go to the pod and pass, so the Deployment is available; the arm hook's dry-run pod
// comes back unpatched, so helm install fails, nothing is armed, the hook's log says why, and the
// Deployment carries a NotArmed Warning Event; the log shows it probed through the API server the EndpointSlice
// default/kubernetes names (written here as an API server's reconciler writes it), at its own address. With
// the Service as rendered again, helm upgrade arms it, through that address. Armed,
// an upgrade while the Service points at the closed port again fails the same way (the hook verifies, a
// NotReached Event) and leaves it armed; with the Service restored, the next upgrade passes.
func nodeArmProbe(t *T, e *Env) {
	n := e.nodeWithoutGpuguard(t)
	const release = "gpuguard-probe"
	defer n.removeRelease(t, e, release)
	// The EndpointSlice default/kubernetes, as an API server's endpoint reconciler writes it (the harness's
	// runs with --endpoint-reconciler-type=none): the node's API server at its address and port, which the
	// hook probes through directly.
	endpointSlices := n.cluster.client.DiscoveryV1().EndpointSlices("default")
	_, sliceErr := endpointSlices.Create(t.ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kubernetes", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{nodeAddress}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(n.cluster.port)), Protocol: ptr(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{})
	t.must(sliceErr, "writing EndpointSlice default/kubernetes as an API server does")
	defer endpointSlices.Delete(t.ctx, "kubernetes", metav1.DeleteOptions{})
	services := n.cluster.client.CoreV1().Services(release)
	pointAt := func(port string) error {
		patch := fmt.Sprintf(`[{"op":"replace","path":"/spec/ports/0/targetPort","value":%s}]`, port)
		_, err := services.Patch(t.ctx, release+"-webhook", types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	broken := make(chan error, 1)
	go func() {
		broken <- eventually(t.ctx, 2*time.Minute, func() error { return pointAt("9443") })
	}()
	values := append([]string{"--namespace", release, "--create-namespace", "--wait", "--timeout", "3m",
		"--set", "image.repository=" + gpuguardRepo, "--set", "image.tag=" + gpuguardTag,
		"--set", "webhook.armTimeoutSeconds=20"}, withoutPlugins...)
	// Until armed, policy mode off, in which the webhook changes and says nothing but of the probe pod
	// (the main release arms in mode enforce, node/closed): before chart 0.4.7 the upgrade below that arms
	// failed there, as every install in mode off did. An armed release's upgrade in mode off is not probed
	// (the notes say why), so the upgrades after it are in mode enforce.
	modeOff := append(slices.Clone(values), "--set", "policy.mode=off")
	out, err := n.helmOther(t, e, "install", release, modeOff...)
	t.must(<-broken, "pointing the webhook's Service at a closed port")
	if err == nil {
		t.Errorf("helm install with the API server unable to reach the webhook succeeded: %s", out)
	}
	if state := n.armedState(t, release, "after the failed install"); state != "Ignore [Warn Audit]" {
		t.Errorf("the API server cannot reach the webhook, yet the hook armed it: %s, want Ignore [Warn Audit]", state)
	}
	logs, err := n.kubectl(t, e, "logs", "--namespace", release, "job/"+release+"-arm")
	t.must(err, "reading the arm hook's log: "+logs)
	if !strings.Contains(logs, "the API server was not shown to call the webhook: nothing was armed") ||
		!strings.Contains(logs, "came back with NVIDIA_VISIBLE_DEVICES=all, as sent") {
		t.Errorf("the arm hook's log does not say why it armed nothing:\n%s", logs)
	}
	// It probed through the API server the kubernetes Service lists, at its own address (the node's), its
	// certificate checked as the Service's; the upgrade below arms through it.
	apiserver := fmt.Sprintf("https://%s:%d", nodeAddress, n.cluster.port)
	if !strings.Contains(logs, `"msg":"probing through each API server"`) || !strings.Contains(logs, "(through API server "+apiserver+")") {
		t.Errorf("the arm hook's log does not show it probing through the API server %s:\n%s", apiserver, logs)
	}
	if message, ok := n.releaseWarning(t, e, release, "NotArmed"); ok {
		t.Logf("left unarmed: helm install failed (%s); Event NotArmed: %s", strings.TrimSpace(lastLine(out)), message)
	}
	t.must(pointAt(`"https"`), "pointing the webhook's Service back at its port")
	out, err = n.helmOther(t, e, "upgrade", release, modeOff...)
	t.must(err, "helm upgrade in policy mode off with the API server able to reach the webhook: "+out)
	if state := n.armedState(t, release, "after the upgrade"); state != "Fail [Deny]" {
		t.Errorf("the API server reaches the webhook, and the hook left it %s; want Fail [Deny]", state)
	}

	// Armed, then upgraded while the API server cannot reach the webhook: the hook (now --verify-only) fails
	// the upgrade, saying why, and leaves the release armed. Helm's three-way merge puts the Service back as
	// rendered when the upgrade applies it, so it is pointed at the closed port again and again while the
	// upgrade runs; the probe comes after that apply.
	defer func() { _ = pointAt(`"https"`) }()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			_ = pointAt("9443")
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	out, err = n.helmOther(t, e, "upgrade", release, values...)
	close(stop)
	<-stopped
	if err == nil {
		t.Errorf("helm upgrade of an armed release with the API server unable to reach the webhook succeeded: %s", out)
	}
	if state := n.armedState(t, release, "after the failed upgrade"); state != "Fail [Deny]" {
		t.Errorf("an armed release whose upgrade failed its probe is %s; want it left Fail [Deny]", state)
	}
	logs, err = n.kubectl(t, e, "logs", "--namespace", release, "job/"+release+"-arm")
	t.must(err, "reading the verifying hook's log: "+logs)
	if !strings.Contains(logs, "the API server was not shown to call the webhook: it was armed already and is left so") {
		t.Errorf("the verifying hook's log does not say the API server does not reach the armed webhook:\n%s", logs)
	}
	if message, ok := n.releaseWarning(t, e, release, "NotReached"); ok {
		t.Logf("armed, upgraded unreached: helm upgrade failed (%s); Event NotReached: %s", strings.TrimSpace(lastLine(out)), message)
	}
	// Reached again, the next upgrade's probe passes.
	t.must(pointAt(`"https"`), "pointing the webhook's Service back at its port")
	started := time.Now()
	out, err = n.helmOther(t, e, "upgrade", release, values...)
	t.must(err, "helm upgrade of the armed release with the API server able to reach the webhook again: "+out)
	if state := n.armedState(t, release, "after the last upgrade"); state != "Fail [Deny]" {
		t.Errorf("after the last upgrade the release is %s; want Fail [Deny]", state)
	}
	t.Logf("armed and reached: helm upgrade --wait passed its probe in %.1f s all told", time.Since(started).Seconds())
}

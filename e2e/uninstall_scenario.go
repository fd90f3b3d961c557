// The uninstall as docs/operations.md says it, and the node afterwards: nothing of gpuguard left that
// acts, in the API or on the node.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// docBlock is the first ```sh block of docs/operations.md after the line that holds marker.
func docBlock(t *T, e *Env, marker string) string {
	text, err := os.ReadFile(e.source("docs", "operations.md"))
	t.must(err, "reading docs/operations.md")
	_, after, found := strings.Cut(string(text), marker)
	if !found {
		t.Fatalf("docs/operations.md has no %q", marker)
	}
	_, block, found := strings.Cut(after, "```sh\n")
	if !found {
		t.Fatalf("docs/operations.md: no sh block after %q", marker)
	}
	block, _, _ = strings.Cut(block, "```")
	return block
}

// runDocCommands runs a block of the docs with bash, kubectl on PATH and the node's cluster as KUBECONFIG.
func (n *Node) runDocCommands(t *T, e *Env, what, block string) {
	run := exec.CommandContext(t.ctx, "bash", "-euo", "pipefail", "-c", block)
	run.Env = append(os.Environ(), "PATH="+filepath.Dir(e.component("kubectl"))+":"+os.Getenv("PATH"),
		"KUBECONFIG="+e.path("node-control-plane", "admin.kubeconfig"))
	out, err := run.CombinedOutput()
	t.must(err, what+": "+string(out))
}

// nodeUninstall: the kustomize installation node/kustomize left, uninstalled as operations.md says (what
// refuses pods first, then the rest), then its leftovers removed with the docs' commands (the GPUIsolation
// condition, the PolicyReports) and manifests/uninstall (what the device plugin wrote on the node). Then
// nothing of gpuguard is left: no namespace, no cluster-wide object, no condition, no report, no file it
// wrote on the node nor directory it made there, containerd's config as shipped; and a pod that asks for
// no GPU sees both GPUs, as before gpuguard.
func nodeUninstall(t *T, e *Env) {
	n := e.nodeFor(t)
	if !n.installed {
		t.Fatalf("needs the kustomize installation node/kustomize makes")
	}
	n.checkInstalledLeavesTraces(t)
	n.runDocCommands(t, e, "operations.md's kustomize uninstall", strings.ReplaceAll(
		docBlock(t, e, "first, then the rest (with the overlay you applied"), "manifests/default", e.path("manifests", "node-image")))
	n.installed = false
	n.removeLeftovers(t, e)
	n.checkNothingLeft(t, e, "after the kustomize uninstall")

	// What else a node held for the scenarios, each gone with them.
	left := []string{"/var/lib/rpm", "/usr/local/nvidia/toolkit"}
	if n.onCRIO() {
		left = append(left, crioDropIn)
	} else {
		left = append(left, "/etc/crio")
	}
	for _, path := range left {
		if _, err := os.Stat(path); err == nil {
			t.Errorf("left on the node: %s", path)
		}
	}
	shipped, err := n.runtime.configFiles(e, n)
	t.must(err, "the runtime's config as shipped")
	for path, want := range shipped {
		config, err := os.ReadFile(path)
		t.must(err, "reading "+path)
		if string(config) != want {
			t.Errorf("%s is not as shipped:\n%s", path, config)
		}
	}
	defer n.deletePods(t, "after-uninstall")
	expectBothGPUs(t, "after the uninstall, a pod that asked for no GPU (as before gpuguard)", n.look(t, e, n.runPod(t, cudaPod("after-uninstall"))))
}

// helmUninstall: the node's Helm release uninstalled with operations.md's two commands, whose helm uninstall
// cleans the node with its post-delete hooks, and the reports' command (node/kustomize runs it before
// installing with kustomize): nothing of gpuguard is left in the API or on the node, its files and the
// node's condition, which checkInstalledLeavesTraces saw there first, among them.
func (n *Node) helmUninstall(t *T, e *Env) {
	n.checkInstalledLeavesTraces(t)
	started := time.Now()
	n.runDocCommands(t, e, "operations.md's Helm uninstall", docBlock(t, e, "Then uninstall the release and its namespace:"))
	n.installed = false
	t.Logf("helm uninstall, its node cleanup and the namespace's deletion, as operations.md says: %.1f s", time.Since(started).Seconds())
	n.runDocCommands(t, e, "operations.md's command for the audit's reports",
		docBlock(t, e, "What an uninstall does not remove, none of which refuses a pod"))
	n.checkNothingLeft(t, e, "after the Helm uninstall")
}

// gpuguardCDISpec is the CDI spec gpuguard's device plugin writes on the node.
const gpuguardCDISpec = "/var/run/cdi/k8s.gpuguard.io-gpu.json"

// maskCheckOnNode is where the node enforcer copies its mask check (CRI-O's createRuntime hook).
const maskCheckOnNode = "/var/lib/gpuguard/bin/gpuguard-mask-check"

// checkInstalledLeavesTraces fails the test unless the installation has written, within a minute, what an
// uninstall leaves, so that its removal shows: the device plugin's CDI spec, the MPS root the node enforcer
// makes, the mask check it copies, and the node's GPUIsolation condition.
func (n *Node) checkInstalledLeavesTraces(t *T) {
	t.must(eventually(t.ctx, time.Minute, func() error {
		for _, path := range []string{gpuguardCDISpec, "/run/gpuguard/mps", maskCheckOnNode} {
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("%v; want it there, so that its removal shows", err)
			}
		}
		node, err := n.cluster.client.CoreV1().Nodes().Get(t.ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, condition := range node.Status.Conditions {
			if condition.Type == "GPUIsolation" {
				return nil
			}
		}
		return fmt.Errorf("the node has no GPUIsolation condition to remove")
	}), "before the uninstall, what it leaves")
}

// removeLeftovers runs operations.md's commands for what a kustomize uninstall does not remove (the reports,
// the condition), then its node cleanup, manifests/uninstall with the image set in an overlay.
func (n *Node) removeLeftovers(t *T, e *Env) {
	n.runDocCommands(t, e, "operations.md's command for the audit's reports",
		docBlock(t, e, "What an uninstall does not remove, none of which refuses a pod"))
	n.runDocCommands(t, e, "operations.md's command for the node's condition",
		docBlock(t, e, "With kustomize, or a Helm release uninstalled with"))
	cleanup := e.path("manifests", "uninstall-image")
	t.must(os.MkdirAll(cleanup, 0o755), "creating the uninstall overlay")
	t.must(os.WriteFile(filepath.Join(cleanup, "kustomization.yaml"), []byte("apiVersion: kustomize.config.k8s.io/v1beta1\n"+
		"kind: Kustomization\nresources: [../uninstall]\nimages:\n  - {name: gpuguard, newName: "+gpuguardRepo+", newTag: "+gpuguardTag+"}\n"),
		0o644), "writing the uninstall overlay")
	n.runDocCommands(t, e, "operations.md's node cleanup", strings.ReplaceAll(
		docBlock(t, e, "where they differed from the defaults:"), "my-uninstall-overlay", cleanup))
}

// checkNothingLeft fails the test for anything of gpuguard left in the API (its namespaces, cluster-wide
// objects, PolicyReports, the node's condition) or on the node (the device plugin's CDI specs, its MPS root,
// its NFD feature file).
func (n *Node) checkNothingLeft(t *T, e *Env, when string) {
	c := n.cluster
	for _, ns := range []string{gpuguardNamespace, "gpuguard-uninstall"} {
		if _, err := c.client.CoreV1().Namespaces().Get(t.ctx, ns, metav1.GetOptions{}); err == nil {
			t.Errorf("%s: namespace %s is left", when, ns)
		}
	}
	out, err := n.kubectl(t, e, "get", "clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,"+
		"validatingadmissionpolicies,validatingadmissionpolicybindings", "-o", "name")
	t.must(err, "listing what is left: "+out)
	// The audit's reports, where node/audit ran it (the CRD stays, as the docs say).
	if _, err := n.kubectl(t, e, "get", "crd", "policyreports.wgpolicyk8s.io"); err == nil {
		reports, err := n.kubectl(t, e, "get", "policyreports.wgpolicyk8s.io", "-A", "-l", "app.kubernetes.io/managed-by=gpuguard", "-o", "name")
		t.must(err, "listing the PolicyReports left: "+reports)
		out += reports
	}
	for _, line := range strings.Fields(out) {
		if strings.Contains(line, "gpuguard") {
			t.Errorf("%s: left in the API: %s", when, line)
		}
	}
	node, err := c.client.CoreV1().Nodes().Get(t.ctx, nodeName, metav1.GetOptions{})
	t.must(err, "reading the node")
	for _, condition := range node.Status.Conditions {
		if condition.Type == "GPUIsolation" {
			t.Errorf("%s: the node keeps its GPUIsolation condition: %+v", when, condition)
		}
	}
	left, _ := filepath.Glob("/var/run/cdi/*gpuguard*")
	// /run/gpuguard itself is the harness's (a shared mount, as on a systemd node; node.go): its MPS root is
	// the plugin's.
	left = append(left, "/run/gpuguard/mps", "/etc/kubernetes/node-feature-discovery/features.d/gpuguard", "/var/lib/gpuguard")
	for _, path := range left {
		if _, err := os.Stat(path); err == nil {
			t.Errorf("%s: left on the node: %s", when, path)
		}
	}
}

// nodeUninstallUnclean: helm uninstall when a node cannot be cleaned in time. A tmpfs left mounted under the
// MPS root (an MPS daemon's, whose pod has not ended) keeps forget-node from removing it, so its pod is never
// ready: with uninstall.timeoutSeconds=15, helm uninstall fails naming the hook Job; the release is gone,
// Helm has deleted the DaemonSet and its accounts and kept the Job, whose log names the node. The node's
// condition is removed all the same. The tmpfs gone, operations.md's kustomize cleanup and the namespace's
// deletion leave nothing of gpuguard.
func nodeUninstallUnclean(t *T, e *Env) {
	n := e.gpuguardFor(t)
	e.render(t, "default") // copies manifests/, the uninstall's overlay among them
	n.checkInstalledLeavesTraces(t)
	n.helm(t, e, "upgrade", "--reuse-values", "--set", "uninstall.timeoutSeconds=15")
	held := "/run/gpuguard/mps/GPU-held-by-an-mps-daemon"
	t.must(os.MkdirAll(held, 0o755), "making the MPS daemon's directory")
	t.must(syscall.Mount("tmpfs", held, "tmpfs", 0, "size=1m"), "mounting the MPS daemon's tmpfs")
	mounted := true
	unmount := func() {
		if mounted {
			t.must(syscall.Unmount(held, 0), "unmounting the MPS daemon's tmpfs")
			mounted = false
		}
	}
	defer unmount()

	started := time.Now()
	out, err := exec.CommandContext(t.ctx, e.component("helm"), "uninstall", helmRelease, "--kubeconfig",
		e.path("node-control-plane", "admin.kubeconfig"), "--namespace", gpuguardNamespace, "--wait", "--timeout", "3m").CombinedOutput()
	n.installed = false
	if err == nil || !strings.Contains(string(out), "gpuguard-node-cleanup-wait") {
		t.Errorf("helm uninstall with a node that cannot be cleaned: %v, %s; want it to fail naming the Job", err, out)
	}
	t.Logf("helm uninstall, a node not clean, after %.1f s: %s", time.Since(started).Seconds(), strings.TrimSpace(lastLine(string(out))))
	logs, err := n.kubectl(t, e, "-n", gpuguardNamespace, "logs", "job/gpuguard-node-cleanup-wait")
	t.must(err, "reading the Job's log: "+logs)
	if !strings.Contains(logs, "1 not ready: "+nodeName) {
		t.Errorf("the Job's log does not name the node: %s", logs)
	}
	t.Logf("the Job's log: %s", strings.TrimSpace(lastLine(logs)))
	if _, err := n.cluster.client.AppsV1().DaemonSets(gpuguardNamespace).Get(t.ctx, "gpuguard-node-cleanup", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after the failed hook, the cleanup's DaemonSet: %v; want it deleted by Helm", err)
	}
	if _, err := n.cluster.client.RbacV1().ClusterRoles().Get(t.ctx, "gpuguard-node-cleanup", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after the failed hook, the cleanup's ClusterRole: %v; want it deleted by Helm", err)
	}
	node, err := n.cluster.client.CoreV1().Nodes().Get(t.ctx, nodeName, metav1.GetOptions{})
	t.must(err, "reading the node")
	for _, condition := range node.Status.Conditions {
		if condition.Type == "GPUIsolation" {
			t.Errorf("the node's condition was not removed, though its files could not all be: %+v", condition)
		}
	}

	unmount()
	t.must(os.Remove(held), "removing the MPS daemon's directory")
	n.waitNamespaceGone(t, gpuguardNamespace)
	n.removeLeftovers(t, e)
	n.checkNothingLeft(t, e, "after the failed hook and the kustomize cleanup")
}

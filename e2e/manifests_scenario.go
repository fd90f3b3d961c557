// Scenario: every rendering an admin can install, from kustomize (each overlay) and from Helm (the
// defaults and each values file in charts/gpuguard/ci), sent to the real apiserver as a server-side
// dry run with strict field validation, so that an unknown field, a wrong type or a missing required
// field is refused as it would be on install, by the pinned release's own schemas and validation. Then
// `helm install --dry-run=server` of the chart, as an admin runs it against this API server (its version
// and served APIs in .Capabilities), and the repo's kubectl reports the release it was built from.
package main

import (
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

const installNamespace = "gpuguard-system"

func validateManifests(t *T, e *Env) {
	c := e.clusterFor(t)
	c.namespace(t, installNamespace, nil)
	// manifests/uninstall's own namespace, which a dry run of its Namespace does not make for its DaemonSet.
	c.namespace(t, "gpuguard-uninstall", nil)
	version, err := c.client.Discovery().ServerVersion()
	t.must(err, "reading the apiserver's version")

	renderings := map[string][]byte{}
	for _, overlay := range []string{"default", "cert-manager", "webhook-only", "device-plugin", "scheduler-extender", "audit", "monitoring", "uninstall"} {
		renderings["kustomize "+overlay] = e.render(t, overlay)
	}
	valuesFiles, err := filepath.Glob(e.source("charts", "gpuguard", "ci", "*-values.yaml"))
	t.must(err, "listing the chart's values files")
	for _, values := range append([]string{""}, valuesFiles...) {
		args := []string{"template", "gpuguard", e.source("charts", "gpuguard"), "--namespace", installNamespace,
			"--kube-version", version.GitVersion}
		name := "helm defaults"
		if values != "" {
			args = append(args, "-f", values)
			name = "helm " + filepath.Base(values)
		}
		out, err := exec.Command(e.component("helm"), args...).Output()
		if err != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				t.Fatalf("%s: helm template: %v\n%s", name, err, exit.Stderr)
			}
			t.Fatalf("%s: helm template: %v", name, err)
		}
		renderings[name] = out
	}

	names := make([]string, 0, len(renderings))
	for name := range renderings {
		names = append(names, name)
	}
	sort.Strings(names)
	checked, unserved, partly := 0, map[string]bool{}, map[string]bool{}
	for _, name := range names {
		for _, obj := range decodeObjects(t, renderings[name]) {
			gvk := obj.GroupVersionKind()
			mapping, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if meta.IsNoMatchError(err) {
				unserved[gvk.Kind+"."+gvk.Group] = true // cert-manager's kinds: no such API in this cluster
				partly[name] = true
				continue
			}
			t.must(err, "mapping "+gvk.String())
			var client dynamic.ResourceInterface = c.dynamic.Resource(mapping.Resource)
			if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
				client = c.dynamic.Resource(mapping.Resource).Namespace(obj.GetNamespace())
			}
			// A create, under a name of its own so that the objects the install scenarios made do not
			// answer AlreadyExists first; nothing is stored.
			// A CustomResourceDefinition's name is its plural and group, so it keeps it.
			original := obj.GetName()
			if gvk.Kind != "CustomResourceDefinition" {
				obj.SetName(original + "-dry-run")
			}
			_, err = client.Create(t.ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll},
				FieldManager: "gpuguard-e2e-validate", FieldValidation: metav1.FieldValidationStrict})
			if err != nil {
				t.Errorf("%s: %s %s refused: %v", name, gvk.Kind, original, err)
			}
			checked++
		}
	}
	var skipped []string
	for kind := range unserved {
		skipped = append(skipped, kind)
	}
	sort.Strings(skipped)
	t.Logf("%d objects from %d renderings accepted; not served by this apiserver, so not checked: %s",
		checked, len(names), strings.Join(skipped, ", "))
	if checked == 0 {
		t.Errorf("no object was checked")
	}

	// helm install as an admin runs it, for each values file whose kinds this cluster all serves; under a
	// release name of its own, since Helm refuses to take over the objects the install scenarios made.
	kubeconfig := filepath.Join(e.path("control-plane"), "admin.kubeconfig")
	installed := 0
	for _, values := range append([]string{""}, valuesFiles...) {
		name := "helm defaults"
		args := []string{"install", "gpuguard-dry-run", e.source("charts", "gpuguard"), "--namespace", installNamespace,
			"--dry-run=server", "--kubeconfig", kubeconfig}
		if values != "" {
			name = "helm " + filepath.Base(values)
			args = append(args, "-f", values)
		}
		if partly[name] {
			continue
		}
		out, err := exec.Command(e.component("helm"), args...).CombinedOutput()
		if err != nil {
			t.Errorf("%s: helm install --dry-run=server on %s: %v\n%s", name, version.GitVersion, err, out)
		}
		installed++
		// The claim RBAC follows what this API server serves (.Capabilities), not Helm's own defaults.
		rendered, want := strings.Contains(string(out), `apiGroups: ["resource.k8s.io"]`), c.draVersion != ""
		if values == "" && err == nil && rendered != want {
			t.Errorf("helm defaults on %s (DRA served: %q): the claim RBAC is rendered: %v, want %v",
				version.GitVersion, c.draVersion, rendered, want)
		}
	}
	if installed == 0 {
		t.Errorf("no values file was installed with --dry-run=server")
	}
	t.Logf("helm install --dry-run=server on %s: %d of %d values files (the rest need kinds this cluster does not serve)",
		version.GitVersion, installed, len(valuesFiles)+1)

	// The repo's kubectl is stamped as its release is, and reads the server's version as users' copies do.
	out, err := exec.Command(e.component("kubectl"), "version", "-o", "json", "--kubeconfig", kubeconfig).Output()
	t.must(err, "kubectl version")
	var versions struct {
		Client struct{ GitVersion string } `json:"clientVersion"`
		Server struct{ GitVersion string } `json:"serverVersion"`
	}
	t.must(json.Unmarshal(out, &versions), "reading kubectl version's JSON")
	want, err := binaryVersion(filepath.Join(e.cfg.Components, "kube-apiserver"))
	t.must(err, "the pinned kube-apiserver's release")
	if versions.Client.GitVersion != want {
		t.Errorf("kubectl's client version is %q, want the pinned release %q", versions.Client.GitVersion, want)
	}
	if versions.Server.GitVersion != version.GitVersion {
		t.Errorf("kubectl reads the server's version as %q, want %q", versions.Server.GitVersion, version.GitVersion)
	}
}

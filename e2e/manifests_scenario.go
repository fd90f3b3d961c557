// Scenario: every rendering an admin can install, from kustomize (each overlay) and from Helm (the
// defaults and each values file in charts/gpuguard/ci), sent to the real apiserver as a server-side
// dry run with strict field validation, so that an unknown field, a wrong type or a missing required
// field is refused as it would be on install, by the pinned release's own schemas and validation.
package main

import (
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
	version, err := c.client.Discovery().ServerVersion()
	t.must(err, "reading the apiserver's version")

	renderings := map[string][]byte{}
	for _, overlay := range []string{"default", "cert-manager", "webhook-only", "device-plugin", "scheduler-extender"} {
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
	checked, unserved := 0, map[string]bool{}
	for _, name := range names {
		for _, obj := range decodeObjects(t, renderings[name]) {
			gvk := obj.GroupVersionKind()
			mapping, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if meta.IsNoMatchError(err) {
				unserved[gvk.Kind+"."+gvk.Group] = true // cert-manager's kinds: no such API in this cluster
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
}

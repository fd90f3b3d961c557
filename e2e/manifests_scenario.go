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

	corev1 "k8s.io/api/core/v1"
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
	podSecurity(t, e, c, kubeconfig)
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

// podSecurityExemptNamespace is exempt from Pod Security in the API server's admission configuration
// (cluster.go), whatever level its labels name.
const podSecurityExemptNamespace = "e2e-pod-security-exempt"

// podSecurity: helm install into a namespace that enforces Pod Security restricted is refused before
// anything is made, saying what to label, since the DaemonSets' hostPath volumes need privileged; the
// webhook alone installs there; at privileged (manifests/base/namespace.yaml's level) it installs. A
// namespace labelled restricted that the API server's configuration exempts admits a hostPath pod, so
// checkPodSecurity=false, the admin's word for it, installs there; the label alone still refuses.
func podSecurity(t *T, e *Env, c *Cluster, kubeconfig string) {
	install := func(namespace string, extra ...string) (string, error) {
		args := append([]string{"install", "gpuguard-dry-run", e.source("charts", "gpuguard"), "--namespace", namespace,
			"--dry-run=server", "--kubeconfig", kubeconfig}, extra...)
		out, err := exec.Command(e.component("helm"), args...).CombinedOutput()
		return string(out), err
	}
	const restricted, privileged = "e2e-pod-security-restricted", "e2e-pod-security-privileged"
	c.namespace(t, restricted, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
	c.namespace(t, privileged, map[string]string{"pod-security.kubernetes.io/enforce": "privileged"})
	const label = "kubectl label namespace " + restricted + " pod-security.kubernetes.io/enforce=privileged --overwrite"
	if out, err := install(restricted); err == nil || !strings.Contains(out, label) {
		t.Errorf("helm install into a namespace enforcing restricted: %v, %.400s; want the refusal saying %q", err, out, label)
	}
	if out, err := install(restricted, "--set", "devicePlugin.enabled=false", "--set", "hostDevices.enabled=false",
		"--set", "nodeEnforcer.enabled=false"); err != nil {
		t.Errorf("helm install of the webhook alone into a namespace enforcing restricted: %v\n%s", err, out)
	}
	if out, err := install(privileged); err != nil {
		t.Errorf("helm install into a namespace enforcing privileged: %v\n%s", err, out)
	} else if strings.Contains(out, "carried no pod-security.kubernetes.io/enforce label") {
		t.Errorf("helm install into a namespace enforcing privileged: the notes ask for the label:\n%s", out)
	}

	c.namespace(t, podSecurityExemptNamespace, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
	hostPathPod := func(namespace string) error {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "host-path-"}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "reader", Image: "busybox",
				VolumeMounts: []corev1.VolumeMount{{Name: "host", MountPath: "/host", ReadOnly: true}}}},
			Volumes: []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}}}
		_, err := c.client.CoreV1().Pods(namespace).Create(t.ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := hostPathPod(restricted); err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Errorf("a hostPath pod in %s, which enforces restricted: %v; want refused by PodSecurity", restricted, err)
	}
	if err := hostPathPod(podSecurityExemptNamespace); err != nil {
		t.Errorf("a hostPath pod in %s, labelled restricted and exempt by the API server's configuration: %v", podSecurityExemptNamespace, err)
	}
	exemptLabel := "kubectl label namespace " + podSecurityExemptNamespace + " pod-security.kubernetes.io/enforce=privileged"
	if out, err := install(podSecurityExemptNamespace); err == nil || !strings.Contains(out, exemptLabel) {
		t.Errorf("helm install into exempt %s without checkPodSecurity=false: %v, %.400s; want the refusal (its label is all the chart can read)",
			podSecurityExemptNamespace, err, out)
	}
	if out, err := install(podSecurityExemptNamespace, "--set", "checkPodSecurity=false"); err != nil {
		t.Errorf("helm install --set checkPodSecurity=false into exempt %s: %v\n%s", podSecurityExemptNamespace, err, out)
	} else if strings.Contains(out, "pod-security.kubernetes.io/enforce") {
		t.Errorf("helm install --set checkPodSecurity=false: the notes still speak of the namespace's label:\n%s", out)
	}
}

// gpuguard installed as an admin installs it: manifests/default rendered with the pinned kustomize and
// applied through the API. The one change is where the apiserver reaches the webhook: a url on
// 127.0.0.1 instead of the Service, since no kubelet runs the Deployment's pods here. The harness runs
// the webhook binary with the Deployment's own arguments, and plays the kubelet for its volumes: the
// Secret's certificate files and the policy ConfigMap, laid out as the kubelet lays out a ConfigMap.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

const (
	gpuguardNamespace = "gpuguard-system"
	policyConfigMap   = "gpuguard-policy"
	webhookConfig     = "gpuguard"
	// A namespace whose pod exists before gpuguard is installed (the ephemeral-containers scenario).
	olderPodNamespace = "e2e-before-install"
	olderPodName      = "older-than-gpuguard"
)

type webhookInstall struct {
	cluster   *Cluster
	args      []string // the Deployment's container args, with paths and address rewritten
	certs     string
	policyDir string
	port      int
	process   *process
	objects   []*unstructured.Unstructured
}

// webhookFor installs gpuguard on first use and returns the running installation.
func (e *Env) webhookFor(t *T) *webhookInstall {
	c := e.clusterFor(t)
	e.mu.Lock()
	w := e.install
	e.mu.Unlock()
	if w != nil {
		return w
	}
	w = e.installWebhook(t, c)
	e.mu.Lock()
	e.install = w
	e.mu.Unlock()
	return w
}

func (e *Env) installWebhook(t *T, c *Cluster) *webhookInstall {
	c.namespace(t, olderPodNamespace, nil)
	older := podWith(olderPodName, container("app"))
	_, err := c.client.CoreV1().Pods(olderPodNamespace).Create(t.ctx, older, metav1.CreateOptions{})
	t.must(err, "creating a pod before gpuguard is installed")

	w := &webhookInstall{cluster: c, certs: e.path("manifests", "default", "certs"), policyDir: e.path("volumes", "policy")}
	rendered := e.render(t, "default")
	w.objects = decodeObjects(t, rendered)
	w.port = mustFreePort(t)
	url := fmt.Sprintf("https://127.0.0.1:%d/mutate", w.port)

	var webhookConfiguration, backstop []*unstructured.Unstructured
	for _, obj := range w.objects {
		switch obj.GetKind() {
		case "MutatingWebhookConfiguration":
			pointAt(t, obj, url)
			webhookConfiguration = append(webhookConfiguration, obj)
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			backstop = append(backstop, obj)
		case "Deployment":
			if obj.GetName() == "gpuguard-webhook" {
				w.args = shippedArgs(t, obj, map[string]string{
					"tls-cert-file":        filepath.Join(w.certs, "tls.crt"),
					"tls-private-key-file": filepath.Join(w.certs, "tls.key"),
					"policy-dir":           w.policyDir,
					"listen-address":       "127.0.0.1:" + strconv.Itoa(w.port),
				})
			}
		}
	}
	if len(webhookConfiguration) != 1 || w.args == nil {
		t.Fatalf("manifests/default renders %d MutatingWebhookConfigurations and %d webhook Deployments, want 1 each",
			len(webhookConfiguration), map[bool]int{true: 0, false: 1}[w.args == nil])
	}
	// Everything else first (namespace, policy, Deployment, device plugin), so that the webhook starts with
	// the policy from the API; then the admission configuration, once something answers it.
	for _, obj := range w.objects {
		if obj.GetKind() != "MutatingWebhookConfiguration" && !contains(backstop, obj) {
			c.apply(t, obj)
		}
	}
	w.projectPolicy(t)
	// What a pod of the Deployment would have in the cluster: the API's address and CA, and a projected
	// token of its service account, with which it lists and watches DRA claims under the shipped RBAC.
	w.args = append(w.args, "--apiserver-url="+c.server, "--token-file="+c.serviceAccountToken(t, e, "gpuguard-webhook"),
		"--ca-file="+c.caFile)
	w.start(t, e)
	for _, obj := range append(webhookConfiguration, backstop...) {
		c.apply(t, obj)
	}
	w.waitUntilPatching(t)
	return w
}

// render copies manifests/ to the working directory, generates the overlay's certificates there with
// certs/generate.sh, and renders the overlay with the pinned kustomize.
func (e *Env) render(t *T, overlay string) []byte {
	copyDir := e.path("manifests")
	if _, err := os.Stat(copyDir); errors.Is(err, os.ErrNotExist) {
		t.must(exec.Command("cp", "-r", e.source("manifests"), copyDir).Run(), "copying manifests/")
		for _, service := range []struct{ overlay, name string }{{"default", "gpuguard-webhook"}, {"scheduler-extender", "gpuguard-scheduler-extender"}} {
			out, err := exec.Command(e.source("certs", "generate.sh"), "--out", filepath.Join(copyDir, service.overlay, "certs"),
				"--service", service.name, "--force").CombinedOutput()
			if err != nil {
				t.Fatalf("certs/generate.sh for %s: %v\n%s", service.name, err, out)
			}
		}
	}
	out, err := exec.Command(e.component("kustomize"), "build", filepath.Join(copyDir, overlay)).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("kustomize build %s: %v\n%s", overlay, err, exit.Stderr)
		}
		t.Fatalf("kustomize build %s: %v", overlay, err)
	}
	return out
}

func decodeObjects(t *T, rendered []byte) []*unstructured.Unstructured {
	var objects []*unstructured.Unstructured
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(rendered), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := decoder.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objects
			}
			t.Fatalf("decoding rendered manifests: %v", err)
		}
		if len(obj.Object) > 0 {
			objects = append(objects, obj)
		}
	}
}

func contains(list []*unstructured.Unstructured, obj *unstructured.Unstructured) bool {
	for _, o := range list {
		if o == obj {
			return true
		}
	}
	return false
}

// pointAt replaces clientConfig.service by url in every webhook of the configuration, keeping the
// caBundle that kustomize filled from the generated CA.
func pointAt(t *T, obj *unstructured.Unstructured, url string) {
	webhooks, _, err := unstructured.NestedSlice(obj.Object, "webhooks")
	t.must(err, "reading webhooks")
	for _, item := range webhooks {
		hook := item.(map[string]any)
		config := hook["clientConfig"].(map[string]any)
		if ca, _ := config["caBundle"].(string); ca == "" {
			t.Fatalf("the rendered webhook %v has no caBundle", hook["name"])
		}
		delete(config, "service")
		config["url"] = url
	}
	t.must(unstructured.SetNestedSlice(obj.Object, webhooks, "webhooks"), "setting webhooks")
}

// shippedArgs returns the first container's arguments of a rendered Deployment, with the values of the
// named flags replaced: volume paths by the harness's copies, listeners by 127.0.0.1. References to the
// container's environment, $(NAME), are expanded as the kubelet expands them (containerEnv).
func shippedArgs(t *T, deployment *unstructured.Unstructured, replace map[string]string) []string {
	containers, _, err := unstructured.NestedSlice(deployment.Object, "spec", "template", "spec", "containers")
	t.must(err, "reading Deployment "+deployment.GetName())
	container := containers[0].(map[string]any)
	env := containerEnv(t, container)
	var args []string
	for _, a := range container["args"].([]any) {
		arg := expandEnv(a.(string), env)
		if name, _, ok := strings.Cut(strings.TrimPrefix(arg, "--"), "="); ok {
			if value, replaced := replace[name]; replaced {
				arg = "--" + name + "=" + value
			}
		}
		args = append(args, arg)
	}
	return args
}

// containerEnv is the container's environment as the kubelet would set it, for what the manifests use:
// plain values, and a resourceFieldRef to the container's own limits.memory (in bytes); a fieldRef (the
// pod's name or namespace) is left to whoever starts the process.
func containerEnv(t *T, container map[string]any) map[string]string {
	env := map[string]string{}
	entries, _, _ := unstructured.NestedSlice(container, "env")
	for _, e := range entries {
		entry := e.(map[string]any)
		name := entry["name"].(string)
		if value, ok := entry["value"].(string); ok {
			env[name] = value
			continue
		}
		// The pod's own name and namespace: whoever starts the process sets them.
		if _, isPodField, _ := unstructured.NestedString(entry, "valueFrom", "fieldRef", "fieldPath"); isPodField {
			continue
		}
		field, found, _ := unstructured.NestedString(entry, "valueFrom", "resourceFieldRef", "resource")
		if !found || field != "limits.memory" {
			t.Fatalf("container env %s: only values, fieldRefs and resourceFieldRef limits.memory are read here", name)
		}
		limit, _, _ := unstructured.NestedString(container, "resources", "limits", "memory")
		quantity, err := resource.ParseQuantity(limit)
		t.must(err, "reading the container's limits.memory")
		env[name] = strconv.FormatInt(quantity.Value(), 10)
	}
	return env
}

var envReference = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandEnv replaces $(NAME) by the variable's value where it is defined, as the kubelet does in args.
func expandEnv(arg string, env map[string]string) string {
	return envReference.ReplaceAllStringFunc(arg, func(reference string) string {
		if value, ok := env[reference[2:len(reference)-1]]; ok {
			return value
		}
		return reference
	})
}

// apply is `kubectl apply --server-side` of one object.
func (c *Cluster) apply(t *T, obj *unstructured.Unstructured) {
	gvk := obj.GroupVersionKind()
	mapping, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		c.mapper.Reset()
		mapping, err = c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	t.must(err, "mapping "+gvk.String())
	resource := c.dynamic.Resource(mapping.Resource)
	var client dynamic.ResourceInterface = resource
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		client = resource.Namespace(obj.GetNamespace())
	}
	_, err = client.Apply(t.ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "gpuguard-e2e", Force: true})
	t.must(err, fmt.Sprintf("applying %s %s", gvk.Kind, obj.GetName()))
}

// start runs the webhook binary with the shipped arguments and waits for /readyz.
func (w *webhookInstall) start(t *T, e *Env) {
	p, err := e.start("gpuguard-webhook", e.gpuguard("gpuguard-webhook"), w.args...)
	t.must(err, "starting gpuguard-webhook")
	w.process = p
	client := w.httpClient(t)
	t.must(eventually(t.ctx, 30*time.Second, func() error {
		if err := p.alive(); err != nil {
			return err
		}
		resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/readyz", w.port))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	}), "waiting for gpuguard-webhook to be ready")
}

func (w *webhookInstall) stop() {
	if w.process != nil {
		w.process.stop()
		w.process = nil
	}
}

func (w *webhookInstall) httpClient(t *T) *http.Client {
	ca, err := os.ReadFile(filepath.Join(w.certs, "ca.crt"))
	t.must(err, "reading the webhook CA")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// policyReloads reads gpuguard_policy_reloads_total{result="success"} from the webhook's /metrics. It
// tells the harness when a projected policy is in force, as the kubelet's sync would be waited for.
func (w *webhookInstall) policyReloads(t *T) (int, error) {
	return scrape(w.httpClient(t), fmt.Sprintf("https://127.0.0.1:%d/metrics", w.port), policyReloadsSeries)
}

const policyReloadsSeries = `gpuguard_policy_reloads_total{result="success"}`

// projectPolicy writes the policy ConfigMap, as the API holds it, into the policy volume the way the
// kubelet does: the keys in a new timestamped directory, `..data` swapped to it atomically, and one
// symlink per key through `..data`.
func (w *webhookInstall) projectPolicy(t *T) {
	cm, err := w.cluster.client.CoreV1().ConfigMaps(gpuguardNamespace).Get(t.ctx, policyConfigMap, metav1.GetOptions{})
	t.must(err, "reading the policy ConfigMap")
	t.must(os.MkdirAll(w.policyDir, 0o755), "creating the policy volume")
	generation := ".." + time.Now().UTC().Format("2006_01_02_15_04_05.000000000")
	t.must(os.Mkdir(filepath.Join(w.policyDir, generation), 0o755), "creating a volume generation")
	for key, value := range cm.Data {
		t.must(os.WriteFile(filepath.Join(w.policyDir, generation, key), []byte(value), 0o644), "writing "+key)
	}
	previous, _ := os.Readlink(filepath.Join(w.policyDir, "..data"))
	t.must(os.Symlink(generation, filepath.Join(w.policyDir, "..data_tmp")), "linking ..data_tmp")
	t.must(os.Rename(filepath.Join(w.policyDir, "..data_tmp"), filepath.Join(w.policyDir, "..data")), "swapping ..data")
	entries, err := os.ReadDir(w.policyDir)
	t.must(err, "listing the policy volume")
	for _, entry := range entries {
		if name := entry.Name(); !strings.HasPrefix(name, "..") {
			if _, kept := cm.Data[name]; !kept {
				os.Remove(filepath.Join(w.policyDir, name))
			}
		}
	}
	for key := range cm.Data {
		link := filepath.Join(w.policyDir, key)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			t.must(os.Symlink(filepath.Join("..data", key), link), "linking "+key)
		}
	}
	if previous != "" {
		os.RemoveAll(filepath.Join(w.policyDir, previous))
	}
}

// setPolicy changes keys of the policy ConfigMap through the API (a merge patch; an empty value removes
// the key), projects it, and waits until the running webhook has loaded it.
func (w *webhookInstall) setPolicy(t *T, data map[string]*string) {
	before, err := w.policyReloads(t)
	t.must(err, "reading the webhook's metrics")
	patch := map[string]any{"data": data}
	body, err := json.Marshal(patch)
	t.must(err, "encoding the policy patch")
	_, err = w.cluster.client.CoreV1().ConfigMaps(gpuguardNamespace).Patch(t.ctx, policyConfigMap, types.MergePatchType, body, metav1.PatchOptions{})
	t.must(err, "patching the policy ConfigMap")
	w.projectPolicy(t)
	t.must(eventually(t.ctx, 15*time.Second, func() error {
		after, err := w.policyReloads(t)
		if err != nil {
			return err
		}
		if after <= before {
			return fmt.Errorf("the webhook has not reloaded its policy (%d successful reloads)", after)
		}
		return nil
	}), "waiting for the webhook to load the policy")
}

// defaultPolicy puts the shipped ConfigMap back.
func (w *webhookInstall) defaultPolicy(t *T) {
	for _, obj := range w.objects {
		if obj.GetKind() == "ConfigMap" && obj.GetName() == policyConfigMap {
			data, _, _ := unstructured.NestedStringMap(obj.Object, "data")
			patch := map[string]*string{}
			current, err := w.cluster.client.CoreV1().ConfigMaps(gpuguardNamespace).Get(t.ctx, policyConfigMap, metav1.GetOptions{})
			t.must(err, "reading the policy ConfigMap")
			if mapsEqual(current.Data, data) {
				return
			}
			for key := range current.Data {
				patch[key] = nil
			}
			for key, value := range data {
				patch[key] = ptr(value)
			}
			w.setPolicy(t, patch)
			return
		}
	}
	t.Fatalf("manifests/default has no %s ConfigMap", policyConfigMap)
}

// waitUntilPatching waits until the apiserver calls the webhook: the webhook configuration is picked up
// by an informer, so a dry-run create is repeated until its answer carries the patch.
func (w *webhookInstall) waitUntilPatching(t *T) {
	c := w.cluster
	c.namespace(t, "e2e-probe", nil)
	t.must(eventually(t.ctx, time.Minute, func() error {
		if err := w.process.alive(); err != nil {
			return err
		}
		pod, err := c.client.CoreV1().Pods("e2e-probe").Create(t.ctx, podWith("probe", container("app")),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		if got := visibleDevices(pod.Spec.Containers[0]); got != "none" {
			return fmt.Errorf("a dry-run pod is stored with NVIDIA_VISIBLE_DEVICES %s", got)
		}
		return nil
	}), "waiting for the apiserver to call gpuguard-webhook")
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func ptr[V any](v V) *V { return &v }

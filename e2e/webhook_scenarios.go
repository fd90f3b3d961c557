// Scenarios 1 to 5: the webhook as shipped, behind the real apiserver's admission chain.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const privilegedWarning = "is privileged and sees every GPU whatever NVIDIA_VISIBLE_DEVICES says"

// expectEnv checks each named container of a stored pod against its expected NVIDIA_VISIBLE_DEVICES.
func expectEnv(t *T, pod *corev1.Pod, want map[string]string) {
	all := append(append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...), ephemeralAsContainers(pod)...)
	seen := map[string]bool{}
	for _, c := range all {
		expected, ok := want[c.Name]
		if !ok {
			continue
		}
		seen[c.Name] = true
		if got := visibleDevices(c); got != expected {
			t.Errorf("pod %s, container %s: stored NVIDIA_VISIBLE_DEVICES is %s, want %s", pod.Name, c.Name, got, expected)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("pod %s: no container %s was stored", pod.Name, name)
		}
	}
}

func ephemeralAsContainers(pod *corev1.Pod) []corev1.Container {
	var out []corev1.Container
	for _, e := range pod.Spec.EphemeralContainers {
		out = append(out, corev1.Container{Name: e.Name, Env: e.Env})
	}
	return out
}

func webhookAsShipped(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	const ns = "e2e-shipped"
	c.namespace(t, ns, nil)
	client := c.clientCollectingWarnings(t)

	cases := []struct {
		pod      *corev1.Pod
		want     map[string]string
		warnings []string // each must appear among the Warning headers
	}{
		{podWith("no-env", container("app")), map[string]string{"app": "none"}, nil},
		{podWith("user-all", container("app", withEnv(envVariable, "all"), withEnv("KEEP", "1"))), map[string]string{"app": "none"},
			[]string{`container "app": NVIDIA_VISIBLE_DEVICES set in the pod was replaced with "none"`}},
		{podWith("value-from", container("app", withEnvFromConfigMap(envVariable, "gpus", "list"))), map[string]string{"app": "none"}, nil},
		{podWith("gpu-one", container("app", withLimit(gpuResource, "1"), withEnv(envVariable, "all"))), map[string]string{"app": "unset"},
			[]string{`container "app": NVIDIA_VISIBLE_DEVICES set in the pod was removed; the device plugin assigns GPUs`}},
		{podWith("gpu-zero", container("app", withLimit(gpuResource, "0"))), map[string]string{"app": "none"}, nil},
		{podWith("mig", container("app", withLimit("nvidia.com/mig-1g.10gb", "1"))), map[string]string{"app": "unset"}, nil},
		{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "init"}, Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{container("setup")},
			Containers:     []corev1.Container{container("train", withLimit(gpuResource, "2")), container("logger")}}},
			map[string]string{"setup": "none", "train": "unset", "logger": "none"}, nil},
		{podWith("privileged", container("app", withPrivileged())), map[string]string{"app": "none"},
			[]string{`container "app" ` + privilegedWarning}},
		{podWith("privileged-gpu", container("train", withLimit(gpuResource, "1"), withPrivileged())), map[string]string{"train": "unset"},
			[]string{`container "train" is privileged and sees every GPU, not only those it requested`}},
		{podWith("env-from-gpu", container("train", withLimit(gpuResource, "1"), withEnvFrom("settings", ""))), map[string]string{"train": "unset"},
			[]string{`container "train": envFrom configMap "settings" could set NVIDIA_VISIBLE_DEVICES and widen its GPUs`}},
		// Admitted by the backstop too: the fraction container is a GPU user there as well.
		{fractionalGPUPod("fractional"), map[string]string{"main": "valueFrom", "logger": "none"}, nil},
	}
	for _, tc := range cases {
		stored, err := client.CoreV1().Pods(ns).Create(t.ctx, tc.pod, metav1.CreateOptions{})
		warnings := client.take()
		if err != nil {
			t.Errorf("creating pod %s: %v", tc.pod.Name, err)
			continue
		}
		// What was stored, read back rather than taken from the create's answer.
		stored, err = c.client.CoreV1().Pods(ns).Get(t.ctx, stored.Name, metav1.GetOptions{})
		t.must(err, "reading pod "+tc.pod.Name)
		expectEnv(t, stored, tc.want)
		for _, want := range tc.warnings {
			if !slices.Contains(warnings, want) {
				t.Errorf("pod %s: the client got warnings [%s], want one to be %q", tc.pod.Name, joinLines(warnings), want)
			}
		}
		if tc.pod.Name == "user-all" && !slices.Equal(otherEnv(stored.Spec.Containers[0]), []string{"KEEP"}) {
			t.Errorf("pod user-all: other env entries became %v, want [KEEP]", otherEnv(stored.Spec.Containers[0]))
		}
	}

	// Pods a controller creates go through the same admission.
	labels := map[string]string{"app": "e2e-deployment"}
	deployment := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{container("app"), container("gpu", withLimit(gpuResource, "1"))}}},
		},
	}
	_, err := c.client.AppsV1().Deployments(ns).Create(t.ctx, deployment, metav1.CreateOptions{})
	t.must(err, "creating a Deployment")
	var pods *corev1.PodList
	t.must(eventually(t.ctx, time.Minute, func() error {
		pods, err = c.client.CoreV1().Pods(ns).List(t.ctx, metav1.ListOptions{LabelSelector: "app=e2e-deployment"})
		if err != nil {
			return err
		}
		if len(pods.Items) != 2 {
			return fmt.Errorf("the Deployment has %d pods, want 2", len(pods.Items))
		}
		return nil
	}), "waiting for the Deployment's pods")
	for i := range pods.Items {
		expectEnv(t, &pods.Items[i], map[string]string{"app": "none", "gpu": "unset"})
	}
}

func ephemeralContainers(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	const ns = "e2e-ephemeral"
	c.namespace(t, ns, nil)
	_, err := c.client.CoreV1().Pods(ns).Create(t.ctx, podWith("target", container("app")), metav1.CreateOptions{})
	t.must(err, "creating the target pod")

	for _, target := range []struct{ namespace, name, appEnv string }{
		{ns, "target", "none"},
		// Created before gpuguard was installed: its own containers stay as they were.
		{olderPodNamespace, olderPodName, "unset"},
	} {
		pod, err := c.client.CoreV1().Pods(target.namespace).Get(t.ctx, target.name, metav1.GetOptions{})
		t.must(err, "reading pod "+target.name)
		// What `kubectl debug -it POD --image=busybox --target=app` sends.
		pod.Spec.EphemeralContainers = append(pod.Spec.EphemeralContainers, corev1.EphemeralContainer{
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "busybox", Stdin: true, TTY: true,
				TerminationMessagePolicy: corev1.TerminationMessageReadFile, ImagePullPolicy: corev1.PullIfNotPresent},
			TargetContainerName: "app",
		})
		_, err = c.client.CoreV1().Pods(target.namespace).UpdateEphemeralContainers(t.ctx, target.name, pod, metav1.UpdateOptions{})
		if err != nil {
			t.Errorf("adding an ephemeral container to %s/%s: %v", target.namespace, target.name, err)
			continue
		}
		stored, err := c.client.CoreV1().Pods(target.namespace).Get(t.ctx, target.name, metav1.GetOptions{})
		t.must(err, "reading pod "+target.name)
		expectEnv(t, stored, map[string]string{"debugger": "none", "app": target.appEnv})
	}
}

// sidecarInjector is a second mutating webhook, ordered after gpuguard's (configurations are called in
// name order), that adds a container without any env to the pods labelled for it.
type sidecarInjector struct {
	server *http.Server
	url    string
}

const sidecarLabel = "e2e.gpuguard.io/inject"

func startSidecarInjector(t *T, e *Env, c *Cluster) *sidecarInjector {
	certFile, keyFile := e.path("control-plane", "sidecar.crt"), e.path("control-plane", "sidecar.key")
	t.must(c.ca.issue(certFile, keyFile, "localhost"), "issuing the sidecar injector's certificate")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	t.must(err, "loading the sidecar injector's certificate")
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	t.must(err, "listening for the sidecar injector")
	mux := http.NewServeMux()
	mux.HandleFunc("/inject", func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
			http.Error(rw, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		var pod corev1.Pod
		response := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		if json.Unmarshal(review.Request.Object.Raw, &pod) == nil && !slices.ContainsFunc(pod.Spec.Containers,
			func(c corev1.Container) bool { return c.Name == "sidecar" }) {
			patch, _ := json.Marshal([]map[string]any{{"op": "add", "path": "/spec/containers/-",
				"value": map[string]any{"name": "sidecar", "image": "busybox"}}})
			response.Patch = patch
			response.PatchType = ptr(admissionv1.PatchTypeJSONPatch)
		}
		review.Response = response
		review.Request = nil
		out, _ := json.Marshal(review)
		rw.Header().Set("Content-Type", "application/json")
		rw.Write(out)
	})
	server := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ReadHeaderTimeout: 5 * time.Second}
	go server.ServeTLS(listener, "", "")
	return &sidecarInjector{server: server, url: "https://" + listener.Addr().String() + "/inject"}
}

func reinvocation(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	const ns = "e2e-reinvocation"
	c.namespace(t, ns, nil)
	injector := startSidecarInjector(t, e, c)
	defer injector.server.Close()

	config := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "zz-e2e-sidecar-injector"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "sidecar.e2e.gpuguard.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &injector.url, CABundle: c.caPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{sidecarLabel: "sidecar"}},
			SideEffects:             ptr(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			FailurePolicy:           ptr(admissionregistrationv1.Fail),
			ReinvocationPolicy:      ptr(admissionregistrationv1.NeverReinvocationPolicy),
			TimeoutSeconds:          ptr(int32(5)),
		}},
	}
	_, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(t.ctx, config, metav1.CreateOptions{})
	t.must(err, "creating the sidecar injector's configuration")
	defer c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), config.Name, metav1.DeleteOptions{})

	labelled := func(name string) *corev1.Pod {
		pod := podWith(name, container("app"))
		pod.Labels = map[string]string{sidecarLabel: "sidecar"}
		return pod
	}
	t.must(eventually(t.ctx, time.Minute, func() error {
		pod, err := c.client.CoreV1().Pods(ns).Create(t.ctx, labelled("probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		if len(pod.Spec.Containers) != 2 {
			return fmt.Errorf("the injector has not run yet")
		}
		return nil
	}), "waiting for the sidecar injector to be called")

	_, err = c.client.CoreV1().Pods(ns).Create(t.ctx, labelled("reinvoked"), metav1.CreateOptions{})
	t.must(err, "creating a pod the injector adds a container to")
	stored, err := c.client.CoreV1().Pods(ns).Get(t.ctx, "reinvoked", metav1.GetOptions{})
	t.must(err, "reading the pod")
	expectEnv(t, stored, map[string]string{"app": "none", "sidecar": "none"})

	// The apiserver records each webhook call of each round; gpuguard must have mutated in round 1, the
	// reinvocation, since the sidecar did not exist when it first ran.
	reinvoked := false
	for key, value := range c.auditAnnotations(t, ns, "reinvoked", "") {
		if !strings.HasPrefix(key, "mutation.webhook.admission.k8s.io/round_1_") {
			continue
		}
		var call struct {
			Configuration string `json:"configuration"`
			Mutated       bool   `json:"mutated"`
		}
		if json.Unmarshal([]byte(value), &call) == nil && call.Configuration == webhookConfig && call.Mutated {
			reinvoked = true
		}
	}
	if !reinvoked {
		t.Errorf("the audit log does not show gpuguard mutating the pod when reinvoked (round 1)")
	}
}

func policyModes(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	const ns, exempt = "e2e-policy", "e2e-exempt"
	c.namespace(t, ns, nil)
	c.namespace(t, exempt, nil)
	defer w.defaultPolicy(t)
	client := c.clientCollectingWarnings(t)
	create := func(namespace string, pod *corev1.Pod) (*corev1.Pod, []string, error) {
		stored, err := client.CoreV1().Pods(namespace).Create(t.ctx, pod, metav1.CreateOptions{})
		return stored, client.take(), err
	}

	w.setPolicy(t, map[string]*string{"mode": ptr("strict")})
	_, _, err := create(ns, podWith("strict-user-value", container("app", withEnv(envVariable, "all"))))
	const strictMessage = `container "app" sets NVIDIA_VISIBLE_DEVICES itself, which policy mode strict does not allow`
	if err == nil || !strings.Contains(err.Error(), strictMessage) || !strings.Contains(err.Error(), `admission webhook "visible-devices.gpuguard.io" denied the request`) {
		t.Errorf("strict: creating a pod that sets the variable gave %v, want a denial saying %q", err, strictMessage)
	}
	if stored, _, err := create(ns, podWith("strict-clean", container("app"))); err != nil {
		t.Errorf("strict: a pod that does not set the variable was refused: %v", err)
	} else {
		expectEnv(t, stored, map[string]string{"app": "none"})
	}

	_, _, err = create(ns, podWith("strict-env-from", container("train", withLimit(gpuResource, "1"), withEnvFrom("settings", ""))))
	const envFromMessage = `container "train" takes variables from configMap "settings" (envFrom), which could set NVIDIA_VISIBLE_DEVICES`
	if err == nil || !strings.Contains(err.Error(), envFromMessage) {
		t.Errorf("strict: creating a GPU pod with an envFrom gave %v, want a denial saying %q", err, envFromMessage)
	}

	w.setPolicy(t, map[string]*string{"mode": ptr("audit")})
	stored, warnings, err := create(ns, podWith("audited", container("app")))
	t.must(err, "audit: creating a pod")
	expectEnv(t, stored, map[string]string{"app": "unset"})
	if want := `audit: container "app" would get NVIDIA_VISIBLE_DEVICES=none`; !slices.Contains(warnings, want) {
		t.Errorf("audit: the client got warnings [%s], want %q", joinLines(warnings), want)
	}
	if got := c.auditAnnotations(t, ns, "audited", "")["visible-devices.gpuguard.io/would-patch"]; got != "app" {
		t.Errorf("audit: the audit log has visible-devices.gpuguard.io/would-patch=%q, want \"app\"", got)
	}

	w.setPolicy(t, map[string]*string{"mode": ptr("off")})
	stored, warnings, err = create(ns, podWith("off", container("app", withPrivileged())))
	t.must(err, "off: creating a pod")
	expectEnv(t, stored, map[string]string{"app": "unset"})
	if len(warnings) != 0 {
		t.Errorf("off: the client got warnings [%s], want none", joinLines(warnings))
	}

	// The backstop reads the same ConfigMap through its own informer: an exempt pod is admitted by it too
	// once it has seen the change, so the first creates are dry runs until one passes.
	w.setPolicy(t, map[string]*string{"mode": ptr("enforce"), "exemptNamespaces": ptr(exempt), "exemptServiceAccounts": ptr(ns + "/dcgm-exporter")})
	_, err = c.client.CoreV1().ServiceAccounts(ns).Create(t.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "dcgm-exporter"}}, metav1.CreateOptions{})
	t.must(err, "creating a service account")
	exporter := podWith("exporter", container("app"))
	exporter.Spec.ServiceAccountName = "dcgm-exporter"
	for _, tc := range []struct {
		namespace string
		pod       *corev1.Pod
		want      string
	}{
		{exempt, podWith("exempt-namespace", container("app")), "unset"},
		{ns, exporter, "unset"},
		{ns, podWith("default-account", container("app")), "none"},
	} {
		t.must(eventually(t.ctx, 30*time.Second, func() error {
			_, err := c.client.CoreV1().Pods(tc.namespace).Create(t.ctx, tc.pod.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}), "exemptions: waiting for pod "+tc.pod.Name+" to be admitted")
		stored, _, err := create(tc.namespace, tc.pod)
		if err != nil {
			t.Errorf("exemptions: creating pod %s: %v", tc.pod.Name, err)
			continue
		}
		expectEnv(t, stored, map[string]string{"app": tc.want})
	}

	w.setPolicy(t, map[string]*string{"exemptNamespaces": ptr(""), "exemptServiceAccounts": ptr(""), "privileged": ptr("deny")})
	_, _, err = create(ns, podWith("privileged-denied", container("app", withPrivileged())))
	const privilegedMessage = `container "app" is privileged without requesting a GPU`
	if err == nil || !strings.Contains(err.Error(), privilegedMessage) {
		t.Errorf("privileged: deny: creating a privileged pod gave %v, want a denial saying %q", err, privilegedMessage)
	}
	_, _, err = create(ns, podWith("privileged-gpu-denied", container("train", withLimit(gpuResource, "1"), withPrivileged())))
	const privilegedGPUMessage = `container "train" is privileged, so it would see every GPU on the node, not only those it requested`
	if err == nil || !strings.Contains(err.Error(), privilegedGPUMessage) {
		t.Errorf("privileged: deny: creating a privileged GPU pod gave %v, want a denial saying %q", err, privilegedGPUMessage)
	}
}

func failurePolicyAndBackstop(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	const ns = "e2e-failure"
	c.namespace(t, ns, nil)
	setFailurePolicy := func(policy admissionregistrationv1.FailurePolicyType) error {
		patch := fmt.Sprintf(`[{"op":"replace","path":"/webhooks/0/failurePolicy","value":%q}]`, policy)
		_, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(t.ctx, webhookConfig, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	defer func() {
		if w.process == nil {
			w.start(t, e)
		}
		if err := setFailurePolicy(admissionregistrationv1.Fail); err != nil {
			t.Errorf("restoring failurePolicy: Fail: %v", err)
		}
	}()

	w.stop()
	t.must(eventually(t.ctx, 30*time.Second, func() error {
		_, err := c.client.CoreV1().Pods(ns).Create(t.ctx, podWith("webhook-down", container("app")), metav1.CreateOptions{})
		if err == nil {
			c.client.CoreV1().Pods(ns).Delete(t.ctx, "webhook-down", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
			return fmt.Errorf("a pod was admitted while the webhook is down under failurePolicy: Fail")
		}
		if !strings.Contains(err.Error(), `failed calling webhook "visible-devices.gpuguard.io"`) {
			return fmt.Errorf("unexpected refusal: %v", err)
		}
		return nil
	}), "webhook down, failurePolicy: Fail")
	systemPod := podWith("while-webhook-down", container("app"))
	if _, err := c.client.CoreV1().Pods("kube-system").Create(t.ctx, systemPod, metav1.CreateOptions{}); err != nil {
		t.Errorf("webhook down: a pod in kube-system was refused: %v", err)
	}

	t.must(setFailurePolicy(admissionregistrationv1.Ignore), "switching to failurePolicy: Ignore")
	const backstopMessage = "ValidatingAdmissionPolicy 'gpuguard-visible-devices' with binding 'gpuguard-visible-devices' denied request: " +
		"gpuguard: containers that request no GPU must set NVIDIA_VISIBLE_DEVICES=none (the gpuguard webhook adds it; was it unreachable?): app"
	if err := eventually(t.ctx, 30*time.Second, func() error {
		_, err := c.client.CoreV1().Pods(ns).Create(t.ctx, podWith("unprotected", container("app")), metav1.CreateOptions{})
		if err == nil {
			return fmt.Errorf("a pod without the variable was admitted with the webhook down and failurePolicy: Ignore")
		}
		if !strings.Contains(err.Error(), backstopMessage) {
			return fmt.Errorf("refused, but not by the backstop: %v", err)
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
			return fmt.Errorf("the backstop's refusal has status %v", apierrors.ReasonForError(err))
		}
		return nil
	}); err != nil {
		t.Errorf("failurePolicy: Ignore, webhook down: %v", err)
	}
	carried, err := c.client.CoreV1().Pods(ns).Create(t.ctx, podWith("carries-value", container("app", withEnv(envVariable, "none"))), metav1.CreateOptions{})
	if err != nil {
		t.Errorf("failurePolicy: Ignore, webhook down: a pod that already carries the value was refused: %v", err)
	} else {
		expectEnv(t, carried, map[string]string{"app": "none"})
		// The backstop covers kubectl debug too: a new ephemeral container without the value is refused.
		carried.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "debugger", Image: "busybox", TerminationMessagePolicy: corev1.TerminationMessageReadFile, ImagePullPolicy: corev1.PullIfNotPresent}}}
		_, err := c.client.CoreV1().Pods(ns).UpdateEphemeralContainers(t.ctx, carried.Name, carried, metav1.UpdateOptions{})
		if err == nil || !strings.Contains(err.Error(), "gpuguard: containers that request no GPU must set NVIDIA_VISIBLE_DEVICES=none") {
			t.Errorf("failurePolicy: Ignore, webhook down: adding an ephemeral container without the value gave %v, want the backstop's refusal", err)
		}
	}

	w.start(t, e)
	t.must(eventually(t.ctx, 30*time.Second, func() error {
		pod, err := c.client.CoreV1().Pods(ns).Create(t.ctx, podWith("webhook-back", container("app")), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		if got := visibleDevices(pod.Spec.Containers[0]); got != "none" {
			return fmt.Errorf("admitted with NVIDIA_VISIBLE_DEVICES %s", got)
		}
		return nil
	}), "webhook back")
	stored, err := c.client.CoreV1().Pods(ns).Create(t.ctx, podWith("webhook-back", container("app")), metav1.CreateOptions{})
	if err != nil {
		t.Errorf("webhook back: %v", err)
	} else {
		expectEnv(t, stored, map[string]string{"app": "none"})
	}
}

// backstopPodUpdates: the backstop judges pod UPDATEs that change annotations, which the webhook never sees,
// on the real API server: a pod held by a scheduling gate may not be given the NRI toleration or gpuguard's
// allocation key after its admission; a label, or another annotation, is changed as before.
func backstopPodUpdates(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	const ns = "e2e-pod-updates"
	c.namespace(t, ns, nil)
	pods := c.client.CoreV1().Pods(ns)
	made := 0
	gated := func() string {
		made++
		pod := podWith(fmt.Sprintf("gated-%d", made), container("app"))
		pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "gpuguard.io/e2e-held"}}
		_, err := pods.Create(t.ctx, pod, metav1.CreateOptions{})
		t.must(err, "creating a gated pod")
		return pod.Name
	}
	defer pods.DeleteCollection(t.ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}, metav1.ListOptions{})
	update := func(name, patch string) error {
		_, err := pods.Patch(t.ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	for _, tc := range []struct{ patch, refusal string }{
		{`{"metadata":{"annotations":{"tolerate-missing-nri-plugins.noderesource.dev":"true"}}}`, "would let the pod's containers start without gpuguard-node-enforcer"},
		{`{"metadata":{"annotations":{"gpuguard.io/allocated-gpus":"GPU-1"}}}`, "a pod may not carry it"},
	} {
		// A fresh pod each try: the API server's policy informer takes a new policy within a second or so.
		t.must(eventually(t.ctx, 30*time.Second, func() error {
			err := update(gated(), tc.patch)
			if err == nil || !strings.Contains(err.Error(), tc.refusal) {
				return fmt.Errorf("an UPDATE %s: %v; want the backstop's refusal %q", tc.patch, err, tc.refusal)
			}
			return nil
		}), "an UPDATE the backstop refuses")
	}
	name := gated()
	for _, patch := range []string{`{"metadata":{"labels":{"team":"a"}}}`, `{"metadata":{"annotations":{"note":"fine"}}}`} {
		if err := update(name, patch); err != nil {
			t.Errorf("an UPDATE %s: %v; want it through", patch, err)
		}
	}
}

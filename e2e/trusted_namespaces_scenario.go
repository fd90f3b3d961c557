// The guards of the trusted and the ignored namespaces on the real API server: the namespaces gpuguard
// never looks at, where the node enforcer exempts the GPU infrastructure, cannot be claimed by a tenant who
// may create namespaces, and the opt-out label cannot be taken by one who may label them; both still can
// be by an admin or a controller bound to the shipped role.
package main

import (
	"fmt"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	trustedRefusal = "is trusted with every GPU"
	ignoreLabel    = "gpuguard.io/ignore"
	ignoreRefusal  = "adding it or changing its value takes create on ignorednamespaces.gpuguard.io"
)

// trustedNamespaces: a tenant's account that may create any namespace creates (dry run) an ordinary one,
// but not gpu-operator, nvidia-device-plugin, dra-driver-nvidia-gpu, nvidia-dra-driver-gpu or
// gpuguard-system, refused with the guard's message; the admin may; bound to
// gpuguard-trusted-namespaces-creator, so may the tenant's. Then the opt-out label (ignoredNamespaces).
func trustedNamespaces(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	const tenant, account = "e2e-tenant", "namespace-maker"
	c.namespace(t, tenant, nil)
	_, err := c.client.CoreV1().ServiceAccounts(tenant).Create(t.ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: account}}, metav1.CreateOptions{})
	t.must(err, "creating the tenant's account")
	rbac := c.client.RbacV1()
	_, err = rbac.ClusterRoles().Create(t.ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-namespace-maker"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces", "namespaces/status", "namespaces/finalize"}, Verbs: []string{"create", "patch", "update"}}}},
		metav1.CreateOptions{})
	t.must(err, "creating the tenant's role")
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: account, Namespace: tenant}}
	bind := func(name, role string) {
		_, err := rbac.ClusterRoleBindings().Create(t.ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role}, Subjects: subject},
			metav1.CreateOptions{})
		t.must(err, "binding the tenant's account to "+role)
	}
	bind("e2e-namespace-maker", "e2e-namespace-maker")
	defer func() {
		for _, name := range []string{"e2e-namespace-maker", "e2e-trusted-creator", "e2e-ignored-labeller"} {
			_ = rbac.ClusterRoleBindings().Delete(t.ctx, name, metav1.DeleteOptions{})
		}
		_ = rbac.ClusterRoles().Delete(t.ctx, "e2e-namespace-maker", metav1.DeleteOptions{})
		_ = c.client.CoreV1().ServiceAccounts(tenant).Delete(t.ctx, account, metav1.DeleteOptions{})
	}()
	token, err := c.client.CoreV1().ServiceAccounts(tenant).CreateToken(t.ctx, account,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))}}, metav1.CreateOptions{})
	t.must(err, "requesting the tenant's token")
	config := rest.CopyConfig(c.config)
	config.BearerToken = token.Status.Token
	asTenant, err := kubernetes.NewForConfig(config)
	t.must(err, "a client with the tenant's token")

	create := func(client kubernetes.Interface, name string) error {
		_, err := client.CoreV1().Namespaces().Create(t.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	// The tenant's rights reach the API server's authorizer within a second or so: wait on an ordinary name.
	t.must(eventually(t.ctx, 30*time.Second, func() error { return create(asTenant, "e2e-tenant-project") }),
		"the tenant creating an ordinary namespace")
	// The API server enforces a policy once its informer has both the policy and its binding: wait for the
	// guard on one name, then check them all.
	refused := func(err error, refusal string) error {
		if err == nil || !strings.Contains(err.Error(), refusal) {
			return fmt.Errorf("%v; want the guard's refusal (%q)", err, refusal)
		}
		return nil
	}
	t.must(eventually(t.ctx, 30*time.Second, func() error { return refused(create(asTenant, "gpu-operator"), trustedRefusal) }),
		"waiting for the trusted namespaces' guard to refuse the tenant")
	trusted := []string{"gpu-operator", "nvidia-device-plugin", "dra-driver-nvidia-gpu", "nvidia-dra-driver-gpu", gpuguardNamespace}
	for _, name := range trusted {
		if err := refused(create(asTenant, name), trustedRefusal); err != nil {
			t.Errorf("the tenant creating namespace %s: %v", name, err)
		}
		if err := create(c.client, name); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Errorf("the admin creating namespace %s: %v; want it allowed", name, err)
		}
	}
	bind("e2e-trusted-creator", "gpuguard-trusted-namespaces-creator")
	t.must(eventually(t.ctx, 30*time.Second, func() error { return create(asTenant, "gpu-operator") }),
		"the tenant's account, bound to gpuguard-trusted-namespaces-creator, creating gpu-operator")

	ignoredNamespaces(t, w, asTenant, refused, func() { bind("e2e-ignored-labeller", "gpuguard-ignored-namespaces-labeller") })
}

// ignoredNamespaces: the tenant's account, which may create and patch namespaces, is refused the label
// gpuguard.io/ignore at creation (dry run) and by a patch; the admin adds it, and a GPU-less pod created
// there (dry run) is then stored unpatched, past the webhook and the armed backstop alike, while one in an
// unlabelled namespace is patched; the tenant is refused a change of the label's value (the break glass is
// taken off by its value), may take it off (patched again), and may add it once bound to
// gpuguard-ignored-namespaces-labeller.
func ignoredNamespaces(t *T, w *webhookInstall, asTenant kubernetes.Interface, refused func(error, string) error, bindLabeller func()) {
	c := w.cluster
	const ns = "e2e-tenant-optout"
	labelled := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{ignoreLabel: "true"}}}
	t.must(eventually(t.ctx, 30*time.Second, func() error {
		_, err := asTenant.CoreV1().Namespaces().Create(t.ctx, labelled, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return refused(err, ignoreRefusal)
	}), "the tenant creating namespace "+ns+" labelled "+ignoreLabel)
	_, err := asTenant.CoreV1().Namespaces().Create(t.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	t.must(err, "the tenant creating namespace "+ns+" without the label")
	defer func() { _ = c.client.CoreV1().Namespaces().Delete(t.ctx, ns, metav1.DeleteOptions{}) }()
	// The label set by a patch of the namespace, or of a subresource ("status", "finalize"), which keeps it.
	labelVia := func(client kubernetes.Interface, value string, subresource ...string) error {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, ignoreLabel, value)
		if value == "" {
			patch = fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, ignoreLabel)
		}
		_, err := client.CoreV1().Namespaces().Patch(t.ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, subresource...)
		return err
	}
	label := func(client kubernetes.Interface, value string) error { return labelVia(client, value) }
	if err := refused(label(asTenant, "true"), ignoreRefusal); err != nil {
		t.Fatalf("the tenant labelling namespace %s %s: %v", ns, ignoreLabel, err)
	}
	if err := refused(labelVia(asTenant, "true", "status"), ignoreRefusal); err != nil {
		t.Fatalf("the tenant labelling namespace %s %s through its status: %v", ns, ignoreLabel, err)
	}
	// finalize takes PUT only: the namespace as read, with the label.
	current, err := c.client.CoreV1().Namespaces().Get(t.ctx, ns, metav1.GetOptions{})
	t.must(err, "reading namespace "+ns)
	current.Labels[ignoreLabel] = "true"
	if _, err := asTenant.CoreV1().Namespaces().Finalize(t.ctx, current, metav1.UpdateOptions{}); refused(err, ignoreRefusal) != nil {
		t.Fatalf("the tenant labelling namespace %s %s through finalize: %v; want the guard's refusal", ns, ignoreLabel, err)
	}
	// The stored pod's NVIDIA_VISIBLE_DEVICES, as the API server's namespace selectors (fed by an informer)
	// come to see the label.
	stored := func(want string) error {
		pod, err := c.client.CoreV1().Pods(ns).Create(t.ctx, podWith("app", container("app")),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		if got := visibleDevices(pod.Spec.Containers[0]); got != want {
			return fmt.Errorf("a GPU-less pod in %s is stored with NVIDIA_VISIBLE_DEVICES %q, want %q", ns, got, want)
		}
		return nil
	}
	w.waitUntilPatching(t)
	t.must(eventually(t.ctx, time.Minute, func() error { return stored("none") }), "a GPU-less pod in the unlabelled "+ns)
	t.must(label(c.client, "true"), "the admin labelling namespace "+ns+" "+ignoreLabel)
	t.must(eventually(t.ctx, time.Minute, func() error { return stored("unset") }),
		"a GPU-less pod in "+ns+", labelled "+ignoreLabel+" by the admin, admitted unpatched")
	w.waitUntilPatching(t) // elsewhere, still patched
	if err := refused(label(asTenant, "yes"), ignoreRefusal); err != nil {
		t.Errorf("the tenant changing the value of %s: %v", ignoreLabel, err)
	}
	t.must(label(asTenant, ""), "the tenant taking "+ignoreLabel+" off")
	t.must(eventually(t.ctx, time.Minute, func() error { return stored("none") }), "a GPU-less pod in "+ns+" once the label is off")
	bindLabeller()
	t.must(eventually(t.ctx, 30*time.Second, func() error { return label(asTenant, "true") }),
		"the tenant's account, bound to gpuguard-ignored-namespaces-labeller, labelling "+ns)
}

// The guard of the trusted namespaces on the real API server: the namespaces gpuguard never looks at,
// where the node enforcer exempts the GPU infrastructure, cannot be claimed by a tenant who may create
// namespaces, and still can be by an admin or a controller bound to the shipped creator role.
package main

import (
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const trustedRefusal = "is trusted with every GPU"

// trustedNamespaces: a tenant's account that may create any namespace creates (dry run) an ordinary one,
// but not gpu-operator, nvidia-device-plugin or gpuguard-system, refused with the guard's message; the
// admin may; bound to gpuguard-trusted-namespaces-creator, so may the tenant's.
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
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"create"}}}},
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
		for _, name := range []string{"e2e-namespace-maker", "e2e-trusted-creator"} {
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
	trusted := []string{"gpu-operator", "nvidia-device-plugin", gpuguardNamespace}
	for _, name := range trusted {
		if err := create(asTenant, name); err == nil || !strings.Contains(err.Error(), trustedRefusal) {
			t.Errorf("the tenant creating namespace %s: %v; want the guard's refusal (%q)", name, err, trustedRefusal)
		}
		if err := create(c.client, name); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Errorf("the admin creating namespace %s: %v; want it allowed", name, err)
		}
	}
	bind("e2e-trusted-creator", "gpuguard-trusted-namespaces-creator")
	t.must(eventually(t.ctx, 30*time.Second, func() error { return create(asTenant, "gpu-operator") }),
		"the tenant's account, bound to gpuguard-trusted-namespaces-creator, creating gpu-operator")
}

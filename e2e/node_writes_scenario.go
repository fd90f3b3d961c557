// The device plugin's writes to Nodes, scoped to its own (issue 44): RBAC lets its account patch every
// Node's status, so the chart's ValidatingAdmissionPolicy gpuguard-device-plugin-own-node holds each pod to
// the Node its pod-bound token names. Shown with the account's token bound to the node's plugin pod, as the
// kubelet gives it: its own Node's status may be patched, another Node's is refused; a token of the same
// account bound to no pod names no node, and is refused everywhere.
package main

import (
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	pluginAccount = "gpuguard-device-plugin"
	otherNode     = "gpuguard-other-node"
	// A condition type of the test's own, so that the plugin's GPUIsolation is never touched.
	scopedCondition = "GPUGuardE2EScopedWrite"
)

func nodeOwnNodeWrites(t *T, e *Env) {
	n := e.gpuguardFor(t)
	c := n.cluster
	pods, err := c.client.CoreV1().Pods(gpuguardNamespace).List(t.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + pluginAccount})
	t.must(err, "listing the device plugin's pods")
	if len(pods.Items) != 1 {
		t.Fatalf("%d device plugin pods, want 1", len(pods.Items))
	}
	plugin := pods.Items[0]
	// Another Node, with no kubelet: it only has to exist to be written to.
	_, err = c.client.CoreV1().Nodes().Create(t.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: otherNode},
		Spec: corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{{Key: "gpuguard.io/e2e", Value: "no-kubelet", Effect: corev1.TaintEffectNoExecute}}}},
		metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.must(err, "creating the Node "+otherNode)
	}
	defer func() {
		if err := c.client.CoreV1().Nodes().Delete(t.ctx, otherNode, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the Node %s: %v", otherNode, err)
		}
		removeCondition(t, c.client, nodeName)
	}()

	asPlugin := func(bound bool) kubernetes.Interface {
		request := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))}}
		if bound {
			request.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: plugin.Name, UID: plugin.UID}
		}
		token, err := c.client.CoreV1().ServiceAccounts(gpuguardNamespace).CreateToken(t.ctx, pluginAccount, request, metav1.CreateOptions{})
		t.must(err, "requesting a token of "+pluginAccount)
		config := rest.CopyConfig(c.config)
		config.BearerToken = token.Status.Token
		client, err := kubernetes.NewForConfig(config)
		t.must(err, "a client with the plugin's token")
		return client
	}
	write := func(client kubernetes.Interface, node string) error {
		patch := `{"status":{"conditions":[{"type":"` + scopedCondition + `","status":"True","reason":"E2E","message":"scoped write"}]}}`
		_, err := client.CoreV1().Nodes().Patch(t.ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
		return err
	}
	const policy = "gpuguard-device-plugin-own-node"
	bound := asPlugin(true)
	if err := write(bound, nodeName); err != nil {
		t.Errorf("the plugin's pod-bound token patching its own Node's status: %v; want it allowed", err)
	}
	if err := write(bound, otherNode); err == nil || !strings.Contains(err.Error(), policy) {
		t.Errorf("the plugin's pod-bound token patching another Node's status: %v; want %s to refuse it", err, policy)
	} else {
		t.Logf("the plugin's token, another Node: %v", err)
	}
	if err := write(asPlugin(false), nodeName); err == nil || !strings.Contains(err.Error(), policy) {
		t.Errorf("a token of the plugin's account bound to no pod, patching the node's status: %v; want %s to refuse it", err, policy)
	}
	// The control: the same patch by the admin passes, so the refusals are the policy's, and only for the account.
	if err := write(c.client, otherNode); err != nil {
		t.Errorf("the admin patching %s's status: %v", otherNode, err)
	}
}

// removeCondition takes the test's condition off a Node.
func removeCondition(t *T, client kubernetes.Interface, node string) {
	patch := `{"status":{"conditions":[{"type":"` + scopedCondition + `","$patch":"delete"}]}}`
	if _, err := client.CoreV1().Nodes().Patch(t.ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("removing the test's condition from %s: %v", node, err)
	}
}

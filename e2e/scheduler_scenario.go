// Scenario 6: the real kube-scheduler places GPU pods on two Nodes of 2 GPUs each, three times: with its
// defaults (the "before"), with manifests/scheduler-extender/scheduler-config.yaml calling
// gpuguard-scheduler-extender, and with native-most-allocated.yaml.
package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

const (
	schedulingNamespace = "e2e-scheduling"
	// Only the scenario's pods tolerate it, so that nothing else the run creates lands on these nodes.
	schedulingTaint = "e2e.gpuguard.io/scheduling"
)

var gpuNodes = []string{"gpu-node-a", "gpu-node-b"}

func schedulerExtender(t *T, e *Env) {
	c := e.clusterFor(t)
	c.namespace(t, gpuguardNamespace, nil)
	c.namespace(t, schedulingNamespace, nil)
	for _, name := range gpuNodes {
		createGPUNode(t, c, name)
	}
	extender := startExtender(t, e, c)
	defer extender.process.stop()

	// Before: the default scheduler spreads (LeastAllocated on cpu and memory), so the 2-GPU pod finds no
	// node with two free GPUs.
	placed := scheduleThree(t, e, c, "default", writeSchedulerConfig(t, e, c, "default", nil), nil)
	if placed[0] == "" || placed[1] == "" || placed[0] == placed[1] || placed[2] != "" {
		t.Errorf("default scheduler: pods placed on %q, %q, %q; want the two 1-GPU pods on different nodes and the 2-GPU pod Pending", placed[0], placed[1], placed[2])
	}

	shipped := func(name string) map[string]any {
		var config map[string]any
		text, err := os.ReadFile(e.source("manifests", "scheduler-extender", name))
		t.must(err, "reading "+name)
		t.must(yaml.Unmarshal(text, &config), "parsing "+name)
		return config
	}
	withExtender := shipped("scheduler-config.yaml")
	for _, item := range withExtender["extenders"].([]any) {
		ext := item.(map[string]any)
		ext["urlPrefix"] = fmt.Sprintf("https://127.0.0.1:%d/scheduler", extender.port)
		ext["tlsConfig"].(map[string]any)["caFile"] = filepath.Join(e.path("manifests", "scheduler-extender", "certs"), "ca.crt")
	}
	placed = scheduleThree(t, e, c, "extender", writeSchedulerConfig(t, e, c, "extender", withExtender), extender)
	expectPacked(t, "scheduler-config.yaml with gpuguard-scheduler-extender", placed)

	placed = scheduleThree(t, e, c, "native", writeSchedulerConfig(t, e, c, "native", shipped("native-most-allocated.yaml")), nil)
	expectPacked(t, "native-most-allocated.yaml", placed)
}

func expectPacked(t *T, config string, placed [3]string) {
	if placed[0] == "" || placed[0] != placed[1] || placed[2] == "" || placed[2] == placed[0] {
		t.Errorf("%s: pods placed on %q, %q, %q; want both 1-GPU pods on one node and the 2-GPU pod on the other", config, placed[0], placed[1], placed[2])
	}
}

func createGPUNode(t *T, c *Cluster, name string) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: schedulingTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
	}
	created, err := c.client.CoreV1().Nodes().Create(t.ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return
	}
	t.must(err, "creating node "+name)
	resources := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi"),
		corev1.ResourcePods: resource.MustParse("110"), gpuResource: resource.MustParse("2"),
	}
	created.Status = corev1.NodeStatus{Capacity: resources, Allocatable: resources,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}}
	updated, err := c.client.CoreV1().Nodes().UpdateStatus(t.ctx, created, metav1.UpdateOptions{})
	t.must(err, "setting the allocatable GPUs of node "+name)
	// The apiserver taints a new node not-ready; a kubelet's first heartbeat makes the node lifecycle
	// controller lift it. Neither runs here, so the harness lifts it for the Ready status it wrote.
	updated.Spec.Taints = slices.DeleteFunc(updated.Spec.Taints, func(taint corev1.Taint) bool { return taint.Key == corev1.TaintNodeNotReady })
	_, err = c.client.CoreV1().Nodes().Update(t.ctx, updated, metav1.UpdateOptions{})
	t.must(err, "lifting the not-ready taint of node "+name)
}

type runningExtender struct {
	process *process
	port    int
	client  *http.Client
}

// startExtender applies manifests/scheduler-extender (its RBAC among it) and runs the binary with the
// Deployment's arguments, authenticated as its service account with a token the apiserver issues.
func startExtender(t *T, e *Env, c *Cluster) *runningExtender {
	objects := decodeObjects(t, e.render(t, "scheduler-extender"))
	var args []string
	certs := e.path("manifests", "scheduler-extender", "certs")
	port := mustFreePort(t)
	for _, obj := range objects {
		c.apply(t, obj)
		if obj.GetKind() == "Deployment" {
			args = shippedArgs(t, obj, map[string]string{
				"tls-cert-file":        filepath.Join(certs, "tls.crt"),
				"tls-private-key-file": filepath.Join(certs, "tls.key"),
				"listen-address":       "127.0.0.1:" + strconv.Itoa(port),
				"policy-dir":           e.path("volumes", "extender-policy"),
			})
		}
	}
	if args == nil {
		t.Fatalf("manifests/scheduler-extender renders no Deployment")
	}
	args = append(args, "--apiserver-url="+c.server, "--token-file="+c.serviceAccountToken(t, e, "gpuguard-scheduler-extender"),
		"--ca-file="+c.caFile)

	p, err := e.start("gpuguard-scheduler-extender", e.gpuguard("gpuguard-scheduler-extender"), args...)
	t.must(err, "starting gpuguard-scheduler-extender")
	w := &webhookInstall{certs: certs} // for its HTTPS client
	r := &runningExtender{process: p, port: port, client: w.httpClient(t)}
	// A minute's list of 150,000 pods (make bench-scale) and then some.
	t.must(eventually(t.ctx, 3*time.Minute, func() error {
		if err := p.alive(); err != nil {
			return err
		}
		resp, err := r.client.Get(fmt.Sprintf("https://127.0.0.1:%d/readyz", port))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s (pods and nodes not listed yet)", resp.Status)
		}
		return nil
	}), "waiting for the extender to list pods and nodes")
	return r
}

// cachedPods reads how many bound pods the extender holds, so that the next pod is scheduled only once
// the extender has seen the last binding (a real cluster's pods arrive far slower than these).
func (r *runningExtender) cachedPods() (int, error) {
	return scrape(r.client, fmt.Sprintf("https://127.0.0.1:%d/metrics", r.port), `gpuguard_extender_cached_objects{resource="pods"}`)
}

// writeSchedulerConfig writes a KubeSchedulerConfiguration for this harness: the given one (nil: the
// defaults) with the scheduler's kubeconfig and without leader election.
func writeSchedulerConfig(t *T, e *Env, c *Cluster, name string, config map[string]any) string {
	if config == nil {
		config = map[string]any{"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
	}
	kubeconfig := filepath.Join(c.dir, "scheduler.kubeconfig")
	t.must(c.writeKubeconfig(kubeconfig, schedulerToken), "writing the scheduler's kubeconfig")
	config["clientConnection"] = map[string]any{"kubeconfig": kubeconfig}
	config["leaderElection"] = map[string]any{"leaderElect": false}
	text, err := yaml.Marshal(config)
	t.must(err, "encoding the scheduler configuration")
	path := filepath.Join(c.dir, "scheduler-"+name+".yaml")
	t.must(os.WriteFile(path, text, 0o644), "writing the scheduler configuration")
	return path
}

// scheduleThree runs kube-scheduler with the configuration and creates pods asking for 1, 1 and 2 GPUs,
// one after the other; it returns the node each was bound to ("" for Pending), then deletes them.
func scheduleThree(t *T, e *Env, c *Cluster, name, config string, extender *runningExtender) [3]string {
	scheduler, err := e.start("kube-scheduler-"+name, e.component("kube-scheduler"), "--config="+config, "--secure-port=0")
	t.must(err, "starting kube-scheduler")
	defer scheduler.stop()

	var placed, pending [3]string
	pods := c.client.CoreV1().Pods(schedulingNamespace)
	for i, gpus := range []string{"1", "1", "2"} {
		pod := podWith(fmt.Sprintf("%s-%d-gpu-%d", name, i, i), container("train", withLimit(gpuResource, gpus)))
		pod.Spec.Tolerations = []corev1.Toleration{{Key: schedulingTaint, Operator: corev1.TolerationOpExists}}
		_, err := pods.Create(t.ctx, pod, metav1.CreateOptions{})
		t.must(err, "creating pod "+pod.Name)
		t.must(eventually(t.ctx, time.Minute, func() error {
			if err := scheduler.alive(); err != nil {
				return err
			}
			stored, err := pods.Get(t.ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if stored.Spec.NodeName != "" {
				placed[i] = stored.Spec.NodeName
				return nil
			}
			for _, condition := range stored.Status.Conditions {
				if condition.Type == corev1.PodScheduled && condition.Status == corev1.ConditionFalse && condition.Reason == corev1.PodReasonUnschedulable {
					pending[i] = condition.Message
					return nil
				}
			}
			return fmt.Errorf("pod %s is neither bound nor marked unschedulable", pod.Name)
		}), "scheduling pod "+pod.Name)
		if extender != nil && placed[i] != "" {
			bound := i + 1
			t.must(eventually(t.ctx, 30*time.Second, func() error {
				cached, err := extender.cachedPods()
				if err == nil && cached < bound {
					err = fmt.Errorf("the extender has %d bound pods cached, want %d", cached, bound)
				}
				return err
			}), "waiting for the extender to see the binding")
		}
	}
	deletePods(t, c.client, schedulingNamespace, extender)
	for i, why := range pending {
		if why != "" {
			t.Logf("%s: pod %d is Pending: %s", name, i, why)
		}
	}
	return placed
}

// deletePods deletes a namespace's pods and waits until they are gone and, when an extender is given, until
// its cache holds none of them. A collection of thousands can outlast the API server's request timeout,
// which it answers while it goes on deleting.
func deletePods(t *T, client kubernetes.Interface, namespace string, extender *runningExtender) {
	pods := client.CoreV1().Pods(namespace)
	err := pods.DeleteCollection(t.ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}, metav1.ListOptions{})
	if err != nil && !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err) {
		t.must(err, "deleting the pods of "+namespace)
	}
	t.must(eventually(t.ctx, 5*time.Minute, func() error {
		left, err := pods.List(t.ctx, metav1.ListOptions{Limit: 1})
		if err == nil && len(left.Items) > 0 {
			err = fmt.Errorf("pods of %s are still there", namespace)
		}
		if err == nil && extender != nil {
			if cached, cerr := extender.cachedPods(); cerr != nil || cached != 0 {
				err = fmt.Errorf("the extender still caches %d pods (%v)", cached, cerr)
			}
		}
		return err
	}), "waiting for the pods of "+namespace+" to go")
}

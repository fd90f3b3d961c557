// gpuguard at cluster scale through the real control plane (issue 54): a control plane of its own whose
// nodes are kwok's (sigs.k8s.io/kwok, pinned in go.mod), each a GPU node as GPU Operator labels and
// taints it, with kwok moving their pods through their life. The scheduler extender runs against it as
// it does in a cluster: through its own watch, called by the real kube-scheduler.
//
// scale/extender (make e2e, in CI) checks correctness at about 100 nodes and 1,000 pods; scale_bench.go
// (make bench-scale) measures at 500 and 5,000.
package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	kwoknode "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	kwokpod "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/yaml"
)

const (
	// kwok manages only the nodes that carry this annotation.
	kwokAnnotation = "kwok.x-k8s.io/node"
	scaleNamespace = "e2e-scale"
	// GPU Operator's and most managed clusters' taint on GPU nodes: only GPU pods tolerate it.
	gpuTaint    = "nvidia.com/gpu"
	gpusPerNode = 8
)

// scaleCluster is a control plane of its own with kwok managing its nodes; stop ends both.
type scaleCluster struct {
	*Cluster
	kwok *process
	// Without client-go's rate limiter (100 per second on the harness's client), which would be what
	// is measured.
	bulk kubernetes.Interface
}

func (e *Env) startScaleCluster(t *T, name string) *scaleCluster {
	// TaintNodesByCondition would taint every new node not-ready until the node lifecycle controller,
	// which this control plane does not run (nothing here reads node heartbeats or leases), lifts it.
	c, err := e.startCluster(name, "", "--disable-admission-plugins=TaintNodesByCondition",
		"--max-requests-inflight=800", "--max-mutating-requests-inflight=400")
	t.must(err, "starting the control plane "+name)
	s := &scaleCluster{Cluster: c}
	unlimited := rest.CopyConfig(c.config)
	unlimited.QPS = -1
	if s.bulk, err = kubernetes.NewForConfig(unlimited); err != nil {
		c.stop()
		t.must(err, "making a client without a rate limit")
	}

	// kwok's own stages: a node becomes Ready with the capacity it was created with; a bound pod becomes
	// Running, and a deleted one goes. No heartbeat and no lease: nothing here would mark a silent node
	// NotReady.
	stages := strings.Join([]string{kwoknode.DefaultNodeInit, kwokpod.DefaultPodReady, kwokpod.DefaultPodComplete,
		kwokpod.DefaultPodDelete}, "\n---\n")
	config := filepath.Join(c.dir, "kwok.yaml")
	t.must(os.WriteFile(config, []byte(stages), 0o600), "writing kwok's stages")
	s.kwok, err = e.start(name+"-kwok", e.component("kwok"), "--kubeconfig="+filepath.Join(c.dir, "admin.kubeconfig"),
		"--config="+config, "--manage-nodes-with-annotation-selector="+kwokAnnotation+"=fake",
		"--cidr=10.64.0.0/12", "--node-ip=10.63.0.1", "--node-lease-duration-seconds=0")
	if err != nil {
		c.stop()
		t.must(err, "starting kwok")
	}
	return s
}

func (s *scaleCluster) stop() {
	s.kwok.stop()
	s.Cluster.stop()
}

// scaleNode is a GPU node as a cluster shows it (GPU Operator's labels, its taint, 8 GPUs), or a CPU
// node for the GPU-less pods; gpus, when not "", overrides the count (for the nonsense nodes).
func scaleNode(name string, gpuNode bool, gpus string) *corev1.Node {
	labels := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		"type": "kwok", "topology.kubernetes.io/zone": fmt.Sprintf("zone-%c", 'a'+len(name)%3)}
	resources := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("192"), corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods: resource.MustParse("110")}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{kwokAnnotation: "fake"}}}
	if gpuNode {
		if gpus == "" {
			gpus = strconv.Itoa(gpusPerNode)
		}
		labels["node.kubernetes.io/instance-type"] = "p5.48xlarge"
		labels["nvidia.com/gpu.present"] = "true"
		labels["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
		labels["nvidia.com/gpu.count"] = strconv.Itoa(gpusPerNode)
		resources[gpuResource] = resource.MustParse(gpus)
		node.Spec.Taints = []corev1.Taint{{Key: gpuTaint, Value: "present", Effect: corev1.TaintEffectNoSchedule}}
	}
	node.Status = corev1.NodeStatus{Capacity: resources, Allocatable: resources}
	return node
}

// inParallel runs do(0..n-1) on 16 workers and returns the first error.
func inParallel(n int, do func(i int) error) error {
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := do(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// addNodes creates gpuNodes GPU nodes and cpuNodes CPU nodes and waits until kwok has made each Ready.
func (s *scaleCluster) addNodes(t *T, gpuNodes, cpuNodes int) (gpuNames []string) {
	for i := range gpuNodes {
		gpuNames = append(gpuNames, fmt.Sprintf("kwok-gpu-%05d", i))
	}
	names := slices.Clone(gpuNames)
	for i := range cpuNodes {
		names = append(names, fmt.Sprintf("kwok-cpu-%04d", i))
	}
	t.must(inParallel(len(names), func(i int) error {
		_, err := s.bulk.CoreV1().Nodes().Create(t.ctx, scaleNode(names[i], i < gpuNodes, ""), metav1.CreateOptions{})
		return err
	}), "creating kwok nodes")
	t.must(eventually(t.ctx, 5*time.Minute, func() error {
		if err := s.kwok.alive(); err != nil {
			return err
		}
		list, err := s.bulk.CoreV1().Nodes().List(t.ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return err
		}
		ready := 0
		for _, node := range list.Items {
			for _, condition := range node.Status.Conditions {
				if condition.Type == corev1.NodeReady && condition.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready < len(names) {
			return fmt.Errorf("kwok has made %d of %d nodes Ready", ready, len(names))
		}
		return nil
	}), "waiting for kwok to make the nodes Ready")
	return gpuNames
}

// scalePod is a workload pod: gpus GPUs (tolerating the GPU nodes' taint), or none and a little CPU.
func scalePod(name string, gpus int) *corev1.Pod {
	if gpus == 0 {
		return podWith(name, container("app", func(c *corev1.Container) {
			c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
		}))
	}
	pod := podWith(name, container("train", withLimit(gpuResource, strconv.Itoa(gpus))))
	pod.Spec.Tolerations = []corev1.Toleration{{Key: gpuTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	return pod
}

// startScheduler runs kube-scheduler on the scale cluster with config (nil: its defaults), its client
// unthrottled as a large cluster's is configured, and waits until it serves.
func (s *scaleCluster) startScheduler(t *T, e *Env, name string, config map[string]any) *process {
	if config == nil {
		config = map[string]any{"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
	}
	kubeconfig := filepath.Join(s.dir, "scheduler.kubeconfig")
	t.must(s.writeKubeconfig(kubeconfig, schedulerToken), "writing the scheduler's kubeconfig")
	config["clientConnection"] = map[string]any{"kubeconfig": kubeconfig, "qps": 5000, "burst": 5000}
	config["leaderElection"] = map[string]any{"leaderElect": false}
	text, err := yaml.Marshal(config)
	t.must(err, "encoding the scheduler configuration")
	path := filepath.Join(s.dir, "scheduler-"+name+".yaml")
	t.must(os.WriteFile(path, text, 0o644), "writing the scheduler configuration")
	scheduler, err := e.start(filepath.Base(s.dir)+"-kube-scheduler-"+name, e.component("kube-scheduler"), "--config="+path, "--secure-port=0")
	t.must(err, "starting kube-scheduler")
	return scheduler
}

// shippedExtenderConfig is manifests/scheduler-extender/scheduler-config.yaml pointed at the extender.
func shippedExtenderConfig(t *T, e *Env, extender *runningExtender) map[string]any {
	config := shippedSchedulerConfig(t, e, "scheduler-config.yaml")
	for _, item := range config["extenders"].([]any) {
		ext := item.(map[string]any)
		ext["urlPrefix"] = fmt.Sprintf("https://127.0.0.1:%d/scheduler", extender.port)
		ext["tlsConfig"].(map[string]any)["caFile"] = filepath.Join(e.path("manifests", "scheduler-extender", "certs"), "ca.crt")
	}
	return config
}

func shippedSchedulerConfig(t *T, e *Env, name string) map[string]any {
	var config map[string]any
	text, err := os.ReadFile(e.source("manifests", "scheduler-extender", name))
	t.must(err, "reading "+name)
	t.must(yaml.Unmarshal(text, &config), "parsing "+name)
	return config
}

// gpuUse is what the pods bound to each node hold of nvidia.com/gpu, read from the API server.
func (s *scaleCluster) gpuUse(t *T) (use map[string]int64, bound, pending int) {
	list, err := s.bulk.CoreV1().Pods(scaleNamespace).List(t.ctx, metav1.ListOptions{})
	t.must(err, "listing the workload's pods")
	use = map[string]int64{}
	for _, pod := range list.Items {
		if pod.Spec.NodeName == "" {
			pending++
			continue
		}
		bound++
		for _, c := range pod.Spec.Containers {
			q := c.Resources.Limits[gpuResource]
			use[pod.Spec.NodeName] += q.Value()
		}
	}
	return use, bound, pending
}

// bestFit is the packing the extender promises, computed here independently: each GPU pod, in arrival
// order, goes to the feasible node with the fewest GPUs left (nodes with equal use are interchangeable,
// so the resulting use is the same whichever the scheduler picks among them). It returns how many nodes
// it leaves wholly free.
func bestFit(nodes int, arrivals []int) (free int, ok bool) {
	left := make([]int, nodes)
	for i := range left {
		left[i] = gpusPerNode
	}
	for _, gpus := range arrivals {
		best := -1
		for i, l := range left {
			if l >= gpus && (best < 0 || l < left[best]) {
				best = i
			}
		}
		if best < 0 {
			return 0, false
		}
		left[best] -= gpus
	}
	for _, l := range left {
		if l == gpusPerNode {
			free++
		}
	}
	return free, true
}

// The CI scenario's workload: 225 GPU pods asking 620 of the 664 GPUs left, in a seeded random order;
// with the 775 GPU-less pods, 1,000.
const ciGPUlessPods = 775

func ciArrivals() []int {
	var gpus []int
	for size, count := range map[int]int{8: 25, 4: 50, 2: 70, 1: 80} {
		for range count {
			gpus = append(gpus, size)
		}
	}
	slices.Sort(gpus)
	rand.New(rand.NewPCG(54, 54)).Shuffle(len(gpus), func(i, j int) { gpus[i], gpus[j] = gpus[j], gpus[i] })
	return gpus
}

// scaleExtender: about 100 kwok nodes and 1,000 pods through the real kube-scheduler with gpuguard's
// extender, after nodes and a pod that report nonsense quantities. Fewer than 100 nodes in all, so that
// kube-scheduler scores every feasible node (percentageOfNodesToScore samples above 100) and the packing
// can be held to best fit exactly.
func scaleExtender(t *T, e *Env) {
	s := e.startScaleCluster(t, "scale")
	defer s.stop()
	s.namespace(t, gpuguardNamespace, nil)
	s.namespace(t, scaleNamespace, nil)
	const gpuNodes, cpuNodes = 84, 8
	gpuNames := s.addNodes(t, gpuNodes, cpuNodes)

	// Nodes whose allocatable no GPU node reports. The API server refuses what is not a non-negative
	// quantity; what it accepts reaches the extender, which must skip the node and say why.
	nonsense := map[string]string{"kwok-nonsense-negative": "-8", "kwok-nonsense-int64": "9223372036854775807",
		"kwok-nonsense-exponent": "1e30", "kwok-nonsense-fraction": "2.5"}
	var accepted []string
	for name, gpus := range nonsense {
		_, err := s.bulk.CoreV1().Nodes().Create(t.ctx, scaleNode(name, true, gpus), metav1.CreateOptions{})
		if err == nil {
			accepted = append(accepted, name)
		} else {
			t.Logf("the API server refuses a node with %s GPUs: %v", gpus, err)
		}
	}
	slices.Sort(accepted)
	if !slices.Contains(accepted, "kwok-nonsense-int64") {
		t.Fatalf("the API server refused a node with 9223372036854775807 GPUs; the scenario cannot show the extender's skip (accepted: %v)", accepted)
	}

	logged := logSize(e, "gpuguard-scheduler-extender") // what earlier scenarios' extenders wrote is not this one's
	extender := startExtender(t, e, s.Cluster)
	defer extender.process.stop()
	// A pod bound by its author, not the scheduler, to the last GPU node, asking for more than a 64-bit
	// count holds once summed: that node is full, and the extender says why.
	overflow := scalePod("overflow-bound", 0)
	overflow.Spec.NodeName = gpuNames[gpuNodes-1]
	overflow.Spec.Containers = []corev1.Container{container("a", withLimit(gpuResource, "9223372036854775807")),
		container("b", withLimit(gpuResource, "9223372036854775807"))}
	overflow, err := s.bulk.CoreV1().Pods(scaleNamespace).Create(t.ctx, overflow, metav1.CreateOptions{})
	t.must(err, "creating a bound pod whose GPU request overflows 64 bits")
	unreadable := func(resource string) (int, error) {
		return scrape(extender.client, fmt.Sprintf("https://127.0.0.1:%d/metrics", extender.port),
			`gpuguard_extender_unreadable_objects_total{resource="`+resource+`"}`)
	}
	t.must(eventually(t.ctx, time.Minute, func() error {
		nodes, err := unreadable("nodes")
		if err != nil {
			return err
		}
		pods, err := unreadable("pods")
		if err != nil {
			return err
		}
		if nodes != len(accepted) || pods != 1 {
			return fmt.Errorf("the extender counts %d unreadable nodes and %d pods, want %d and 1", nodes, pods, len(accepted))
		}
		return nil
	}), "waiting for the extender to report the nonsense nodes and the overflowing pod")

	scheduler := s.startScheduler(t, e, "extender", shippedExtenderConfig(t, e, extender))
	defer scheduler.stop()
	pods := s.bulk.CoreV1().Pods(scaleNamespace)
	// A pod no node can hold: it stays Pending, whether the scheduler's own fit or the extender says so.
	huge := scalePod("huge-request", 1)
	huge.Spec.Containers[0] = container("train", withLimit(gpuResource, "99999999999999999999"))
	impossible := 1
	if _, err = pods.Create(t.ctx, huge, metav1.CreateOptions{}); err != nil {
		t.Logf("the API server refuses a pod asking for 99999999999999999999 GPUs: %v", err)
		impossible = 0
	}

	// GPU-less pods at once: the extender is not called for them (managedResources).
	t.must(inParallel(ciGPUlessPods, func(i int) error {
		_, err := pods.Create(t.ctx, scalePod(fmt.Sprintf("cpu-%04d", i), 0), metav1.CreateOptions{})
		return err
	}), "creating the GPU-less pods")
	t.must(eventually(t.ctx, 5*time.Minute, func() error {
		if err := scheduler.alive(); err != nil {
			return err
		}
		_, bound, _ := s.gpuUse(t)
		if bound < 1+ciGPUlessPods {
			return fmt.Errorf("%d of the %d GPU-less pods bound", bound-1, ciGPUlessPods)
		}
		return nil
	}), "waiting for the GPU-less pods to be bound")
	// GPU pods one at a time, each after the extender has seen the last binding: the packing is then
	// the one the extender decides, not one its watch was too late for (bench-scale measures that).
	arrivals := ciArrivals()
	for i, gpus := range arrivals {
		name := fmt.Sprintf("gpu-%04d-x%d", i, gpus)
		_, err := pods.Create(t.ctx, scalePod(name, gpus), metav1.CreateOptions{})
		t.must(err, "creating pod "+name)
		t.must(eventually(t.ctx, time.Minute, func() error {
			if err := scheduler.alive(); err != nil {
				return err
			}
			pod, err := pods.Get(t.ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if pod.Spec.NodeName == "" {
				return fmt.Errorf("pod %s is not bound", name)
			}
			cached, err := extender.cachedPods()
			if err == nil && cached < i+2 { // and the overflowing pod
				err = fmt.Errorf("the extender caches %d bound GPU pods, want %d", cached, i+2)
			}
			return err
		}), "scheduling pod "+name)
	}
	t.must(eventually(t.ctx, 2*time.Minute, func() error {
		_, bound, pending := s.gpuUse(t)
		if want := 1 + ciGPUlessPods + len(arrivals); bound != want || pending != impossible {
			return fmt.Errorf("%d pods bound and %d pending, want %d bound and %d pending (the 99999999999999999999-GPU pod)", bound, pending, want, impossible)
		}
		return nil
	}), "waiting for every pod but the impossible one to be bound")

	use, _, _ := s.gpuUse(t)
	free := 0
	for _, name := range gpuNames[:gpuNodes-1] {
		if use[name] > gpusPerNode {
			t.Errorf("node %s holds pods asking %d GPUs of its %d", name, use[name], gpusPerNode)
		}
		if use[name] == 0 {
			free++
		}
	}
	// kube-scheduler goes on without an extender that errs or times out (ignorable): then its own fit,
	// wrapped by the overflowing pod's request, would let pods onto that pod's node.
	list, err := pods.List(t.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + gpuNames[gpuNodes-1]})
	t.must(err, "listing the pods on the overflowing pod's node")
	if len(list.Items) != 1 {
		t.Errorf("%d pods are bound to %s, which the overflowing pod fills; want only it", len(list.Items), gpuNames[gpuNodes-1])
	}
	for _, name := range accepted {
		if use[name] != 0 {
			t.Errorf("the extender let GPU pods onto %s, whose allocatable is nonsense: %d GPUs bound there", name, use[name])
		}
	}
	promised, ok := bestFit(gpuNodes-1, arrivals)
	if !ok {
		t.Fatalf("the workload does not fit by best fit: the scenario is wrong")
	}
	if free < promised {
		t.Errorf("%d GPU nodes are wholly free after the workload; best fit in the same order leaves %d", free, promised)
	}
	t.Logf("%d of %d GPU nodes wholly free after %d GPU pods (best fit in the same order: %d)", free, gpuNodes-1, len(arrivals), promised)

	t.must(extender.process.alive(), "the extender after the nonsense")
	// The reasons themselves, as an admin reads them: one line each, naming the object.
	text, err := os.ReadFile(e.path("logs", "gpuguard-scheduler-extender.log"))
	t.must(err, "reading the extender's log")
	ours := string(text[min(logged, int64(len(text))):])
	for _, name := range append(slices.Clone(accepted), string(overflow.UID)) {
		if n := strings.Count(ours, `"name":"`+name+`"`); n != 1 {
			t.Errorf("the extender's log names %s %d times as not counted as written, want once", name, n)
		}
	}
	if n := strings.Count(ours, "quantity not counted as written"); n != len(accepted)+1 {
		t.Errorf("the extender's log says %d times that a quantity was not counted as written, want %d", n, len(accepted)+1)
	}
}

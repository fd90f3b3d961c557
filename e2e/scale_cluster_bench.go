// make bench-scale's other two parts (not part of make e2e):
//   - scale/admission: pod creates through the real API server at 100 and 500 per second, with the
//     webhook (two replicas behind a round-robin TCP proxy, standing in for the Service's kube-proxy) and
//     the backstop in the path, and without either; the API server's own admission latency for the
//     webhook and the create throughput, side by side.
//   - scale/cluster-caches: at 5,000 kwok nodes and 150,000 pods bound to them directly, the audit's full
//     pass (time, memory, PolicyReports written), the extender's memory and prioritize latency through
//     its real watch, and the webhook's claim cache holding ResourceClaims at that scale.
//
// Each reports figures and fails only when it cannot measure.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// roundRobin accepts on 127.0.0.1 and hands each connection to the next backend in turn, as kube-proxy
// spreads a Service's connections over its endpoints.
func roundRobin(t *T, backends []int) (port int, stop func()) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	t.must(err, "listening for the webhook's proxy")
	var next atomic.Uint64
	var wg sync.WaitGroup
	go func() {
		for {
			client, err := listener.Accept()
			if err != nil {
				return
			}
			backend := backends[next.Add(1)%uint64(len(backends))]
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer client.Close()
				server, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(backend))
				if err != nil {
					return
				}
				defer server.Close()
				done := make(chan struct{}, 2)
				go func() { io.Copy(server, client); server.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
				go func() { io.Copy(client, server); client.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
				<-done
				<-done
			}()
		}
	}()
	return listener.Addr().(*net.TCPAddr).Port, func() { listener.Close() }
}

// admissionHistogram is the API server's apiserver_admission_webhook_admission_duration_seconds for one
// webhook's CREATEs, summed over its other labels: cumulative counts by upper bound.
type admissionHistogram map[float64]float64

var bucketLine = regexp.MustCompile(`^apiserver_admission_webhook_admission_duration_seconds_bucket\{(.*)\} ([0-9.e+]+)$`)

func readAdmissionHistogram(t *T, c *Cluster, webhook string) admissionHistogram {
	body, err := c.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.ctx)
	t.must(err, "reading the API server's /metrics")
	h := admissionHistogram{}
	scanner := bufio.NewScanner(bytes.NewReader(body))
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		m := bucketLine.FindStringSubmatch(scanner.Text())
		if m == nil || !strings.Contains(m[1], `name="`+webhook+`"`) || !strings.Contains(m[1], `operation="CREATE"`) {
			continue
		}
		le := regexp.MustCompile(`le="([^"]+)"`).FindStringSubmatch(m[1])
		if le == nil {
			continue
		}
		bound, err := strconv.ParseFloat(le[1], 64)
		if le[1] == "+Inf" {
			bound, err = math.Inf(1), nil
		}
		count, cerr := strconv.ParseFloat(m[2], 64)
		if err == nil && cerr == nil {
			h[bound] += count
		}
	}
	return h
}

// quantile is histogram_quantile over the difference of two readings: linear within the bucket.
func (h admissionHistogram) quantile(before admissionHistogram, q float64) (float64, int) {
	bounds := make([]float64, 0, len(h))
	for bound := range h {
		bounds = append(bounds, bound)
	}
	slices.Sort(bounds)
	total := h[math.Inf(1)] - before[math.Inf(1)]
	if total <= 0 {
		return math.NaN(), 0
	}
	rank, lower, lowerCount := q*total, 0.0, 0.0
	for _, bound := range bounds {
		count := h[bound] - before[bound]
		if count >= rank {
			if math.IsInf(bound, 1) {
				return lower, int(total)
			}
			return lower + (bound-lower)*(rank-lowerCount)/math.Max(count-lowerCount, 1e-9), int(total)
		}
		lower, lowerCount = bound, count
	}
	return lower, int(total)
}

// createAtRate creates pods open-loop at rate per second for the duration, on up to 128 at once, and
// returns how many were created per second from the first start to the last answer, and each create's
// latency.
func createAtRate(t *T, client kubernetes.Interface, namespace, prefix string, rate int, duration time.Duration) (float64, []time.Duration, int) {
	total := int(float64(rate) * duration.Seconds())
	slots := make(chan struct{}, 128)
	var (
		mu        sync.Mutex
		latencies []time.Duration
		failed    int
		wg        sync.WaitGroup
	)
	started := time.Now()
	for i := range total {
		due := started.Add(time.Duration(i) * time.Second / time.Duration(rate))
		time.Sleep(time.Until(due))
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			begin := time.Now()
			_, err := client.CoreV1().Pods(namespace).Create(t.ctx, podWith(fmt.Sprintf("%s-%06d", prefix, i), container("app")), metav1.CreateOptions{})
			took := time.Since(begin)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				return
			}
			latencies = append(latencies, took)
		}()
	}
	wg.Wait()
	return float64(len(latencies)) / time.Since(started).Seconds(), latencies, failed
}

func benchScaleAdmission(t *T, e *Env) {
	w := e.webhookFor(t)
	c := w.cluster
	// The second replica: the same arguments on a port of its own.
	second := mustFreePort(t)
	args := slices.Clone(w.args)
	for i, arg := range args {
		if strings.HasPrefix(arg, "--listen-address=") {
			args[i] = "--listen-address=127.0.0.1:" + strconv.Itoa(second)
		}
	}
	replica, err := e.start("gpuguard-webhook-2", e.gpuguard("gpuguard-webhook"), args...)
	t.must(err, "starting the second webhook replica")
	defer replica.stop()
	proxy, stopProxy := roundRobin(t, []int{w.port, second})
	defer stopProxy()

	unlimited := rest.CopyConfig(c.config)
	unlimited.QPS = -1
	client, err := kubernetes.NewForConfig(unlimited)
	t.must(err, "making a client without a rate limit")
	webhooks := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	bindings := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	installed, err := webhooks.Get(t.ctx, "gpuguard", metav1.GetOptions{})
	t.must(err, "reading gpuguard's MutatingWebhookConfiguration")
	binding, err := bindings.Get(t.ctx, backstopBinding, metav1.GetOptions{})
	t.must(err, "reading the backstop's binding")
	webhookName := installed.Webhooks[0].Name
	direct := *installed.Webhooks[0].ClientConfig.URL
	viaProxy := strings.Replace(direct, ":"+strconv.Itoa(w.port)+"/", ":"+strconv.Itoa(proxy)+"/", 1)
	setGpuguard := func(on bool) {
		if on {
			config := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: installed.Name, Labels: installed.Labels},
				Webhooks: slices.Clone(installed.Webhooks)}
			for i := range config.Webhooks {
				config.Webhooks[i].ClientConfig.URL = &viaProxy
			}
			_, err := webhooks.Create(t.ctx, config, metav1.CreateOptions{})
			t.must(err, "creating gpuguard's webhook configuration through the proxy")
			_, err = bindings.Create(t.ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
				ObjectMeta: metav1.ObjectMeta{Name: binding.Name, Labels: binding.Labels}, Spec: binding.Spec}, metav1.CreateOptions{})
			t.must(err, "creating the backstop's binding")
		} else {
			t.must(webhooks.Delete(t.ctx, installed.Name, metav1.DeleteOptions{}), "deleting gpuguard's webhook configuration")
			t.must(bindings.Delete(t.ctx, binding.Name, metav1.DeleteOptions{}), "deleting the backstop's binding")
		}
		time.Sleep(backstopSettle)
	}
	setGpuguard(false)
	setGpuguard(true)
	defer func() { // as the other scenarios expect it: pointed at the first replica directly
		setGpuguard(false)
		restored := installed.DeepCopy()
		restored.ResourceVersion, restored.UID = "", ""
		_, err := webhooks.Create(t.ctx, restored, metav1.CreateOptions{})
		t.must(err, "restoring gpuguard's webhook configuration")
		_, err = bindings.Create(t.ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: binding.Name, Labels: binding.Labels}, Spec: binding.Spec}, metav1.CreateOptions{})
		t.must(err, "restoring the backstop's binding")
	}()

	const namespace = "e2e-bench-admission"
	c.namespace(t, namespace, nil)
	defer deletePods(t, client, namespace, nil)
	inPath := true // gpuguard's configuration and binding are in place, through the proxy
	phase := 0
	for _, rate := range []int{100, 500} {
		for _, on := range []bool{true, false, true, false} { // alternated, so that drift lands on both
			if on != inPath {
				setGpuguard(on)
				inPath = on
			}
			phase++
			before, cpuBefore := readAdmissionHistogram(t, c, webhookName), cpuByCommand()
			achieved, latencies, failed := createAtRate(t, client, namespace, fmt.Sprintf("r%d-%d", rate, phase), rate, 10*time.Second)
			after, cpuAfter := readAdmissionHistogram(t, c, webhookName), cpuByCommand()
			if len(latencies) == 0 {
				t.Fatalf("admission at %d/s: every create failed (%d)", rate, failed)
			}
			p50, calls := after.quantile(before, 0.5)
			p99, _ := after.quantile(before, 0.99)
			with := map[bool]string{true: "with gpuguard", false: "without gpuguard"}[on]
			t.Logf("admission at %d/s, %s: %.1f creates/s achieved, %d failed; create latency p50 %.1f ms, p99 %.1f ms; webhook admission (API server's histogram, %d calls) p50 %.1f ms, p99 %.1f ms",
				rate, with, achieved, failed, ms(percentileOf(latencies, 0.5)), ms(percentileOf(latencies, 0.99)), calls, p50*1000, p99*1000)
			// Both webhook replicas share one command name; the harness is the client and the round-robin proxy.
			t.Logf("  CPU ms per create: %s", cpuPerUnit(cpuBefore, cpuAfter, len(latencies), "kube-apiserver", "etcd", "gpuguard-webhoo", "gpuguard-e2e"))
			deletePods(t, client, namespace, nil)
		}
	}
	if !inPath {
		setGpuguard(true)
	}
	t.must(replica.alive(), "the second replica")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// peakMemory is a process's VmHWM and VmRSS in MiB.
func peakMemory(p *process) (peak, now float64) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return math.NaN(), math.NaN()
	}
	for _, line := range strings.Split(string(status), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "VmHWM:":
			peak = kb / 1024
		case "VmRSS:":
			now = kb / 1024
		}
	}
	return peak, now
}

// SCALE_CACHE_NODES (default 5000) and SCALE_CACHE_PODS (default 150000) size scale/cluster-caches; a
// quarter of the pods hold a GPU, spread over 1,000 namespaces.
func benchScaleCaches(t *T, e *Env) {
	nodes := envInts("SCALE_CACHE_NODES", []int{5000})[0]
	podCount := envInts("SCALE_CACHE_PODS", []int{150000})[0]
	s := e.startScaleCluster(t, "scale-caches")
	defer s.stop()
	s.namespace(t, gpuguardNamespace, nil)
	started := time.Now()
	gpuNames := s.addNodes(t, nodes, 0)
	t.Logf("%d kwok GPU nodes Ready in %.1f s", nodes, time.Since(started).Seconds())
	const namespaces = 1000
	t.must(inParallel(namespaces, func(i int) error {
		_, err := s.bulk.CoreV1().Namespaces().Create(t.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("tenant-%04d", i)}}, metav1.CreateOptions{})
		return err
	}), "creating the namespaces")
	t.must(eventually(t.ctx, 5*time.Minute, func() error {
		accounts, err := s.bulk.CoreV1().ServiceAccounts("").List(t.ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err == nil && len(accounts.Items) < namespaces {
			err = fmt.Errorf("%d default service accounts", len(accounts.Items))
		}
		return err
	}), "waiting for the namespaces' service accounts")
	started = time.Now()
	t.must(inParallel(podCount, func(i int) error {
		gpus := 0
		if i%4 == 0 {
			gpus = 1 << (i / 4 % 4) // 1, 2, 4, 8
		}
		pod := scalePod(fmt.Sprintf("p-%06d", i), gpus)
		pod.Spec.NodeName = gpuNames[i%len(gpuNames)]
		pod.Spec.Tolerations = nil
		_, err := s.bulk.CoreV1().Pods(fmt.Sprintf("tenant-%04d", i%namespaces)).Create(t.ctx, pod, metav1.CreateOptions{})
		return err
	}), "creating the pods")
	t.Logf("%d pods created, bound to %d nodes, in %.1f s", podCount, nodes, time.Since(started).Seconds())
	// Every 10 s: a list of 150,000 pods is itself a load on this machine.
	for running := 0; running < podCount; {
		select {
		case <-t.ctx.Done():
			t.Fatalf("waiting for kwok to run the pods: %v", t.ctx.Err())
		case <-time.After(10 * time.Second):
		}
		if time.Since(started) > 30*time.Minute {
			t.Fatalf("kwok has made %d of %d pods Running in 30 minutes", running, podCount)
		}
		running = 0
		t.must(listAllPods(t, s.bulk, func(pod *corev1.Pod) {
			if pod.Status.Phase == corev1.PodRunning {
				running++
			}
		}), "listing the pods")
	}
	t.Logf("every pod Running %.1f s after the first was created", time.Since(started).Seconds())

	s.measureExtender(t, e, gpuNames)
	s.measureAudit(t, e, podCount)
	s.measureClaimCache(t, e, podCount/10, podCount)
}

func listAllPods(t *T, client kubernetes.Interface, each func(*corev1.Pod)) error {
	options := metav1.ListOptions{Limit: 5000}
	for {
		page, err := client.CoreV1().Pods("").List(t.ctx, options)
		if err != nil {
			return err
		}
		for i := range page.Items {
			each(&page.Items[i])
		}
		if page.Continue == "" {
			return nil
		}
		options.Continue = page.Continue
	}
}

// measureExtender starts the extender against the full cluster, then times prioritize as kube-scheduler
// calls it at this size (percentageOfNodesToScore's 10 % at 5,000 nodes: 500 names).
func (s *scaleCluster) measureExtender(t *T, e *Env, gpuNames []string) {
	started := time.Now()
	extender := startExtender(t, e, s.Cluster)
	defer extender.process.stop()
	synced := time.Since(started)
	cached, err := extender.cachedPods()
	t.must(err, "reading the extender's cache")
	peak, now := peakMemory(extender.process)
	body := fmt.Sprintf(`{"Pod":{"metadata":{"name":"p","namespace":"default"},"spec":{"containers":[{"name":"c","resources":{"limits":{"%s":"1"}}}]}},"NodeNames":["%s"]}`,
		gpuResource, strings.Join(gpuNames[:min(500, len(gpuNames))], `","`))
	url := fmt.Sprintf("https://127.0.0.1:%d/scheduler/prioritize", extender.port)
	var latencies []time.Duration
	for range 300 {
		begin := time.Now()
		resp, err := extender.client.Post(url, "application/json", strings.NewReader(body))
		t.must(err, "calling prioritize")
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("prioritize: %s", resp.Status)
		}
		latencies = append(latencies, time.Since(begin))
	}
	t.Logf("extender at %d nodes: ready (pods and nodes listed) %.1f s after start; %d GPU pods cached; %.1f MiB resident (peak %.1f); prioritize over 500 nodes p50 %.2f ms, p99 %.2f ms (300 calls over one kept TLS connection)",
		len(gpuNames), synced.Seconds(), cached, now, peak, ms(percentileOf(latencies, 0.5)), ms(percentileOf(latencies, 0.99)))
}

// measureAudit runs one audit replica as the chart configures it against the whole cluster.
func (s *scaleCluster) measureAudit(t *T, e *Env, podCount int) {
	w := &webhookInstall{cluster: s.Cluster, policyDir: e.path("volumes", "policy")}
	args := e.installAudit(t, w)
	port := mustFreePort(t)
	for i, arg := range args {
		args[i] = strings.Replace(arg, "127.0.0.1:PORT", "127.0.0.1:"+strconv.Itoa(port), 1)
	}
	started := time.Now()
	p, err := e.startWithEnv("scale-audit", e.gpuguard("gpuguard-webhook"), []string{"POD_NAME=scale-audit", "POD_NAMESPACE=" + gpuguardNamespace}, args...)
	t.must(err, "starting the audit")
	replica := &auditReplica{process: p, port: port}
	defer replica.process.stop()
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", replica.port)
	t.must(eventually(t.ctx, 30*time.Minute, func() error {
		if err := p.alive(); err != nil {
			return err
		}
		judged, err := replica.metric("gpuguard_audit_pods")
		if err == nil && judged < podCount {
			err = fmt.Errorf("the audit's last pass judged %d of %d pods", judged, podCount)
		}
		return err
	}), "waiting for the audit's full pass")
	first := time.Since(started)
	pass, err := scrapeFloat(http.DefaultClient, metrics, "gpuguard_audit_last_pass_duration_seconds")
	t.must(err, "reading the pass's duration")
	// The leader writes the pass's reports after it, one at a time: done when there is one for each
	// namespace its own series name as exposed.
	exposed := exposedNamespaces(t, metrics)
	reports := 0
	t.must(eventually(t.ctx, 30*time.Minute, func() error {
		list, err := s.dynamic.Resource(policyReports).Namespace("").List(t.ctx, metav1.ListOptions{})
		if err == nil {
			if reports = len(list.Items); reports < exposed {
				err = fmt.Errorf("%d PolicyReports of %d", reports, exposed)
			}
		}
		return err
	}), "waiting for the PolicyReports")
	written := time.Since(started)
	peak, now := peakMemory(replica.process)
	t.Logf("audit over %d pods in 1,000 namespaces: first full pass done %.1f s after start (last pass %.2f s); %d PolicyReports (one per namespace its series name exposed) written by %.1f s after start; %.1f MiB resident (peak %.1f)",
		podCount, first.Seconds(), pass, reports, written.Seconds(), now, peak)
}

// measureClaimCache creates ResourceClaims across the namespaces and starts the webhook against them:
// the time until its claim cache is synced, and its memory.
func (s *scaleCluster) measureClaimCache(t *T, e *Env, claims, podCount int) {
	if s.draVersion != "v1" {
		t.Logf("claim cache: not measured, the API server serves resource.k8s.io %q, not v1", s.draVersion)
		return
	}
	started := time.Now()
	t.must(inParallel(claims, func(i int) error {
		claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%06d", i)},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
				Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}}}}}
		_, err := s.bulk.ResourceV1().ResourceClaims(fmt.Sprintf("tenant-%04d", i%1000)).Create(t.ctx, claim, metav1.CreateOptions{})
		return err
	}), "creating ResourceClaims")
	t.Logf("%d ResourceClaims created in %.1f s", claims, time.Since(started).Seconds())
	w := e.installWebhook(t, s.Cluster)
	defer w.stop()
	w.stop()
	started = time.Now()
	w.start(t, e)
	client := w.httpClient(t)
	t.must(eventually(t.ctx, 10*time.Minute, func() error {
		synced, err := scrape(client, fmt.Sprintf("https://127.0.0.1:%d/metrics", w.port), "gpuguard_resource_claims_synced")
		if err == nil && synced != 1 {
			err = fmt.Errorf("claims not synced")
		}
		return err
	}), "waiting for the webhook's claim cache")
	peak, now := peakMemory(w.process)
	t.Logf("webhook claim cache with %d ResourceClaims beside %d pods: synced %.1f s after start; %.1f MiB resident (peak %.1f)",
		claims, podCount, time.Since(started).Seconds(), now, peak)
}

// exposedNamespaces is how many namespaces the audit's gpuguard_audit_exposed_pods series name.
func exposedNamespaces(t *T, metrics string) int {
	resp, err := http.Get(metrics)
	t.must(err, "reading the audit's metrics")
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	t.must(err, "reading the audit's metrics")
	namespaces := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^gpuguard_audit_exposed_pods\{[^}]*namespace="([^"]*)"`).FindAllSubmatch(body, -1) {
		namespaces[string(m[1])] = true
	}
	if len(namespaces) == 0 {
		t.Fatalf("the audit names no namespace in gpuguard_audit_exposed_pods")
	}
	return len(namespaces)
}

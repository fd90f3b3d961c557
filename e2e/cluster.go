// The real control plane, started once per run when a scenario first needs it: etcd, kube-apiserver
// (static tokens for the harness and the scheduler, RBAC, an audit log) and kube-controller-manager with
// the controllers the scenarios rely on (service accounts, Deployments, ReplicaSets).
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

const (
	adminToken     = "gpuguard-e2e-admin-token"
	schedulerToken = "gpuguard-e2e-scheduler-token"
	// The real node's kubelet: system:node:<name> in system:nodes, which the Node authorizer reads.
	kubeletToken = "gpuguard-e2e-kubelet-token"
	// The first address of --service-cluster-ip-range: the kubernetes Service's.
	kubernetesServiceIP = "10.96.0.1"
)

type Cluster struct {
	dir      string // its files: certificates, kubeconfigs, etcd's data
	server   string // https://127.0.0.1:port
	port     int
	caFile   string
	caPEM    []byte
	ca       *authority
	config   *rest.Config
	client   kubernetes.Interface
	dynamic  dynamic.Interface
	mapper   *restmapper.DeferredDiscoveryRESTMapper
	auditLog string
	// The API server's /version, and the newest resource.k8s.io version it serves of those gpuguard
	// reads (v1, v1beta2, v1beta1), empty when none.
	version    *version.Info
	draVersion string
	// etcd, kube-apiserver and kube-controller-manager, for stop.
	processes []*process
}

// stop ends a control plane that a scenario started for itself (the run's own ones end with the run).
func (c *Cluster) stop() {
	for i := len(c.processes) - 1; i >= 0; i-- {
		c.processes[i].stop()
	}
}

// The release of a Kubernetes binary, from its --version ("Kubernetes v1.33.13" -> "v1.33.13").
func binaryVersion(path string) (string, error) {
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	version, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "Kubernetes ")
	if !ok {
		return "", fmt.Errorf("%s --version said %q", path, out)
	}
	return version, nil
}

// The minor of a Kubernetes binary's release.
func binaryMinor(path string) (int, error) {
	version, err := binaryVersion(path)
	if err != nil {
		return 0, err
	}
	var major, minor int
	if _, err := fmt.Sscanf(version, "v%d.%d", &major, &minor); err != nil {
		return 0, fmt.Errorf("%s is release %q: %w", path, version, err)
	}
	return minor, nil
}

// What the API server of a minor needs besides the common flags: on 1.32 and 1.33, DRA's beta API is
// off by default, and the admin who wants claims turns it on (with the feature gate that keeps a pod's
// resourceClaims); the scenarios do the same, so that claims are read through v1beta1 and v1beta2. 1.33's
// own informers (the node authorizer's) still read v1beta1, so it is served there too.
func draFlags(minor int) []string {
	switch minor {
	case 32:
		return []string{"--feature-gates=DynamicResourceAllocation=true", "--runtime-config=resource.k8s.io/v1beta1=true"}
	case 33:
		return []string{"--feature-gates=DynamicResourceAllocation=true",
			"--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"}
	}
	return nil
}

// cluster starts the control plane on first use.
func (e *Env) clusterFor(t *T) *Cluster {
	e.mu.Lock()
	c := e.cluster
	e.mu.Unlock()
	if c != nil {
		return c
	}
	c, err := e.startCluster("control-plane", "")
	t.must(err, "starting the control plane")
	e.mu.Lock()
	e.cluster = c
	e.mu.Unlock()
	return c
}

// startCluster starts a control plane whose files and logs are named after name. With a nodeAddress, it
// is the real node's: the API server also listens there (in the run's own network namespace), for the
// pods, which reach it through the kubernetes Service. apiserverFlags are added to the API server's.
func (e *Env) startCluster(name, nodeAddress string, apiserverFlags ...string) (*Cluster, error) {
	dir := e.path(name)
	logPrefix, bindAddress, advertiseAddress := "", "127.0.0.1", "127.0.0.1"
	controllers := "serviceaccount-controller,deployment-controller,replicaset-controller"
	if nodeAddress != "" {
		logPrefix, bindAddress, advertiseAddress = "node-", "0.0.0.0", nodeAddress
		// What a real node's pods need. Not on the other control plane: the node lifecycle controller
		// would taint and update the scheduler scenario's kubelet-less nodes under it.
		controllers += ",daemonset-controller,endpoints-controller,endpointslice-controller," +
			"root-ca-certificate-publisher-controller,node-lifecycle-controller,garbage-collector-controller," +
			"job-controller,namespace-controller," + // the chart's arm hook is a Job; break-glass deletes namespaces
			"disruption-controller" // node/webhook-killed evicts a replica under the chart's PodDisruptionBudget
	}
	os.RemoveAll(dir) // a -work directory kept from an earlier run starts with a fresh etcd
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := newAuthority()
	if err != nil {
		return nil, err
	}
	if nodeAddress == "" && name != "control-plane" {
		logPrefix = name + "-" // a scenario's own control plane
	}
	c := &Cluster{dir: dir, ca: ca, caPEM: ca.certPEM, caFile: filepath.Join(dir, "ca.crt"), auditLog: e.path("logs", logPrefix+"audit.log")}
	// A control plane that fails to start stops what it started, rather than leaving it to the run's end.
	started := false
	defer func() {
		if !started {
			c.stop()
		}
	}()
	files := map[string]string{
		c.caFile: string(ca.certPEM),
		filepath.Join(dir, "tokens.csv"): adminToken + ",gpuguard-e2e-admin,1,\"system:masters\"\n" + schedulerToken + ",system:kube-scheduler,2\n" +
			kubeletToken + ",system:node:" + nodeName + ",3,\"system:nodes\"\n",
		filepath.Join(dir, "audit-policy.yaml"): `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    resources: [{group: "", resources: ["pods", "pods/ephemeralcontainers"]}]
  - level: None
`,
		// Pod Security as a cluster may configure it: one namespace exempt whatever its labels
		// (manifests-validate: the chart's checkPodSecurity=false), the defaults as the API server's own.
		filepath.Join(dir, "admission.yaml"): `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: PodSecurity
    configuration:
      apiVersion: pod-security.admission.config.k8s.io/v1
      kind: PodSecurityConfiguration
      defaults: {enforce: privileged, audit: privileged, warn: privileged}
      exemptions: {namespaces: [` + podSecurityExemptNamespace + `]}
`,
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			return nil, err
		}
	}
	if err := ca.issue(filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key"),
		"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", kubernetesServiceIP, advertiseAddress); err != nil {
		return nil, err
	}
	if err := newSigningKey(filepath.Join(dir, "sa.key")); err != nil {
		return nil, err
	}
	// The API server's client certificate to the kubelet (logs, exec, port-forward), which the node's
	// kubelet trusts by this CA.
	if err := ca.issue(filepath.Join(dir, "kubelet-client.crt"), filepath.Join(dir, "kubelet-client.key"), "kube-apiserver-kubelet-client"); err != nil {
		return nil, err
	}

	etcdClient, etcdPeer, apiPort := 0, 0, 0
	for _, port := range []*int{&etcdClient, &etcdPeer, &apiPort} {
		if *port, err = freePort(); err != nil {
			return nil, err
		}
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	etcd, err := e.start(logPrefix+"etcd", e.component("etcd"),
		"--name=e2e", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=e2e="+peerURL, "--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return nil, err
	}
	c.processes = append(c.processes, etcd)
	if err := eventually(e.ctx, time.Minute, func() error {
		if err := etcd.alive(); err != nil {
			return err
		}
		resp, err := http.Get(etcdURL + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd /health: %s", resp.Status)
		}
		return nil
	}); err != nil {
		return nil, err
	}

	c.server, c.port = fmt.Sprintf("https://127.0.0.1:%d", apiPort), apiPort
	minor, err := binaryMinor(e.component("kube-apiserver"))
	if err != nil {
		return nil, err
	}
	apiserver, err := e.start(logPrefix+"kube-apiserver", e.component("kube-apiserver"), append([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + bindAddress, "--advertise-address=" + advertiseAddress, "--secure-port=" + strconv.Itoa(apiPort),
		"--tls-cert-file=" + filepath.Join(dir, "apiserver.crt"), "--tls-private-key-file=" + filepath.Join(dir, "apiserver.key"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		// The kubelet at the node's address (no DNS resolves its name here), as the API server's client.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate=" + filepath.Join(dir, "kubelet-client.crt"),
		"--kubelet-client-key=" + filepath.Join(dir, "kubelet-client.key"),
		// Webhooks are called at their Services' endpoints: no kube-proxy runs (docs/testing.md).
		"--enable-aggregator-routing=true",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/24",
		"--endpoint-reconciler-type=none",
		// Privileged containers are one of the fixture shapes.
		"--allow-privileged=true",
		"--audit-policy-file=" + filepath.Join(dir, "audit-policy.yaml"), "--audit-log-path=" + c.auditLog,
		"--audit-log-mode=blocking",
		"--admission-control-config-file=" + filepath.Join(dir, "admission.yaml"),
		"--profiling=false"}, append(draFlags(minor), apiserverFlags...)...)...)
	if err != nil {
		return nil, err
	}
	c.processes = append(c.processes, apiserver)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.certPEM)
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if err := eventually(e.ctx, 2*time.Minute, func() error {
		if err := apiserver.alive(); err != nil {
			return err
		}
		req, _ := http.NewRequest(http.MethodGet, c.server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := probe.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("kube-apiserver /readyz: %s", resp.Status)
		}
		return nil
	}); err != nil {
		return nil, err
	}

	// Warnings are read where a scenario asks for them (clientCollectingWarnings), not printed.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	c.config = &rest.Config{Host: c.server, BearerToken: adminToken, TLSClientConfig: rest.TLSClientConfig{CAData: ca.certPEM},
		QPS: 100, Burst: 200, UserAgent: "gpuguard-e2e"}
	if c.client, err = kubernetes.NewForConfig(c.config); err != nil {
		return nil, err
	}
	if c.dynamic, err = dynamic.NewForConfig(c.config); err != nil {
		return nil, err
	}
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.client.Discovery()))
	if c.version, err = c.client.Discovery().ServerVersion(); err != nil {
		return nil, fmt.Errorf("reading /version: %w", err)
	}
	groups, err := c.client.Discovery().ServerGroups()
	if err != nil {
		return nil, fmt.Errorf("reading the API groups: %w", err)
	}
	for _, group := range groups.Groups {
		if group.Name != "resource.k8s.io" {
			continue
		}
		for _, want := range []string{"v1", "v1beta2", "v1beta1"} {
			if c.draVersion == "" && slices.ContainsFunc(group.Versions, func(v metav1.GroupVersionForDiscovery) bool { return v.Version == want }) {
				c.draVersion = want
			}
		}
	}

	adminKubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := c.writeKubeconfig(adminKubeconfig, adminToken); err != nil {
		return nil, err
	}
	manager, err := e.start(logPrefix+"kube-controller-manager", e.component("kube-controller-manager"),
		"--kubeconfig="+adminKubeconfig, "--leader-elect=false", "--secure-port=0", "--root-ca-file="+c.caFile,
		"--controllers="+controllers)
	if err != nil {
		return nil, err
	}
	c.processes = append(c.processes, manager)
	// The service account controller creates "default" in every namespace; pods need it.
	if err := eventually(e.ctx, time.Minute, func() error {
		if err := manager.alive(); err != nil {
			return err
		}
		_, err := c.client.CoreV1().ServiceAccounts("default").Get(e.ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return nil, fmt.Errorf("kube-controller-manager did not create the default service account: %w", err)
	}
	started = true
	return c, nil
}

func (c *Cluster) writeKubeconfig(path, token string) error {
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: e2e, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: e2e}}]
current-context: e2e
`, c.server, c.caFile, token)
	return os.WriteFile(path, []byte(config), 0o600)
}

// namespace creates a namespace (labels as given) and waits for its default service account.
func (c *Cluster) namespace(t *T, name string, labels map[string]string) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := c.client.CoreV1().Namespaces().Create(t.ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	t.must(eventually(t.ctx, time.Minute, func() error {
		_, err := c.client.CoreV1().ServiceAccounts(name).Get(t.ctx, "default", metav1.GetOptions{})
		return err
	}), "waiting for the default service account in "+name)
}

// warningsClient is a client whose requests collect the apiserver's Warning headers.
type warningsClient struct {
	kubernetes.Interface
	mu       sync.Mutex
	warnings []string
}

func (w *warningsClient) HandleWarningHeader(code int, agent string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.warnings = append(w.warnings, text)
}

func (w *warningsClient) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	taken := w.warnings
	w.warnings = nil
	return taken
}

func (c *Cluster) clientCollectingWarnings(t *T) *warningsClient {
	w := &warningsClient{}
	config := rest.CopyConfig(c.config)
	config.WarningHandler = w
	client, err := kubernetes.NewForConfig(config)
	t.must(err, "making a client")
	w.Interface = client
	return w
}

// auditEvent is the part of an audit.k8s.io/v1 Event the scenarios read.
type auditEvent struct {
	Stage       string            `json:"stage"`
	Verb        string            `json:"verb"`
	ObjectRef   *auditObjectRef   `json:"objectRef"`
	Annotations map[string]string `json:"annotations"`
	Code        int               `json:"-"`
}

type auditObjectRef struct {
	Resource    string `json:"resource"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	Subresource string `json:"subresource"`
}

// auditAnnotations returns the annotations the apiserver recorded for the completed request on the
// pod (or its subresource), waiting for the event to be written.
func (c *Cluster) auditAnnotations(t *T, namespace, name, subresource string) map[string]string {
	var found map[string]string
	err := eventually(t.ctx, 10*time.Second, func() error {
		f, err := os.Open(c.auditLog)
		if err != nil {
			return err
		}
		defer f.Close()
		scanner := bufio.NewScanner(f)
		scanner.Buffer(make([]byte, 1<<20), 16<<20)
		for scanner.Scan() {
			var event auditEvent
			if json.Unmarshal(scanner.Bytes(), &event) != nil || event.ObjectRef == nil || event.Stage != "ResponseComplete" {
				continue
			}
			ref := event.ObjectRef
			if ref.Resource == "pods" && ref.Namespace == namespace && ref.Name == name && ref.Subresource == subresource &&
				(event.Verb == "create" || event.Verb == "update" || event.Verb == "patch") {
				found = event.Annotations
			}
		}
		if found == nil {
			return fmt.Errorf("no audit event for pods/%s %s/%s in %s", subresource, namespace, name, c.auditLog)
		}
		return nil
	})
	t.must(err, "reading the audit log")
	return found
}

// serviceAccountToken asks the apiserver for a token of a gpuguard-system service account, as the kubelet
// projects one into a pod, and writes it to a file.
func (c *Cluster) serviceAccountToken(t *T, e *Env, account string) string {
	token, err := c.client.CoreV1().ServiceAccounts(gpuguardNamespace).CreateToken(t.ctx, account,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	t.must(err, "requesting a token for service account "+account)
	path := e.path("control-plane", account+".token")
	t.must(os.WriteFile(path, []byte(token.Status.Token), 0o600), "writing the token of "+account)
	return path
}

func joinLines(lines []string) string { return strings.Join(lines, " | ") }

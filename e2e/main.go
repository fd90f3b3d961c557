// gpuguard-e2e runs gpuguard's three programs against the real Kubernetes components they meet in a
// cluster: etcd, kube-apiserver, kube-controller-manager and kube-scheduler as processes built from the
// pinned release (go.mod), and the kubelet's own device manager in-process; then, in the node/ scenarios,
// on a real node (node.go): the kubelet, containerd and NVIDIA's runtime, with gpuguard installed by Helm.
// Every scenario asserts on what the real API server stored or answered, on what the real device manager
// hands a container, or on what a container sees from inside; gpuguard's logs are read only where what
// they say is the subject (scale/extender: the extender's reasons for what it skips). It runs in
// namespaces of its own (namespace.go), so it needs root; everything listens on 127.0.0.1 or in them.
//
//	gpuguard-e2e -components DIR -gpuguard DIR -source DIR [-control-plane DIR] [-peers DIR] [-run REGEXP] [-work DIR] [-keep]
//
// It prints the API server's version first (from /version), then one line per scenario, and closes with
// "N passed, N failed, N skipped (why: which, ...)"; a scenario is skipped, by name and with the reason,
// only where the API server is older than what it needs (-control-plane: another minor's), or where it
// runs a peer (NVIDIA's device plugin) and -peers is not given. The exit status is 1 when any scenario
// failed or none ran.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

type scenario struct {
	name  string
	about string
	run   func(t *T, e *Env)
}

// What a scenario needs of the API server beyond 1.30, said as the reason it is skipped without it.
var scenarioNeeds = map[string]func(c *Cluster) string{"dra-claims": needsDRA}

// The control plane has a resource.k8s.io version gpuguard reads claims through.
func needsDRA(c *Cluster) string {
	if c.draVersion == "" {
		return "needs 1.34"
	}
	return ""
}

// The order matters only for speed: the webhook scenarios share one installation, made by whichever of
// them runs first, so that any one of them can also run alone.
var scenarios = []scenario{
	{"webhook-as-shipped", "manifests/default applied; pods of every fixture shape and a Deployment's pods are stored patched", webhookAsShipped},
	{"ephemeral-containers", "a debug container added through pods/ephemeralcontainers gets none, also on a pod older than the webhook", ephemeralContainers},
	{"reinvocation", "a container added by a later webhook is patched when gpuguard is reinvoked", reinvocation},
	{"policy", "strict, audit, off, exemptions and privileged: deny, from the ConfigMap through a kubelet-style volume", policyModes},
	{"failure-policy-and-backstop", "webhook down: Fail refuses, Ignore falls back to the ValidatingAdmissionPolicy; back up: admitted", failurePolicyAndBackstop},
	{"backstop-pod-updates", "the backstop refuses a pod UPDATE that gives a gated pod the NRI toleration or gpuguard's allocation key, which the webhook never sees; labels and other annotations change as before", backstopPodUpdates},
	{"trusted-namespaces", "a tenant that may create namespaces cannot create gpu-operator, nvidia-device-plugin, dra-driver-nvidia-gpu, nvidia-dra-driver-gpu or gpuguard-system (dry run, refused by gpuguard's guard); the admin can, and so can the tenant bound to the shipped creator role; a tenant that may label namespaces cannot add gpuguard.io/ignore or change its value, the admin can, and pods there are then admitted unpatched", trustedNamespaces},
	{"admission-switches", "the webhook says on /metrics what takes pods out of its admission unseen, under the shipped RBAC: its watches working, the backstop's policy present; a namespace labelled gpuguard.io/ignore=break-glass counted, and not once taken off; the backstop's binding and the webhook configuration deleted, said gone; the binding made again refuses an unpatched pod, then follows gpuguard-policy's exemption of its namespace; applied again, present", admissionSwitches},
	{"dra-claims", "containers claiming a GPU device class (learned by list and watch) keep their GPUs; others, and unknown claims, get none", draClaims},
	{"other-doors", "hostPath device mounts, CDI annotations and listed RuntimeClasses are warned about or refused", otherDoors},
	{"scheduler-extender", "kube-scheduler binds 1, 1, 2 GPU pods with the extender and with MostAllocated, not with the defaults", schedulerExtender},
	{"scale/extender", "about 100 kwok nodes and 1,000 pods through kube-scheduler with the extender: every pod bound, no GPU over-committed, best fit's whole nodes left free; nonsense nodes and an overflowing pod skipped with a reason", scaleExtender},
	{"manifests-validate", "every kustomize overlay and every Helm values file is accepted by the apiserver's strict server-side dry run", validateManifests},
	{"chart-upgrade", "the previous chart (tests/fixtures/chart-previous.tgz) installed as a release, with additions of its own, upgraded to this one with --reuse-values, rolled back, then the same with --reset-then-reuse-values: no excluded namespace or GPU infrastructure entry of either chart lost, and the rollback applies the previous chart's exactly; a rollback between two revisions of this chart says in helm status what it restored", chartUpgrade},
	{"audit-reports", "the audit controller's PolicyReports and series: a pod admitted unpatched, an exempt one, a deleted one; the leader killed, the other takes over", auditReports},
	{"device-plugin", "the kubelet's device manager registers, allocates (time-sliced and MIG too) and tracks health through gpuguard-device-plugin", devicePlugin},
}

func init() { scenarios = append(scenarios, nodeScenarios...) }

func main() {
	if filepath.Base(os.Args[0]) == hostClampName {
		os.Exit(hostClamp(os.Args[1:]))
	}
	if len(os.Args) > 1 && os.Args[1] == deviceManagerChildArg {
		os.Exit(deviceManagerChild(os.Args[2:]))
	}
	var cfg Config
	flag.StringVar(&cfg.Components, "components", "", "directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kustomize, helm, containerd (and its shim and ctr), nvidia-container-runtime and pause")
	flag.StringVar(&cfg.ControlPlane, "control-plane", "", "directory with another minor's kube-apiserver, kube-controller-manager and kube-scheduler, used instead of those in -components; the node scenarios are skipped")
	flag.StringVar(&cfg.Gpuguard, "gpuguard", "", "directory with gpuguard-webhook, gpuguard-scheduler-extender, gpuguard-device-plugin, gpuguard-node-enforcer and gpuguard-mask-check")
	flag.StringVar(&cfg.Source, "source", "", "the gpuguard source tree (manifests/, certs/generate.sh)")
	flag.StringVar(&cfg.Peers, "peers", "", "directory with the peers scripts/build-peers built from ../shared/peers (nvidia-device-plugin, gpu-kubelet-plugin); without it the scenarios that run them are skipped")
	flag.StringVar(&cfg.Runtime, "runtime", runtimeContainerd, "the real node's container runtime: containerd, or crio (CRI-O, built with -peers)")
	flag.StringVar(&cfg.Work, "work", "", "working directory for certificates, data and logs (default: a new temporary one)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the working directory (logs of every component) after the run")
	run := flag.String("run", "", "run only the scenarios whose name matches this regular expression")
	bench := flag.String("bench", "", "run the benchmarks whose name matches this regular expression (enforcer_bench.go) instead of the scenarios")
	list := flag.Bool("list", false, "list the scenarios and exit")
	flag.Parse()

	if *list {
		for _, s := range append(slices.Clone(scenarios), benchmarks...) {
			fmt.Printf("%-28s %s\n", s.name, s.about)
		}
		return
	}
	chosen := scenarios
	if *bench != "" {
		chosen, *run = benchmarks, *bench
	}
	filter, err := regexp.Compile(*run)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuguard-e2e: -run: %v\n", err)
		os.Exit(2)
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "gpuguard-e2e: %v\n", err)
		os.Exit(2)
	}
	if !insideRunNamespaces() {
		os.Exit(runInNamespaces())
	}
	if os.Getpid() == 1 {
		os.Exit(reapAsInit())
	}
	os.Exit(runAll(cfg, filter, chosen))
}

func runAll(cfg Config, filter *regexp.Regexp, scenarios []scenario) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env, err := newEnv(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuguard-e2e: %v\n", err)
		return 1
	}
	defer env.Close()
	fmt.Printf("gpuguard-e2e: working directory %s\n", env.work)

	// The shared control plane first, when a chosen scenario uses it: its version says what is skipped.
	var cluster *Cluster
	for _, s := range scenarios {
		if filter.MatchString(s.name) && usesSharedControlPlane(s) {
			t := &T{ctx: ctx, name: "control-plane"}
			func() {
				defer func() { _ = recover() }()
				cluster = env.clusterFor(t)
			}()
			if cluster == nil {
				fmt.Printf("gpuguard-e2e: the control plane did not start: %s\n", joinLines(t.failures))
				return 1
			}
			v := cluster.version
			dra := "none"
			if cluster.draVersion != "" {
				dra = "resource.k8s.io/" + cluster.draVersion
			}
			fmt.Printf("gpuguard-e2e: kube-apiserver %s (/version: major %s, minor %s); DRA served: %s\n",
				v.GitVersion, v.Major, v.Minor, dra)
			break
		}
	}

	passed, failed := 0, 0
	var skipOrder []string
	skipped := map[string][]string{}
	for _, s := range scenarios {
		if !filter.MatchString(s.name) {
			continue
		}
		if why := skipReason(env.cfg, cluster, s); why != "" {
			if _, seen := skipped[why]; !seen {
				skipOrder = append(skipOrder, why)
			}
			skipped[why] = append(skipped[why], s.name)
			fmt.Printf("skip  %-28s %6s  %s: %s\n", s.name, "", why, skipDetail[why])
			continue
		}
		started := time.Now()
		t := runScenario(ctx, env, s)
		took := time.Since(started).Round(100 * time.Millisecond)
		if t.failed() {
			failed++
			fmt.Printf("FAIL  %-28s %6s  %s\n", s.name, took, s.about)
			for _, f := range t.failures {
				fmt.Printf("        %s\n", f)
			}
			for _, n := range t.notes {
				fmt.Printf("        note: %s\n", n)
			}
			fmt.Printf("        logs: %s\n", filepath.Join(env.work, "logs"))
			env.keep = true
		} else {
			passed++
			fmt.Printf("ok    %-28s %6s  %s\n", s.name, took, s.about)
			for _, n := range t.notes {
				fmt.Printf("        note: %s\n", n)
			}
		}
	}
	summary := fmt.Sprintf("%d passed, %d failed", passed, failed)
	if len(skipOrder) > 0 {
		var reasons []string
		count := 0
		for _, why := range skipOrder {
			reasons = append(reasons, why+": "+strings.Join(skipped[why], ", "))
			count += len(skipped[why])
		}
		summary += fmt.Sprintf(", %d skipped (%s)", count, strings.Join(reasons, "; "))
	}
	fmt.Println(summary)
	if failed > 0 || passed == 0 {
		return 1
	}
	return 0
}

// Whether the scenario runs against the control plane the run shares (clusterFor): all but the node's,
// which start their own with the node, and the device plugin's, which has no API server.
func usesSharedControlPlane(s scenario) bool {
	return !strings.HasPrefix(s.name, "node/") && s.name != "device-plugin"
}

// What each reason a scenario is skipped for means, for its line.
var skipDetail = map[string]string{
	"needs 1.34":               "resource.k8s.io is not served (GA in 1.34; its beta can be enabled on 1.32 and 1.33)",
	"needs the pinned kubelet": "the real node runs the pinned release's kubelet, which may not be newer than the API server",
	"needs no API server":      "the device plugin meets only the kubelet's device manager, so the pinned release's run covers it",
	"needs the peers":          "NVIDIA's device plugin and DRA driver are built from ../shared/peers: make e2e E2E_PEERS=../shared/peers (.ci/run passes it)",
	"runs once":                "the extender's counting and packing over 100 nodes are the same on every minor; scheduler-extender shows each minor's kube-scheduler calling it",
}

// The scenarios that run a peer (-peers).
var scenariosWithPeers = []string{"node/nvidia-device-plugin", "node/nvidia-dra-driver"}

// Why the scenario does not run against this control plane; "" when it does.
func skipReason(cfg Config, cluster *Cluster, s scenario) string {
	if cfg.ControlPlane != "" {
		if strings.HasPrefix(s.name, "node/") {
			return "needs the pinned kubelet"
		}
		if s.name == "device-plugin" {
			return "needs no API server"
		}
		if s.name == "scale/extender" {
			return "runs once"
		}
	}
	if cfg.Peers == "" && slices.Contains(scenariosWithPeers, s.name) {
		return "needs the peers"
	}
	if needs := scenarioNeeds[s.name]; cluster != nil && needs != nil {
		return needs(cluster)
	}
	return ""
}

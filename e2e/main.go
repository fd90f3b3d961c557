// gpuguard-e2e runs gpuguard's three programs against the real Kubernetes components they meet in a
// cluster: etcd, kube-apiserver, kube-controller-manager and kube-scheduler as processes built from the
// pinned release (go.mod), and the kubelet's own device manager in-process; then, in the node/ scenarios,
// on a real node (node.go): the kubelet, containerd and NVIDIA's runtime, with gpuguard installed by Helm.
// Every scenario asserts on what the real API server stored or answered, on what the real device manager
// hands a container, or on what a container sees from inside; none reads gpuguard's logs. It runs in
// namespaces of its own (namespace.go), so it needs root; everything listens on 127.0.0.1 or in them.
//
//	gpuguard-e2e -components DIR -gpuguard DIR -source DIR [-run REGEXP] [-work DIR] [-keep]
//
// It prints one line per scenario and closes with "N passed, N failed"; the exit status is 1 when any
// scenario failed or none ran.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"
	"time"
)

type scenario struct {
	name  string
	about string
	run   func(t *T, e *Env)
}

// The order matters only for speed: the webhook scenarios share one installation, made by whichever of
// them runs first, so that any one of them can also run alone.
var scenarios = []scenario{
	{"webhook-as-shipped", "manifests/default applied; pods of every fixture shape and a Deployment's pods are stored patched", webhookAsShipped},
	{"ephemeral-containers", "a debug container added through pods/ephemeralcontainers gets none, also on a pod older than the webhook", ephemeralContainers},
	{"reinvocation", "a container added by a later webhook is patched when gpuguard is reinvoked", reinvocation},
	{"policy", "strict, audit, off, exemptions and privileged: deny, from the ConfigMap through a kubelet-style volume", policyModes},
	{"failure-policy-and-backstop", "webhook down: Fail refuses, Ignore falls back to the ValidatingAdmissionPolicy; back up: admitted", failurePolicyAndBackstop},
	{"dra-claims", "containers claiming a GPU device class (learned by list and watch) keep their GPUs; others, and unknown claims, get none", draClaims},
	{"other-doors", "hostPath device mounts, CDI annotations and listed RuntimeClasses are warned about or refused", otherDoors},
	{"scheduler-extender", "kube-scheduler binds 1, 1, 2 GPU pods with the extender and with MostAllocated, not with the defaults", schedulerExtender},
	{"manifests-validate", "every kustomize overlay and every Helm values file is accepted by the apiserver's strict server-side dry run", validateManifests},
	{"audit-reports", "the audit controller's PolicyReports and series: a pod admitted unpatched, an exempt one, a deleted one; the leader killed, the other takes over", auditReports},
	{"device-plugin", "the kubelet's device manager registers, allocates (time-sliced and MIG too) and tracks health through gpuguard-device-plugin", devicePlugin},
}

func init() { scenarios = append(scenarios, nodeScenarios...) }

func main() {
	if len(os.Args) > 1 && os.Args[1] == deviceManagerChildArg {
		os.Exit(deviceManagerChild(os.Args[2:]))
	}
	var cfg Config
	flag.StringVar(&cfg.Components, "components", "", "directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kustomize, helm, containerd (and its shim and ctr), nvidia-container-runtime and pause")
	flag.StringVar(&cfg.Gpuguard, "gpuguard", "", "directory with gpuguard-webhook, gpuguard-scheduler-extender and gpuguard-device-plugin")
	flag.StringVar(&cfg.Source, "source", "", "the gpuguard source tree (manifests/, certs/generate.sh)")
	flag.StringVar(&cfg.Work, "work", "", "working directory for certificates, data and logs (default: a new temporary one)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the working directory (logs of every component) after the run")
	run := flag.String("run", "", "run only the scenarios whose name matches this regular expression")
	list := flag.Bool("list", false, "list the scenarios and exit")
	flag.Parse()

	if *list {
		for _, s := range scenarios {
			fmt.Printf("%-28s %s\n", s.name, s.about)
		}
		return
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
	os.Exit(runAll(cfg, filter))
}

func runAll(cfg Config, filter *regexp.Regexp) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env, err := newEnv(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuguard-e2e: %v\n", err)
		return 1
	}
	defer env.Close()
	fmt.Printf("gpuguard-e2e: working directory %s\n", env.work)

	passed, failed := 0, 0
	for _, s := range scenarios {
		if !filter.MatchString(s.name) {
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
	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 || passed == 0 {
		return 1
	}
	return 0
}

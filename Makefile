# The two commands a new machine needs: `make run` and `make test`. Everything else is a step of those.
SHELL := bash
.SHELLFLAGS := -o pipefail -c
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2
LISTEN ?= 127.0.0.1:8443
CERT_DIR := certs/dev
SAMPLE := tests/fixtures/admission/mixed/review.json

SANITIZE_DIR := build-sanitize
FUZZ_SECONDS ?= 60

# The end-to-end harness and the real Kubernetes components, built from e2e/go.mod by scripts/go.
E2E_DIR := $(BUILD_DIR)/e2e
E2E_RUN ?=
E2E_RUNTIME ?=
# The node's peers and runtime, for make e2e and the node's benchmarks (bench-node, bench-pod-start*).
E2E_NODE = $(if $(E2E_PEERS),-peers $(E2E_DIR)/peers) $(if $(E2E_RUNTIME),-runtime $(E2E_RUNTIME))
# K8S=1.30 (or 1.32, 1.33): the control plane of that minor, from its own wrapper module e2e/k8s-<minor>, for
# the control-plane scenarios; empty: the release e2e/go.mod pins, for every scenario.
K8S ?=
E2E_K8S_DIR := $(BUILD_DIR)/e2e-k8s-$(K8S)
CONTROL_PLANE := k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler
GO := $(CURDIR)/scripts/go
K8S_COMPONENTS := k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl sigs.k8s.io/kustomize/kustomize/v5 ./cmd/etcd \
  sigs.k8s.io/kwok/cmd/kwok
# The real node: the kubelet, containerd v2 (no snapshotters that need C libraries), NVIDIA's runtime (cgo;
# NVML is dlopened, so no driver is needed to build it; its bindings' deprecation warnings are not ours), and
# nvidia-cdi-hook, which the CDI specs of NVIDIA's DRA driver name as hooks.
NODE_COMPONENTS := k8s.io/kubernetes/cmd/kubelet github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr \
  github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime \
  github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook

# Warnings are errors in CI builds (CI=true), and wherever WERROR=ON is asked for.
WERROR ?= $(if $(filter true,$(CI)),ON,OFF)
CXX_SOURCES = $(shell git ls-files '*.cpp' '*.hpp')

.PHONY: deps build run test test-sanitize test-tsan test-image e2e e2e-build fuzz bench bench-enforcer-request bench-node bench-backstop bench-pod-start bench-pod-start-parts bench-scale bench-webhook-ab bench-nginx-floor certs clean format lint

deps:
	./scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DGPUGUARD_WERROR=$(WERROR)
	cmake --build $(BUILD_DIR) -j$(JOBS)

# A filter that selects nothing fails (--no-tests=error); under CI=true a skipped test fails the run too.
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure --no-tests=error -j$(JOBS) | tee ctest.log
	@if [ "$${CI:-}" = true ] && grep -Eq '\*\*\*Skipped|Not Run' $(BUILD_DIR)/ctest.log; then \
	  echo "make test: a test was skipped or not run, which CI counts as a failure"; exit 1; fi

# The whole suite again, every binary built with AddressSanitizer and UndefinedBehaviorSanitizer, but for the
# tests labelled no-cxx, whose work is Helm's, Python's or clang-tidy's (tests/CMakeLists.txt says which).
# Warnings stop the release build (make test) of the same sources, not this one: at -O1 with ASan, GCC 12's
# flow analysis warns inside libstdc++ and Asio's coroutine frames (maybe-uninitialized,
# mismatched-new-delete), where the sanitizers themselves check what those warnings guess at.
test-sanitize: deps
	cmake --preset sanitize -DGPUGUARD_WERROR=OFF
	cmake --build --preset sanitize -j$(JOBS)
	cd $(SANITIZE_DIR) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure --no-tests=error -j$(JOBS) -LE no-cxx

# ThreadSanitizer over the tests whose code runs threads in the test's own process (the server, the enforcer's
# core with its fetcher and event writer, the informers, the audit loop, the claim cache) and the real node
# enforcer under its integration tests: a race stops the test (halt_on_error). tests/tsan.supp names what is
# not ours to fix, each with its reason.
TSAN_DIR := build-tsan
TSAN_TARGETS := gpuguard_server_tests gpuguard_enforcer_tests gpuguard_enforcer_integration_tests \
  gpuguard_audit_tests gpuguard_extender_tests gpuguard_kube_tests gpuguard_kube_integration_tests gpuguard_webhook_tests
# catch_discover_tests names each case "<prefix without its space><case>"; the webhook's command-line tests need
# its program, which is not built here. The enforcer's memory-limit test measures memory, which ThreadSanitizer's
# shadow multiplies: it runs under make test.
TSAN_TESTS := ^(server|enforcer|enforcer integration|audit|extender|kube|kube integration|webhook):|^integration: generate dev certificates$$
TSAN_SKIP := ^webhook: audit reports|^enforcer integration:under the chart.s memory limit
test-tsan: deps
	cmake --preset tsan -DGPUGUARD_WERROR=OFF
	cmake --build --preset tsan -j$(JOBS) --target $(TSAN_TARGETS)
	cd $(TSAN_DIR) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --output-on-failure --no-tests=error -j$(JOBS) -R '$(TSAN_TESTS)' -E '$(TSAN_SKIP)'

# The image's root filesystem as the Dockerfile assembles it, each binary run inside it read-only (as UID
# 65532 where the image does): tests/image/image_test.sh. Needs root (unshare, chroot), no container engine.
test-image: build
	tests/image/image_test.sh $(BUILD_DIR)

# .clang-format over every C++ file.
format: deps
	clang-format -i $(CXX_SOURCES)

# Fails on any formatting difference or clang-tidy finding (.clang-tidy) in src/, tests/ and bench/.
# scripts/clang-tidy-cached skips a unit clang-tidy has already passed with everything it reads unchanged
# (GPUGUARD_TIDY_CACHE=off runs them all); entries unused for 30 days go.
TIDY_CACHE_LOG := $(abspath $(BUILD_DIR))/clang-tidy-cache.log
lint: build
	clang-format --dry-run --Werror $(CXX_SOURCES)
	./scripts/clang-tidy-cached --prune 30
	rm -f $(TIDY_CACHE_LOG)
	GPUGUARD_TIDY_CACHE_LOG=$(TIDY_CACHE_LOG) run-clang-tidy -clang-tidy-binary $(CURDIR)/scripts/clang-tidy-cached \
	  -p $(BUILD_DIR) -j $(JOBS) -quiet '$(CURDIR)/(src|tests|bench)/' > $(BUILD_DIR)/clang-tidy.log 2>&1 || \
	  { grep -E '(warning|error):' $(BUILD_DIR)/clang-tidy.log | sort -u || tail -n 20 $(BUILD_DIR)/clang-tidy.log; \
	    echo "make lint: clang-tidy findings"; exit 1; }
	@echo "make lint: clang-tidy ran on $$(grep -c '^ran ' $(TIDY_CACHE_LOG)) units and passed" \
	  "$$(grep -c '^remembered ' $(TIDY_CACHE_LOG)) it remembered clean (scripts/clang-tidy-cached)"

# Micro-benchmarks, TLS load with wrk, large pods, RSS, start-up, Allocate: see docs/benchmarks.md.
bench: build
	BUILD_DIR=$(BUILD_DIR) ./bench/run.sh

# The node enforcer at the largest request NRI can send: its memory (RSS, PSS, private) at rest and at the
# request, its time per create, 16 at once, on one core and under a 100m CPU limit (bench/enforcer_request.sh;
# docs/benchmarks.md).
bench-enforcer-request: build
	BUILD_DIR=$(BUILD_DIR) ./bench/enforcer_request.sh

# The node enforcer's cost to a container's creation through containerd (or CRI-O, E2E_RUNTIME=crio) on the
# real node, and its memory (e2e/enforcer_bench.go; docs/benchmarks.md). Not part of make e2e: it stops the
# node's kubelet.
bench-node: build e2e-build
	$(E2E_DIR)/gpuguard-e2e -components $(E2E_DIR) -gpuguard $(BUILD_DIR) -source $(CURDIR) $(E2E_NODE) -bench '^node/enforcer-create$$'

# The backstop's cost to a pod's creation, and to pod UPDATEs, through the real API server, with gpuguard
# installed, and what webhook.gpuNodeTaints adds to it (e2e/backstop_bench.go; docs/benchmarks.md). Not
# part of make e2e.
bench-backstop: build e2e-build
	$(E2E_DIR)/gpuguard-e2e -components $(E2E_DIR) -gpuguard $(BUILD_DIR) -source $(CURDIR) -bench '^backstop/(create|update|gpu-node-taints)$$'

# Pod create to container running on the real node, with gpuguard installed and without, in turn
# (e2e/podstart_bench.go; docs/benchmarks.md). Not part of make e2e.
bench-pod-start: build e2e-build
	$(E2E_DIR)/gpuguard-e2e -components $(E2E_DIR) -gpuguard $(BUILD_DIR) -source $(CURDIR) $(E2E_NODE) -bench '^node/pod-start$$'

# Where gpuguard's cost to a pod's start lies: installed, without its enforcer, and with nothing of it on
# a create's path, against uninstalled (e2e/podstart_bench.go; docs/benchmarks.md). Not part of make e2e.
bench-pod-start-parts: build e2e-build
	$(E2E_DIR)/gpuguard-e2e -components $(E2E_DIR) -gpuguard $(BUILD_DIR) -source $(CURDIR) $(E2E_NODE) -bench '^node/pod-start-parts$$'

# gpuguard at cluster scale through the real control plane, over kwok GPU nodes: kube-scheduler's defaults,
# MostAllocated and the extender (pods bound per second at 500 and 5,000 nodes; the packing a steady state
# of arrivals and departures leaves), pod creates at 100 and 500/s with and without the webhook, and the
# audit, extender and claim cache at 5,000 nodes and 150,000 pods (e2e/scale_bench.go,
# e2e/scale_cluster_bench.go; docs/benchmarks.md). SCALE_* variables size a quicker run. Not in make e2e.
bench-scale: build e2e-build
	$(E2E_DIR)/gpuguard-e2e -components $(E2E_DIR) -gpuguard $(BUILD_DIR) -source $(CURDIR) -bench '^scale/(scheduling|packing|admission|cluster-caches)$$'

# This tree's webhook beside commit BASE's (default 36e283f) in one run: requests/s with wrk, system calls
# and callgrind instructions per request (bench/webhook_ab.sh; docs/benchmarks.md).
bench-webhook-ab: build
	BUILD_DIR=$(BUILD_DIR) BASE=$(BASE) ./bench/webhook_ab.sh

# The webhook beside nginx, the floor of its transport, in one run: requests/s, p99 and peak RSS, then per
# request instructions, allocations and system calls, and where each one's memory lives
# (bench/nginx_floor.sh; docs/benchmarks.md).
bench-nginx-floor: build
	BUILD_DIR=$(BUILD_DIR) ./bench/nginx_floor.sh

# libFuzzer targets for the admission path, the HTTP request path and the extender, FUZZ_SECONDS each.
fuzz: deps
	JOBS=$(JOBS) ./scripts/fuzz.sh $(FUZZ_SECONDS)

# Real etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubelet from the release pinned in
# e2e/go.mod, containerd and NVIDIA's runtime pinned there too, the pinned kustomize and Helm, and the
# harness; then every scenario (E2E_RUN=regexp for some; ^node/ for the real node's). With K8S=1.30, the
# control plane of that minor instead, and the scenarios that need a newer one are skipped by name.
# E2E_PEERS=../shared/peers (.ci/run passes it): NVIDIA's device plugin built from that vendored source
# (scripts/build-peers) for the scenarios that run it beside gpuguard; without it they are skipped by name.
# E2E_RUNTIME=crio: the real node on CRI-O, built with the peers (so E2E_PEERS too), instead of containerd.
e2e: build e2e-build
	$(E2E_DIR)/gpuguard-e2e -components $(E2E_DIR) -gpuguard $(BUILD_DIR) -source $(CURDIR) \
	  $(if $(K8S),-control-plane $(E2E_K8S_DIR)) $(if $(E2E_RUN),-run '$(E2E_RUN)') \
	  $(E2E_NODE)

e2e-build: deps
	@mkdir -p $(E2E_DIR)
	cd e2e && $(GO) build -p $(JOBS) -ldflags "$$(../scripts/k8s-version-ldflags)" -o $(CURDIR)/$(E2E_DIR)/ $(K8S_COMPONENTS)
	cd e2e && CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" $(GO) build -p $(JOBS) -tags "no_btrfs no_devmapper no_zfs no_aufs" \
	  -ldflags "$$(../scripts/k8s-version-ldflags)" -o $(CURDIR)/$(E2E_DIR)/ $(NODE_COMPONENTS)
	cd e2e && CGO_ENABLED=0 $(GO) build -o $(CURDIR)/$(E2E_DIR)/pause ./cmd/pause
	cd e2e && CGO_ENABLED=0 $(GO) build -o $(CURDIR)/$(E2E_DIR)/mps-stand-in ./cmd/mps-stand-in
	./scripts/build-helm $(CURDIR)/$(E2E_DIR)/helm
	cd e2e && $(GO) build -p $(JOBS) -o $(CURDIR)/$(E2E_DIR)/gpuguard-e2e .
	$(if $(E2E_PEERS),./scripts/build-peers $(E2E_PEERS) $(CURDIR)/$(E2E_DIR)/peers)
	$(if $(K8S),@test -f e2e/k8s-$(K8S)/go.mod || { echo "make e2e: no e2e/k8s-$(K8S)/go.mod (K8S is 1.30, 1.32 or 1.33)"; exit 2; })
	$(if $(K8S),cd e2e/k8s-$(K8S) && ../../scripts/go build -p $(JOBS) -ldflags "$$(../../scripts/k8s-version-ldflags .)" \
	  -o $(CURDIR)/$(E2E_K8S_DIR)/ $(CONTROL_PLANE))

certs: deps
	./certs/generate.sh --out $(CERT_DIR)

run: build certs
	@echo
	@echo "gpuguard-webhook on https://$(LISTEN) with the default policy. In another terminal:"
	@echo
	@echo "  curl --cacert $(CERT_DIR)/ca.crt -H 'Content-Type: application/json' \\"
	@echo "       --data @$(SAMPLE) 'https://$(LISTEN)/mutate?timeout=10s'"
	@echo
	@echo "  $(BUILD_DIR)/gpuguard-webhook review $(SAMPLE)    # the same review offline, patch decoded"
	@echo
	exec $(BUILD_DIR)/gpuguard-webhook --tls-cert-file $(CERT_DIR)/tls.crt \
	  --tls-private-key-file $(CERT_DIR)/tls.key --listen-address $(LISTEN)

clean:
	rm -rf $(BUILD_DIR) $(SANITIZE_DIR) build-fuzz build-debug

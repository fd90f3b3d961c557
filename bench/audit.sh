#!/usr/bin/env bash
# make bench, part 10: the audit controller at cluster scale. bench-apiserver (e2e/cmd) serves NODES nodes
# and PODS running pods of ~1.5 KB, three containers each and none patched by the webhook: every pod is
# exposed (its GPU-less containers keep the image's NVIDIA_VISIBLE_DEVICES), the worst case for what the
# audit keeps and for a pass. Measured, the controller on CPU 0 and the server on CPU 1:
#   - its RSS with an empty cluster (the baseline), then once the first pass over the full one is done
#     (steady), and its high-water mark (peak); the bytes kept per pod are (steady - baseline) / PODS;
#   - the time from start to the end of that first pass, and how long a pass takes (its own gauge);
#   - a forced re-list (every watch ends with 410 Gone): the peak after it.
# bench-apiserver serves no Lease, so no replica leads and nothing is written: a pass is measured alone.
#   bench/audit.sh [PODS] [NODES]
set -euo pipefail
source "$(dirname "$0")/common.sh"
pods="${1:-${BENCH_PODS:-150000}}"
nodes="${2:-${BENCH_NODES:-5000}}"
build_bench_apiserver

series() {  # series NAME: its value from the controller's /metrics, empty when absent
  curl -fs "http://127.0.0.1:$audit_port/metrics" | sed -n "s/^$1 \([0-9.e+-]*\)$/\1/p"
}

# start_audit: sets $audit (pid) and $audit_port; returns once a first pass has ended, with the
# milliseconds it took since the start in $first_pass_ms.
start_audit() {
  audit_port=$(free_port)
  echo bench > "$out/token"
  local start
  start=$(date +%s%N)
  $pin_cache "$build/gpuguard-webhook" audit-controller --listen-address "127.0.0.1:$audit_port" \
    --apiserver-url "$apiserver_url" --token-file "$out/token" --ca-file "$out/certs/ca.crt" \
    --lease-namespace bench --resource-claims off 2>> "$out/audit.log" &
  audit=$!
  children+=($audit)
  until [ -n "$(series gpuguard_audit_last_pass_duration_seconds 2>/dev/null)" ]; do sleep 0.05; done
  first_pass_ms=$(( ($(date +%s%N) - start) / 1000000 ))
}

pod_lists() {
  curl -fs "http://127.0.0.1:$audit_port/metrics" |
    sed -n 's/^gpuguard_kube_informer_outcomes_total{resource="pods",outcome="list_success"} \([0-9]*\)$/\1/p'
}

echo "== audit: baseline, an empty cluster"
start_apiserver 0 0
start_audit
read -r base_rss base_peak < <(rss "$audit")
kill "$audit"; wait "$audit" 2>/dev/null || true

echo "== audit: $nodes nodes, $pods running pods, every one exposed"
start_apiserver "$pods" "$nodes"
start_audit
sleep 2
read -r steady_rss first_peak < <(rss "$audit")
pass_s=$(series gpuguard_audit_last_pass_duration_seconds)
curl -fs --cacert "$out/certs/ca.crt" -X POST "$apiserver_url/control/expire"
until [ "$(pod_lists)" -ge 2 ] 2>/dev/null; do sleep 0.05; done
sleep 3
read -r relist_rss relist_peak < <(rss "$audit")
kill "$audit"; wait "$audit" 2>/dev/null || true

python3 - "$pods" "$nodes" "$first_pass_ms" "$pass_s" "$base_rss" "$steady_rss" "$first_peak" "$relist_rss" \
  "$relist_peak" <<'PY' | tee "$out/audit.txt"
import sys
pods, nodes, first_ms = map(int, sys.argv[1:4])
pass_s = float(sys.argv[4])
base, steady, peak, relist, relist_peak = map(int, sys.argv[5:10])
mb = lambda b: f"{b / 2**20:.1f} MiB"
print(f"audit controller: {nodes} nodes, {pods} running pods, all exposed")
print(f"  start to the end of the first pass {first_ms} ms; a pass {pass_s * 1000:.0f} ms")
print(f"  RSS baseline (empty cluster) {mb(base)}, steady {mb(steady)}, peak {mb(peak)}")
print(f"  after a forced re-list: RSS {mb(relist)}, peak {mb(relist_peak)}")
print(f"  kept per pod, above the baseline: {(steady - base) / max(pods, 1):.0f} bytes")
PY

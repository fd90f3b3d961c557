#!/usr/bin/env bash
# make bench, part 8: the scheduler extender's cache at cluster scale, against client-go on the same bytes.
# bench-apiserver (e2e/cmd) serves NODES nodes and PODS bound pods of ~1.5 KB, a quarter with a non-zero
# nvidia.com/gpu. Measured, each client on CPU 0 and the server on CPU 1:
#   - the extender's RSS with an empty cluster (the process baseline), then after syncing the full one
#     (steady) and its high-water mark (peak); the bytes kept per pod are (steady - baseline) / PODS;
#   - a forced re-list (every watch ends with 410 Gone): the peak after it, which must not double;
#   - time to first sync (/readyz turns 200), next to a client-go informer trimmed by SetTransform.
#   bench/cache.sh [PODS] [NODES]
set -euo pipefail
source "$(dirname "$0")/common.sh"
pods="${1:-${BENCH_PODS:-150000}}"
nodes="${2:-${BENCH_NODES:-5000}}"
build_bench_apiserver ./cmd/bench-informer

# start_extender: sets $extender (pid) and $extender_url; returns once /readyz answers 200, with the
# milliseconds it took in $sync_ms.
start_extender() {
  local port
  port=$(free_port)
  echo bench > "$out/token"
  local start
  start=$(date +%s%N)
  $pin_cache "$build/gpuguard-scheduler-extender" --insecure-listen-address "127.0.0.1:$port" \
    --apiserver-url "$apiserver_url" --token-file "$out/token" --ca-file "$out/certs/ca.crt" \
    2>> "$out/extender-cache.log" &
  extender=$!
  children+=($extender)
  extender_url="http://127.0.0.1:$port"
  until curl -fs -o /dev/null "$extender_url/readyz"; do sleep 0.01; done
  sync_ms=$(( ($(date +%s%N) - start) / 1000000 ))
}

lists_of_pods() {
  curl -fs "$extender_url/metrics" |
    sed -n 's/^gpuguard_kube_informer_outcomes_total{resource="pods",outcome="list_success"} \([0-9]*\)$/\1/p'
}

echo "== cache: baseline, an empty cluster"
start_apiserver 0 0
start_extender
sleep 1
read -r base_rss base_peak < <(rss "$extender")
kill "$extender"; wait "$extender" 2>/dev/null || true

echo "== cache: $nodes nodes, $pods bound pods"
start_apiserver "$pods" "$nodes"
grep 'serving' "$out/bench-apiserver.log" | tail -1
start_extender
sleep 1
read -r steady_rss first_peak < <(rss "$extender")
curl -fs --cacert "$out/certs/ca.crt" -X POST "$apiserver_url/control/expire"
until [ "$(lists_of_pods)" -ge 2 ] 2>/dev/null; do sleep 0.05; done
sleep 1
read -r relist_rss relist_peak < <(rss "$extender")
kill "$extender"; wait "$extender" 2>/dev/null || true

echo "== cache: client-go informer on the same server"
KUBE_FEATURE_WatchListClient=false $pin_cache "$go_out/bench-informer" -server "$apiserver_url" \
  -ca-file "$out/certs/ca.crt" > "$out/client-go.json"
cat "$out/client-go.json"

python3 - "$pods" "$nodes" "$sync_ms" "$base_rss" "$steady_rss" "$first_peak" "$relist_rss" "$relist_peak" \
  "$out/client-go.json" <<'PY' | tee "$out/cache.txt"
import json, sys
pods, nodes, sync_ms, base, steady, peak, relist, relist_peak = map(int, sys.argv[1:9])
go = json.load(open(sys.argv[9]))
mb = lambda b: f"{b / 2**20:.1f} MiB"
print(f"extender: {nodes} nodes, {pods} pods: first sync {sync_ms} ms")
print(f"  RSS baseline (empty cluster) {mb(base)}, steady {mb(steady)}, peak {mb(peak)}")
print(f"  after a forced re-list: RSS {mb(relist)}, peak {mb(relist_peak)}")
print(f"  kept per pod, above the baseline: {(steady - base) / max(pods, 1):.0f} bytes")
print(f"client-go informer (SetTransform): first sync {go['sync_ms']} ms, RSS {mb(go['rss_bytes'])}, peak {mb(go['peak_rss_bytes'])}")
print(f"ratios: sync {go['sync_ms'] / max(sync_ms, 1):.2f}x faster, steady RSS {steady / go['rss_bytes']:.2f} of client-go's, "
      f"peak {relist_peak / go['peak_rss_bytes']:.2f} of client-go's")
PY

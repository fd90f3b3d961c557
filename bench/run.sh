#!/usr/bin/env bash
# make bench: everything docs/benchmarks.md reports, from one run on this machine.
#   1. core micro-benchmarks: review vs. a nlohmann DOM parse of the same ~3 KB, ~8 KB, ~72 KB, ~1 MiB documents
#   2. start-up: process start to the "listening" log line
#   3. load over TLS keep-alive with wrk (1 thread, 16 connections): GET /healthz as the transport reference,
#      then POST /mutate with an ~8 KB review; the server pinned to CPU 0 with one thread, wrk to CPU 1
#   4. the server's memory after that load: peak RSS, and /proc/PID/smaps_rollup split into private and shared
#   4b. the same loads and memory for bench-gowebhook, a plain Go webhook (net/http, encoding/json) on one core
#   4c. the floor of memory for any TLS server on Debian's OpenSSL: openssl s_server's, after a few requests
#   5. a 2.5 MiB pod end to end with curl, 10 times, and the server's peak RSS after all of it
#   6. a burst of 2,000 fresh TLS connections, one review each, all at once (bench-burst, a Go client), against
#      gpuguard and then the Go peer
#   7. the device plugin's Allocate over its unix socket
#   8. the scheduler extender's filter and prioritize vs. a nlohmann DOM parse of the same request
#   9. the extender's cache at 5,000 nodes and 150,000 pods vs. a client-go informer (bench/cache.sh)
#  10. the audit controller at 5,000 nodes and 150,000 pods, every one exposed (bench/audit.sh)
# Raw output goes to $BUILD_DIR/bench-results/.
set -euo pipefail
source "$(dirname "$0")/common.sh"
duration="${BENCH_SECONDS:-10}"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true  # the burst holds 2,000 sockets open on each side
"$build/bench/gpuguard_write_review" 2560 > "$out/review-2.5m.json"
(cd "$root/e2e" && "$root/scripts/go" build -p "${JOBS:-2}" -o "$build/bench-go/" ./cmd/bench-burst ./cmd/bench-gowebhook)

echo "== core micro-benchmarks"
$pin_server "$build/bench/gpuguard_core_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  | tee "$out/core.txt"

echo "== start-up"
start=$(date +%s%N)
start_webhook "$out/server.log"
trap 'kill $server 2>/dev/null || true' EXIT
ready=$(date +%s%N)
echo "ready after $(( (ready - start) / 1000000 )) ms" | tee "$out/startup.txt"
url="https://127.0.0.1:$port"

# keep_alive_loads LABEL SUFFIX: GET /healthz (the transport reference), then POST /mutate with the ~8 KB
# review, against $url, then the memory of $server after both (private: this process alone; shared: pages
# other processes map too). Output files end in SUFFIX.
keep_alive_loads() {
  local label="$1" name="$2"
  echo "== $label: wrk GET /healthz (transport reference)"
  $pin_client wrk -t1 -c16 -d"${duration}s" --latency "$url/healthz" | tee "$out/wrk-healthz$name.txt"
  echo "== $label: wrk POST /mutate, $(stat -c %s "$out/review-8k.json") byte review"
  GPUGUARD_BODY="$out/review-8k.json" $pin_client wrk -t1 -c16 -d"${duration}s" --latency -s "$root/bench/post.lua" \
    "$url/mutate?timeout=10s" | tee "$out/wrk-mutate$name.txt"
  local healthz_rps mutate_rps
  healthz_rps=$(awk '/Requests\/sec/ {print $2}' "$out/wrk-healthz$name.txt")
  mutate_rps=$(awk '/Requests\/sec/ {print $2}' "$out/wrk-mutate$name.txt")
  awk -v m="$mutate_rps" -v h="$healthz_rps" -v n="$label" \
    'BEGIN {printf "== %s: POST /mutate at %.0f %% of GET /healthz requests/s\n", n, 100 * m / h}' \
    | tee "$out/mutate-vs-healthz$name.txt"
  echo "== $label: memory after the keep-alive loads"
  {
    grep -E 'VmHWM|VmRSS' /proc/$server/status
    grep -E '^(Rss|Pss|Shared_Clean|Shared_Dirty|Private_Clean|Private_Dirty|Anonymous):' /proc/$server/smaps_rollup
  } | tee "$out/rss-after-load$name.txt"
}
keep_alive_loads gpuguard ""

echo "== the floor: openssl s_server (Debian's OpenSSL, no C++), after 20 requests"
: > "$out/server-openssl.log"
$pin_server openssl s_server -accept 127.0.0.1:0 -cert "$out/certs/tls.crt" -key "$out/certs/tls.key" -www \
  > "$out/server-openssl.log" 2>&1 &
floor=$!
until grep -q '^ACCEPT' "$out/server-openssl.log" 2>/dev/null; do :; done
floor_port=$(sed -n 's/^ACCEPT .*:\([0-9]*\)$/\1/p' "$out/server-openssl.log" | head -1)
for i in $(seq 20); do curl -s -o /dev/null --cacert "$out/certs/ca.crt" "https://127.0.0.1:$floor_port/"; done
{
  grep -E 'VmHWM|VmRSS' /proc/$floor/status
  grep -E '^(Rss|Pss|Shared_Clean|Shared_Dirty|Private_Clean|Private_Dirty|Anonymous):' /proc/$floor/smaps_rollup
} | tee "$out/rss-openssl-floor.txt"
kill $floor; wait $floor 2>/dev/null || true

echo "== 2.5 MiB pod, end to end ($(stat -c %s "$out/review-2.5m.json") bytes), 10 runs"
for i in $(seq 10); do
  curl -sS -o /dev/null --cacert "$out/certs/ca.crt" -H 'Content-Type: application/json' -H 'Expect:' \
    --data-binary @"$out/review-2.5m.json" -w '%{http_code} total=%{time_total}s of_which_tcp_and_tls_handshake=%{time_appconnect}s\n' \
    "$url/mutate"
done | tee "$out/large.txt"

echo "== peak RSS, after the large pods too"
grep -E 'VmHWM|VmRSS' /proc/$server/status | tee "$out/rss.txt"
kill $server; wait $server 2>/dev/null || true

echo "== 2.5 MiB pod: the webhook's own handling time (decode, decide, encode), from its debug log"
start_webhook "$out/server-debug.log" --log-level debug
for i in $(seq 10); do
  curl -sS -o /dev/null --cacert "$out/certs/ca.crt" -H 'Content-Type: application/json' -H 'Expect:' \
    --data-binary @"$out/review-2.5m.json" "https://127.0.0.1:$port/mutate"
done
grep '"msg":"admission reviewed"' "$out/server-debug.log" | sed -n 's/.*"micros":\([0-9]*\).*/\1 us/p' | tee "$out/large-server.txt"
kill $server; wait $server 2>/dev/null || true

echo "== the Go peer (bench-gowebhook, GOMAXPROCS=1): the same loads, on a fresh process"
start_go_peer "$out/server-go.log"
url="https://127.0.0.1:$port"
keep_alive_loads "the Go peer" -go
kill $server; wait $server 2>/dev/null || true

# burst OUTPUT: 2,000 fresh TLS connections at once to $server on $port, one review each, then its peak
# RSS; the server is stopped afterwards.
burst() {
  $pin_client "$build/bench-go/bench-burst" --url "https://127.0.0.1:$port/mutate" --ca "$out/certs/ca.crt" \
    --body "$out/review-8k.json" --connections 2000 | tee "$1"
  grep -E 'VmHWM' /proc/$server/status | tee -a "$1"
  kill $server; wait $server 2>/dev/null || true
}
echo "== burst: 2,000 fresh TLS connections at once, one review each, on a fresh server"
start_webhook "$out/server-burst.log"
burst "$out/burst.txt"
echo "== the same burst against the Go peer"
start_go_peer "$out/server-go-burst.log"
burst "$out/burst-go.txt"

echo "== device plugin Allocate"
"$build/bench/gpuguard_allocate_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true | tee "$out/allocate.txt"
echo "== scheduler extender: filter and prioritize vs. parsing the same request"
$pin_server "$build/bench/gpuguard_extender_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  | tee "$out/extender.txt"
"$root/bench/cache.sh"
"$root/bench/audit.sh"
echo "raw output in $out"

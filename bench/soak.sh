#!/usr/bin/env bash
# bench/soak.sh [SECONDS]: the ~8 KB review from 32 connections, each pausing 5 ms after every answer (a
# steady few thousand requests/s, well below what `make bench` measures as the maximum), for SECONDS
# (default 600). Passes when there are no errors and RSS at the end is within 10 % of RSS after the first
# minute. Not part of CI.
set -euo pipefail
source "$(dirname "$0")/common.sh"
seconds="${1:-600}"
start_webhook "$out/soak-server.log"
trap 'kill $server 2>/dev/null || true' EXIT

GPUGUARD_BODY="$out/review-8k.json" GPUGUARD_POST_LUA="$root/bench/post.lua" GPUGUARD_DELAY_MS=5 \
  $pin_client wrk -t1 -c32 -d"${seconds}s" --latency --timeout 5s -s "$root/bench/soak.lua" \
  "https://127.0.0.1:$port/mutate?timeout=10s" > "$out/soak-wrk.txt" &
client=$!
sleep 60
after_minute=$(awk '/VmRSS/ {print $2}' /proc/$server/status)
wait $client
at_end=$(awk '/VmRSS/ {print $2}' /proc/$server/status)
cat "$out/soak-wrk.txt"
echo "RSS after 1 minute: ${after_minute} kB; at the end: ${at_end} kB; peak: $(awk '/VmHWM/ {print $2}' /proc/$server/status) kB"
errors=$(grep -cE 'Socket errors|Non-2xx' "$out/soak-wrk.txt" || true)
growth=$(( (at_end - after_minute) * 100 / after_minute ))
echo "RSS growth after the first minute: ${growth} %; error lines from wrk: ${errors}"
[ "$errors" -eq 0 ] && [ "$growth" -le 10 ] && echo "soak: PASS" || { echo "soak: FAIL"; exit 1; }

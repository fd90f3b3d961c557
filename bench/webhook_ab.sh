#!/usr/bin/env bash
# make bench-webhook-ab: this tree's webhook beside another commit's (BASE, by default 36e283f, the last
# commit before the server's bounds of issue 15), in one run on this machine, so that a change in the
# webhook's speed is measured rather than remembered (issue 37). For each binary:
#   1. requests/s under the performance bar's load: wrk, 1 thread, 16 TLS keep-alive connections, POST
#      /mutate with the ~8 KB review; the server pinned to CPU 0 with one thread, wrk to CPU 1. ROUNDS
#      rounds of BENCH_SECONDS each, the two binaries alternating, so drift on the machine hits both.
#   2. system calls per request (strace -c): two runs of bench-burst's keep-alive mode, 16 connections of
#      SHORT and of LONG requests each; their difference over the difference in requests leaves out
#      start-up, the handshakes and the shutdown.
#   3. instructions per request (callgrind's Ir), the same two runs and the same difference; callgrind's
#      counts do not depend on the machine's noise. The longer run's profile is kept for callgrind_annotate.
# The base is exported with git archive and built once, release, webhook only, under $build/ab/.
set -euo pipefail
source "$(dirname "$0")/common.sh"
base="${BASE:-36e283f}"
rounds="${ROUNDS:-3}"
duration="${BENCH_SECONDS:-5}"
short="${SHORT:-50}" long="${LONG:-250}" connections=16

base_rev=$(git -C "$root" rev-parse --short=7 "$base^{commit}")
this_rev="$(git -C "$root" rev-parse --short=7 HEAD)$(git -C "$root" diff --quiet HEAD -- src include || echo +)"
base_src="$build/ab/src-$base_rev" base_build="$build/ab/build-$base_rev"
if [ ! -x "$base_build/gpuguard-webhook" ]; then
  echo "== building $base_rev's webhook in $base_build"
  rm -rf "$base_src" && mkdir -p "$base_src"
  git -C "$root" archive "$base_rev" | tar -x -C "$base_src"
  cmake -S "$base_src" -B "$base_build" -DCMAKE_BUILD_TYPE=Release -DGPUGUARD_BUILD_TESTS=OFF >/dev/null
  cmake --build "$base_build" -j"${JOBS:-2}" --target gpuguard-webhook >/dev/null
fi
(cd "$root/e2e" && "$root/scripts/go" build -p "${JOBS:-2}" -o "$build/bench-go/" ./cmd/bench-burst)
labels=("$base_rev" "$this_rev")
binaries=("$base_build/gpuguard-webhook" "$build/gpuguard-webhook")
ab="$out/ab"
mkdir -p "$ab"

# stop_server: SIGTERM to the webhook (under a tool, the tool's child), then wait for the tool to write.
stop_server() {
  local target="$server"
  if [ -n "${wrap:-}" ] && [ "${wrap%% *}" = strace ]; then target=$(pgrep -P "$server" | head -1); fi
  kill "$target" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}
trap 'kill "$server" 2>/dev/null || true' EXIT

# burst N: 16 keep-alive connections of N reviews each against $port; fails if any review fails.
burst() {
  $pin_client "$build/bench-go/bench-burst" --url "https://127.0.0.1:$port/mutate" --ca "$out/certs/ca.crt" \
    --body "$out/review-8k.json" --connections "$connections" --requests "$1" > /dev/null
}

echo "== requests/s: wrk POST /mutate, $(stat -c %s "$out/review-8k.json") byte review, $rounds rounds of ${duration}s"
: > "$ab/rps.txt"
for round in $(seq "$rounds"); do
  for i in 0 1; do
    webhook="${binaries[$i]}" start_webhook "$ab/server.log"
    GPUGUARD_BODY="$out/review-8k.json" $pin_client wrk -t1 -c16 -d"${duration}s" -s "$root/bench/post.lua" \
      "https://127.0.0.1:$port/mutate?timeout=10s" > "$ab/wrk-${labels[$i]}-$round.txt"
    stop_server
    echo "${labels[$i]} round $round $(awk '/Requests\/sec/ {print $2}' "$ab/wrk-${labels[$i]}-$round.txt")" \
      | tee -a "$ab/rps.txt"
  done
done
awk -v a="${labels[0]}" -v b="${labels[1]}" '$1 == a {sa += $4; na++} $1 == b {sb += $4; nb++}
  END {printf "mean: %s %.0f, %s %.0f req/s: %+.1f %%\n", a, sa / na, b, sb / nb, 100 * (sb / nb) / (sa / na) - 100}' \
  "$ab/rps.txt" | tee "$ab/rps-summary.txt"

echo "== system calls per request (strace -c -f), $connections x ($long - $short) requests"
for i in 0 1; do
  for n in "$short" "$long"; do
    wrap="strace -f -c -o $ab/strace-${labels[$i]}-$n.txt" webhook="${binaries[$i]}" start_webhook "$ab/server.log"
    burst "$n"
    wrap="strace" stop_server
  done
  awk -v n=$((connections * (long - short))) -v label="${labels[$i]}" '
    FNR == 1 {file++}
    /^[ 0-9.]+ [0-9]/ && $NF != "total" {c[file, $NF] = $4; names[$NF]}  # % time, seconds, usecs/call, calls
    END {
      total = 0
      for (name in names) {d = (c[2, name] - c[1, name]) / n; if (d >= 0.05) {printf "%s %s %.2f\n", label, name, d}; total += d}
      printf "%s total %.2f\n", label, total
    }' "$ab/strace-${labels[$i]}-$short.txt" "$ab/strace-${labels[$i]}-$long.txt" | sort -k3 -nr | tee "$ab/syscalls-${labels[$i]}.txt"
done

echo "== instructions per request (callgrind Ir), $connections x ($long - $short) requests"
for i in 0 1; do
  for n in "$short" "$long"; do
    wrap="valgrind --tool=callgrind --callgrind-out-file=$ab/callgrind-${labels[$i]}-$n.out" \
      webhook="${binaries[$i]}" start_webhook "$ab/server.log"
    burst "$n"
    stop_server
  done
  awk -v n=$((connections * (long - short))) -v label="${labels[$i]}" '
    /^totals:/ {t[FNR == NR ? 1 : 2] = $2} END {printf "%s %.0f instructions per request\n", label, (t[2] - t[1]) / n}' \
    "$ab/callgrind-${labels[$i]}-$short.out" "$ab/callgrind-${labels[$i]}-$long.out" | tee "$ab/ir-${labels[$i]}.txt"
done
echo "== profiles: callgrind_annotate $ab/callgrind-<rev>-$long.out"

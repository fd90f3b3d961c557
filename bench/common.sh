# Sourced by bench/run.sh and bench/soak.sh: paths, dev certificates, the ~8 KB review, CPU pinning, and
# starting the webhook.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/${BUILD_DIR:-build}"
out="$build/bench-results"
mkdir -p "$out"
"$root/certs/generate.sh" --out "$out/certs" >/dev/null
"$build/bench/gpuguard_write_review" 8 > "$out/review-8k.json"

# The server on CPU 0, the load generator on CPU 1, when there are two.
pin_server="" pin_client=""
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then pin_server="taskset -c 0"; pin_client="taskset -c 1"; fi

# wait_for_listening LOG: until the server logs "listening" in LOG; sets $port from the address it names.
wait_for_listening() {
  until grep -q '"msg":"listening"' "$1" 2>/dev/null; do :; done
  port=$(sed -n 's/.*"address":"127.0.0.1:\([0-9]*\)".*/\1/p' "$1" | head -1)
}

# start_webhook LOG [FLAGS...]: one server thread on 127.0.0.1, a kernel-chosen port. Sets $server (pid)
# and $port once it has logged "listening". $webhook names another binary; $wrap (strace, valgrind) runs it
# under a tool, in which case $server is the tool's pid.
start_webhook() {
  local log="$1"
  shift
  : > "$log"  # now, not in the background child: a stale "listening" line must never be read
  $pin_server ${wrap:-} "${webhook:-$build/gpuguard-webhook}" --tls-cert-file "$out/certs/tls.crt" --tls-private-key-file "$out/certs/tls.key" \
    --listen-address 127.0.0.1:0 --threads 1 --shutdown-delay 0 "$@" 2> "$log" &
  server=$!
  wait_for_listening "$log"
}

# start_go_peer LOG: bench-gowebhook (built by bench/run.sh) the same way, one core (GOMAXPROCS=1).
start_go_peer() {
  : > "$1"
  GOMAXPROCS=1 $pin_server "$build/bench-go/bench-gowebhook" --tls-cert-file "$out/certs/tls.crt" \
    --tls-private-key-file "$out/certs/tls.key" 2> "$1" &
  server=$!
  wait_for_listening "$1"
}

# The client under test on CPU 0, bench-apiserver on CPU 1, when there are two (bench/cache.sh, bench/audit.sh).
pin_cache="" pin_apiserver=""
if [ -n "$pin_server" ]; then pin_cache="taskset -c 0" pin_apiserver="taskset -c 1"; fi

# build_bench_apiserver [MORE_PACKAGES...]: bench-apiserver (and any other e2e/cmd tools) into $go_out.
go_out="$build/bench-go"
build_bench_apiserver() {
  mkdir -p "$go_out"
  (cd "$root/e2e" && "$root/scripts/go" build -p "${JOBS:-2}" -o "$go_out/" ./cmd/bench-apiserver "$@")
}

children=()
trap 'kill "${children[@]}" 2>/dev/null || true' EXIT

# start_apiserver PODS NODES: sets $apiserver_url once it serves.
start_apiserver() {
  rm -f "$out/apiserver.address"
  $pin_apiserver "$go_out/bench-apiserver" -pods "$1" -nodes "$2" -cert "$out/certs/tls.crt" -key "$out/certs/tls.key" \
    -address-file "$out/apiserver.address" 2>> "$out/bench-apiserver.log" &
  children+=($!)
  until [ -s "$out/apiserver.address" ]; do sleep 0.1; done
  apiserver_url="https://$(cat "$out/apiserver.address")"
}

# rss PID: "VmRSS VmHWM" in bytes.
rss() { awk '/^VmRSS:/ {r=$2} /^VmHWM:/ {h=$2} END {print r*1024, h*1024}' "/proc/$1/status"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }


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
# and $port once it has logged "listening".
start_webhook() {
  local log="$1"
  shift
  : > "$log"  # now, not in the background child: a stale "listening" line must never be read
  $pin_server "$build/gpuguard-webhook" --tls-cert-file "$out/certs/tls.crt" --tls-private-key-file "$out/certs/tls.key" \
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

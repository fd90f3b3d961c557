#!/usr/bin/env bash
# The node enforcer at the largest request NRI can send (`make bench-enforcer-request`): its memory at rest
# and at that request (RSS, PSS, private, from /proc/PID/smaps_rollup), the time it takes per create (its
# own create_duration_seconds, and each create's as NRI's runtime library saw it), with 16 such creates at
# once, on one core and under a CPU limit of 100m (a cgroup v1 CFS quota of 10 ms per 100 ms). The runtime
# is e2e/cmd/nri-runtime (NRI's own adaptation library, v0.12.3); no kubelet answers, so the allocation is
# unknown and every create is refused, having been read and judged in full: the path the attack takes.
# Figures go to stdout and docs/benchmarks.md says what they were. ENFORCER names another binary (an
# earlier build, for a before and after in one run).
#   [ENFORCER=path] bench/enforcer_request.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/${BUILD_DIR:-build}"
out="$build/bench-results/enforcer-request"
rm -rf "$out" && mkdir -p "$out/host"
children=()
cleanup() {
  kill "${children[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  [ -d /sys/fs/cgroup/cpu/gpuguard-bench ] && rmdir /sys/fs/cgroup/cpu/gpuguard-bench 2>/dev/null || true
}
trap cleanup EXIT

# The review's attack, near ttrpc's 4 MiB: 700 device-list volumes with 5 KB names, the variable set twice.
python3 - "$out/script.json" <<'PY'
import json, sys
container = {"id": "huge", "name": "app", "env": ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"],
             "mounts": [{"destination": "/var/run/nvidia-container-devices/" + "a" * 5000 + str(i),
                         "source": "/var/lib/containerd/volume-%d" % i, "type": "bind", "options": ["rbind"]} for i in range(700)]}
pod = {"id": "sandbox-huge", "name": "huge", "namespace": "team-a", "uid": "uid-huge"}
steps = [{"wait_plugin": 10}, {"sleep": 2}, {"create": {"pod": pod, "container": container}}, {"sleep": 1},
         {"create": {"pod": pod, "container": container}, "concurrent": 16}, {"sleep": 2}]
json.dump({"steps": steps}, open(sys.argv[1], "w"))
PY

memory() {  # PID LABEL: RSS, PSS, private (dirty and clean), in KiB, and the peak RSS so far
  awk -v label="$2" '/^(Rss|Pss|Private_Dirty|Private_Clean):/ {v[$1] = $2}
    END {printf "%s: RSS %d KiB, PSS %d KiB, private %d KiB (dirty %d, clean %d)\n", label, v["Rss:"], v["Pss:"],
         v["Private_Dirty:"] + v["Private_Clean:"], v["Private_Dirty:"], v["Private_Clean:"]}' "/proc/$1/smaps_rollup"
}

run() {  # LABEL [CGROUP]
  local label="$1" cgroup="${2:-}"
  rm -f "$out/nri.sock"
  taskset -c 1 "$build/tools/nri-runtime" --socket "$out/nri.sock" --script "$out/script.json" > "$out/$label.json" 2> "$out/$label.runtime.log" &
  local runtime=$!
  children+=("$runtime")
  sleep 0.5
  taskset -c 0 "${ENFORCER:-$build/gpuguard-node-enforcer}" --nri-socket "$out/nri.sock" --pod-resources-socket "$out/none.sock" \
    --host-root "$out/host" --metrics-address 127.0.0.1:0 2> "$out/$label.enforcer.log" &
  local enforcer=$!
  children+=("$enforcer")
  if [ -n "$cgroup" ]; then echo "$enforcer" > "$cgroup/tasks"; fi
  children+=("$enforcer")
  sleep 1.5
  memory "$enforcer" "$label, at rest"
  local rest_anon rest_rss
  rest_anon=$(awk '/^RssAnon:/ {print $2}' "/proc/$enforcer/status")
  rest_rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$enforcer/status")
  wait "$runtime"
  memory "$enforcer" "$label, after 17 such requests"
  local hwm
  hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$enforcer/status")
  # The peak RSS less the file-backed pages at rest: the peak of its private (anonymous) memory.
  echo "$label: peak RSS $hwm KiB; peak anonymous about $((hwm - rest_rss + rest_anon)) KiB (at rest $rest_anon)"
  local port
  port=$(sed -n 's/.*"address":"127.0.0.1:\([0-9]*\)".*/\1/p' "$out/$label.enforcer.log" | head -1)
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^gpuguard_node_enforcer_create_duration_seconds_(sum|count)' |
    awk -v label="$label" '{v[$1] = $2} END {printf "%s: its own time per create (create_duration_seconds), mean %.2f ms over %d\n", label,
      1000 * v["gpuguard_node_enforcer_create_duration_seconds_sum"] / v["gpuguard_node_enforcer_create_duration_seconds_count"],
      v["gpuguard_node_enforcer_create_duration_seconds_count"]}'
  python3 - "$out/$label.json" "$label" <<'PY'
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
one = steps[2]
burst = steps[4]
size = len(json.dumps(json.load(open(sys.argv[1].rsplit("/", 1)[0] + "/script.json"))["steps"][2]["create"]))
each = sorted(burst["micros_each"])
errors = [e for e in burst.get("errors", []) if "PermissionDenied desc = gpuguard" not in e]
print(f"{sys.argv[2]}: one create of a {size / 1048576:.2f} MiB request: {one['micros'] / 1000:.1f} ms, "
      + (f"answered with {len(one['error'])} bytes of refusal" if 'error' in one else "CREATED, not refused"))
print(f"{sys.argv[2]}: 16 at once: the last answered after {each[-1] / 1000:.0f} ms, the median {each[8] / 1000:.0f} ms; "
      f"{len(errors)} not refused by gpuguard")
PY
  kill "$enforcer" 2>/dev/null || true
  wait "$enforcer" 2>/dev/null || true
}

run one-core
if [ -d /sys/fs/cgroup/cpu ] && mkdir -p /sys/fs/cgroup/cpu/gpuguard-bench 2>/dev/null; then
  echo 100000 > /sys/fs/cgroup/cpu/gpuguard-bench/cpu.cfs_period_us
  echo 10000 > /sys/fs/cgroup/cpu/gpuguard-bench/cpu.cfs_quota_us
  run cpu-100m /sys/fs/cgroup/cpu/gpuguard-bench
else
  echo "cpu-100m: no cgroup v1 cpu controller here; skipped"
fi

# The second red team's memory attacks, each on a fresh enforcer, without a limit (its peak) and under the
# chart's memory limit in a cgroup v1 memory controller (whether it lives): a CreateContainer with a mount
# path of a megabyte under the device list root, and a registration (Synchronize) of 200 running containers
# whose image sets the four variables the enforcer reads to 64 KiB each, each with a volume mounted at a
# path of 64 KiB under the device list root, two to a pod. A fake kubelet answers, so that every container
# is read and judged. BASE_ENFORCER names an earlier build, run the same way right after, for a before and
# after in one run.
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
pod = {"id": "sandbox-path", "name": "path", "namespace": "team-a", "uid": "uid-path"}
path = {"id": "path", "name": "app", "mounts": [{"destination": "/var/run/nvidia-container-devices/" + "p" * (1 << 20),
                                                  "source": "/dev/null", "type": "bind", "options": ["rbind"]}]}
json.dump({"steps": [{"wait_plugin": 10}, {"create": {"pod": pod, "container": path}}, {"sleep": 1}]},
          open(out + "/path.json", "w"))
big = "7" * (64 << 10)
pods, containers, listed = [], [], []
for p in range(100):
    pods.append({"id": "sandbox-heavy-%d" % p, "name": "heavy-%d" % p, "namespace": "team-a", "uid": "uid-heavy-%d" % p})
    listed.append({"name": "heavy-%d" % p, "namespace": "team-a", "containers": [{"name": "app"}]})
    for c in range(2):
        containers.append({"id": "heavy-%d-%d" % (p, c), "podSandboxId": "sandbox-heavy-%d" % p, "name": "app",
                           "state": "CONTAINER_RUNNING",
                           "env": ["NVIDIA_VISIBLE_DEVICES=" + big, "NVIDIA_IMEX_CHANNELS=" + big,
                                   "CUDA_VERSION=" + big, "NVIDIA_REQUIRE_CUDA=" + big],
                           "mounts": [{"destination": "/var/run/nvidia-container-devices/" + big, "source": "/dev/null",
                                       "type": "bind", "options": ["rbind"]}]})
json.dump({"existing": {"pods": pods[::-1], "containers": containers}, "steps": [{"wait_plugin": 60}, {"sleep": 1}]},
          open(out + "/sync.json", "w"))
json.dump({"pod_resources": listed}, open(out + "/kubelet.json", "w"))
PY
limit=$(awk '/^nodeEnforcer:/ {e = 1} e && /^ *limits:/ {l = 1} l && /memory:/ {sub(/Mi/, "", $2); print $2; exit}' "$root/charts/gpuguard/values.yaml")
attack() {  # BINARY LABEL SCRIPT LIMIT_MIB (0: none)
  local binary="$1" label="$2" script="$3" limit_mib="$4" cgroup=""
  rm -f "$out/nri.sock" "$out/kubelet.sock"
  if [ "$limit_mib" != 0 ]; then
    cgroup=/sys/fs/cgroup/memory/gpuguard-bench-$$
    mkdir -p "$cgroup" && echo $((limit_mib << 20)) > "$cgroup/memory.limit_in_bytes"
  fi
  "$build/bench/gpuguard_fake_kubelet" --socket "$out/kubelet.sock" --pods "$out/kubelet.json" 2> "$out/$label.kubelet.log" &
  local kubelet=$!
  "$build/tools/nri-runtime" --socket "$out/nri.sock" --script "$out/$script" > "$out/$label.json" 2> "$out/$label.runtime.log" &
  local runtime=$!
  sleep 0.5
  ( [ -n "$cgroup" ] && echo "$BASHPID" > "$cgroup/cgroup.procs"
    exec "$binary" --nri-socket "$out/nri.sock" --pod-resources-socket "$out/kubelet.sock" --host-root "$out/host" \
      --metrics-address 127.0.0.1:0 ) 2> "$out/$label.enforcer.log" &
  local enforcer=$!
  wait "$runtime" || true
  local hwm alive="lives"
  hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$enforcer/status" 2>/dev/null || echo 0)
  kill -0 "$enforcer" 2>/dev/null || alive="KILLED"
  if [ -n "$cgroup" ] && grep -q '^oom_kill [1-9]' "$cgroup/memory.oom_control" 2>/dev/null; then alive="OOM-KILLED"; fi
  local synced
  synced=$(head -1 "$out/$label.json" | sed -n 's/.*"synced":\([0-9]*\).*/\1/p')
  if [ "$limit_mib" = 0 ]; then
    echo "$label: peak RSS $hwm KiB (synchronized: ${synced:-no})"
  else
    echo "$label, under ${limit_mib} MiB: $alive (synchronized: ${synced:-no})"
  fi
  kill "$enforcer" "$kubelet" 2>/dev/null || true
  wait "$enforcer" "$kubelet" 2>/dev/null || true
  if [ -n "$cgroup" ]; then rmdir "$cgroup" 2>/dev/null || true; fi
}
for binary in "${ENFORCER:-$build/gpuguard-node-enforcer}" ${BASE_ENFORCER:-}; do
  name=$([ "$binary" = "${BASE_ENFORCER:-}" ] && echo before || echo now)
  for attack_name in path sync; do
    attack "$binary" "$name, $attack_name" "$attack_name.json" 0
    [ -d /sys/fs/cgroup/memory ] && attack "$binary" "$name, $attack_name" "$attack_name.json" "$limit"
  done
done

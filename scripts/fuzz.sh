#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for SECONDS (default 60), JOBS at a time, seeded from
# tests/fixtures. A finding stops the run, exits non-zero and leaves its input under build-fuzz/findings/;
# turn it into a fixture under tests/fixtures/ so that it is tested from then on.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
out="$root/build-fuzz"

cmake --preset fuzz -S "$root" >/dev/null
cmake --build "$out" -j"${JOBS:-2}"

# Seeds: every admission fixture and invalid body, and the arm hook's EndpointSliceList; for HTTP, the same bodies in requests of each kind.
mkdir -p "$out/corpus/admission" "$out/corpus/http" "$out/corpus/extender" "$out/corpus/nodereport" "$out/corpus/nri" \
  "$out/corpus/enforcer_model" "$out/findings"
for f in "$root"/tests/fixtures/admission/*/review.json; do cp "$f" "$out/corpus/admission/$(basename "$(dirname "$f")").json"; done
for f in "$root"/tests/fixtures/invalid/*.json; do cp "$f" "$out/corpus/admission/invalid-$(basename "$f")"; done
cp "$root/tests/fixtures/arming/endpointslices.json" "$out/corpus/admission/arming-endpointslices.json"
cp "$root/tests/fixtures/arming/kubernetes-endpointslice.json" "$out/corpus/admission/arming-kubernetes-endpointslice.json"
# And a watched Namespace, for the admission switches' store: labelled by the break glass, by an admin, not at all.
for value in break-glass true ""; do
  labels=${value:+"\"gpuguard.io/ignore\":\"$value\""}
  printf '{"kind":"Namespace","metadata":{"name":"team-a","labels":{%s}}}' "$labels" \
    > "$out/corpus/admission/namespace-${value:-unlabelled}.json"
done
request() {  # METHOD TARGET CONTENT-TYPE BODY-FILE NAME
  local length=0
  if [ -n "$4" ]; then length=$(stat -c %s "$4"); fi
  { printf '%s %s HTTP/1.1\r\nHost: gpuguard\r\nContent-Type: %s\r\nContent-Length: %s\r\n\r\n' "$1" "$2" "$3" "$length"
    if [ -n "$4" ]; then cat "$4"; fi; } > "$out/corpus/http/$5"
}
request POST '/mutate?timeout=10s' application/json "$root/tests/fixtures/admission/mixed/review.json" mutate
request POST /mutate application/json "$root/tests/fixtures/invalid/truncated.json" truncated
request POST /mutate text/plain "$root/tests/fixtures/admission/no-env/review.json" wrong-type
request GET /healthz application/json "" healthz
request GET /readyz application/json "" readyz
request GET /metrics application/json "" metrics
request DELETE /mutate application/json "" wrong-method
printf 'POST /mutate HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"a":\r\n0\r\n\r\n' \
  > "$out/corpus/http/chunked"

# For the extender: every malformed ExtenderArgs body, and a well-formed one of each node form.
/usr/bin/python3 - "$root/tests/fixtures/extender/invalid.json" "$out/corpus/extender" <<'PY'
import json, sys
for i, case in enumerate(json.load(open(sys.argv[1]))):
    open(f"{sys.argv[2]}/invalid-{i}", "w").write(case["body"])
pod = {"metadata": {"uid": "p"}, "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
       "initContainers": [{"restartPolicy": "Always", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}
open(f"{sys.argv[2]}/names", "w").write(json.dumps({"Pod": pod, "NodeNames": ["n1", "n2", "n3"]}))
open(f"{sys.argv[2]}/nodes", "w").write(json.dumps({"Pod": pod, "Nodes": {"items": [
    {"metadata": {"name": "n2"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}]}}))
open(f"{sys.argv[2]}/pod", "w").write(json.dumps(pod))
open(f"{sys.argv[2]}/stream", "w").write(json.dumps({"type": "ADDED", "object": pod}) + "\n" + json.dumps({"type": "BOOKMARK", "object": {}}))
PY

# For the node report: each fixture host root's files, in the order nodereport_fuzz.cpp splits them.
/usr/bin/python3 - "$root/tests/fixtures/node-report" "$out/corpus/nodereport" <<'PY'
import glob, os, sys
for case in sorted(glob.glob(f"{sys.argv[1]}/*/root")):
    def read(*candidates):  # bytes: some fixtures hold what is not UTF-8 on purpose
        for c in candidates:
            for path in sorted(glob.glob(f"{case}/{c}")):
                return open(path, "rb").read()
        return b""
    parts = [read("etc/nvidia-container-runtime/config.toml"), read("etc/containerd/config.toml"),
             read("etc/containerd/conf.d/*.toml"), read("etc/crio/crio.conf"),
             read("etc/cdi/*.yaml", "var/run/cdi/*.yaml"), read("var/lib/dpkg/status"),
             read("usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"),
             "".join(os.path.basename(p) for p in glob.glob(f"{case}/usr/local/nvidia/toolkit/libnvidia-container.so.*")).encode(),
             read("var/lib/rpm/rpmdb.sqlite")[:65536]]  # its first pages: the whole file passes -max_len
    open(f"{sys.argv[2]}/{os.path.basename(os.path.dirname(case))}", "wb").write(b"\n=====\n".join(parts))
PY

# For NRI: what a runtime sends a plugin (Configure and CreateContainer requests on connection 1, a
# registration answer on connection 2, some split across frames), with containers that hold each door the
# enforcer reads (NRI's protobuf written by hand: varints and length-delimited fields), and a validation
# request whose adjustment adds a CDI device.
/usr/bin/python3 - "$out/corpus/nri" <<'PY'
import struct, sys
def varint(n):
    out = b""
    while True:
        byte, n = n & 0x7f, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n: return out
def field(number, value):  # length-delimited
    value = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(value)) + value
def number(field_number, n): return varint(field_number << 3) + varint(n & (2**64 - 1))
def frame(conn, payload): return struct.pack(">II", conn, len(payload)) + payload
def message(stream, kind, payload): return struct.pack(">IIBB", len(payload), stream, kind, 0) + payload
def request(method, payload): return field(1, "nri.pkg.api.v1alpha1.Plugin") + field(2, method) + field(3, payload)
pod = field(1, "sandbox") + field(2, "pod") + field(3, "uid") + field(4, "team-a")
def mount(dest, source): return field(9, field(1, dest) + field(2, "bind") + field(3, source) + field(4, "rbind"))
def device(path, major, minor): return field(2, field(1, path) + field(2, "c") + number(3, major) + number(4, minor))
rule = field(7, number(1, 1) + field(2, "c") + field(3, number(1, 195)) + field(5, "rwm"))
container = (field(3, "app") + field(6, field(1, "cdi.k8s.io/x") + field(2, "nvidia.com/gpu=all")) +
             field(8, "NVIDIA_VISIBLE_DEVICES=all") + field(8, "NVIDIA_VISIBLE_DEVICES=0,GPU-b,1:0") +
             field(8, "CUDA_VERSION=11.0") + field(8, "NVIDIA_IMEX_CHANNELS=0") +
             mount("/var/run/nvidia-container-devices/all", "/dev/null") + mount("/mps", "/run/gpuguard/mps") +
             mount("/host-dev", "/dev") + field(11, device("/dev/nvidia0", 195, 0) +
             device("/dev/nvidia-caps/nvidia-cap7", 238, 7) + field(3, rule)) + field(20, field(1, "nvidia.com/gpu=1")))
create = message(3, 1, request("CreateContainer", field(1, pod) + field(2, container)))
adjust = field(4, field(1, "NVIDIA_VISIBLE_DEVICES") + field(2, "void")) + field(8, field(1, "nvidia.com/gpu=all"))
validate = message(5, 1, request("ValidateContainerAdjustment", field(1, pod) + field(2, container) + field(3, adjust)))
configure = message(1, 1, request("Configure", field(2, "containerd")))
answer = message(1, 2, b"")
seeds = {"configure": frame(1, configure) + frame(2, answer),
         "create": frame(1, configure) + frame(1, create),
         "split": frame(1, create[:7]) + frame(1, create[7:]) + frame(2, answer),
         "validate": frame(1, validate),
         "joined": frame(1, configure + create + validate),
         "empty-frame": frame(2, b"") + frame(1, configure),
         # The mask check's inputs (check_mask_hook): the runtime's state, and a mountinfo before pivot_root.
         "hook-state": b'{"pid":42,"bundle":"/run/b","root":{"path":"rootfs"},"annotations":{"a":"b"}}',
         "hook-mountinfo": b"\n30 1 0:50 / /r rw - overlay overlay rw\n31 30 8:1 / /r/h ro - ext4 ext4 rw\n"
                           b"32 31 0:25 / /r/h/run ro - tmpfs tmpfs rw\n33 32 0:60 / /r/h/run/gpuguard rw - tmpfs t rw\n"}
for name, data in seeds.items():
    open(f"{sys.argv[1]}/{name}", "wb").write(bytes([13]) + data)
PY

# Each target is one process on one core: JOBS of them run side by side.
run_target() {  # TARGET: its last lines go to $out/TARGET.log, its exit status to $out/TARGET.status
  local status=0
  "$out/fuzz/${1}_fuzz" -max_total_time="$seconds" -max_len=131072 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$out/findings/${1}-" -print_final_stats=1 "$out/corpus/$1" 2>"$out/$1.log" || status=$?
  echo "$status" > "$out/$1.status"
}
# The enforcer's model target starts from nothing: every byte string is a case, and coverage finds the rest.
printf '\x01' > "$out/corpus/enforcer_model/first"
targets=(admission http extender nodereport nri enforcer_model)
rm -f "$out"/*.status
for target in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-2}" ]; do wait -n || true; done
  echo "fuzz: ${target}_fuzz for ${seconds}s"
  run_target "$target" &
done
wait
status=0
for target in "${targets[@]}"; do
  echo "fuzz: ${target}_fuzz, exit $(cat "$out/$target.status")"
  tail -n 12 "$out/$target.log"
  [ "$(cat "$out/$target.status")" = 0 ] || status=1
done
if [ "$status" -ne 0 ]; then
  echo "fuzz: FINDINGS under $out/findings:"; ls -l "$out/findings"
  exit 1
fi
echo "fuzz: no findings"

#!/usr/bin/env bash
# `gpuguard-webhook audit` over tests/fixtures/audit: a PodList of 54 varied pods, the cluster's DRA claims,
# a policy, and a NodeList whose GPUIsolation conditions say where the injected value does not hold. Its JSON and table reports must equal the checked-in ones, it must exit 1 (something is
# exposed), and 0 on the pods that are already protected; bad input exits 2.
#   audit_test.sh WEBHOOK_BINARY WORK_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
webhook="$1"
work="$2"
fixture="$root/tests/fixtures/audit"
mkdir -p "$work"
audit() { "$webhook" audit --policy-dir "$fixture/policy" --claims "$fixture/claims.json" "$@"; }

status=0
audit --output json "$fixture/pods.json" > "$work/report.json" || status=$?
[ "$status" -eq 1 ] || { echo "audit exited $status on exposed pods, want 1"; exit 1; }
diff -u "$fixture/expected.json" "$work/report.json" || { echo "the JSON report differs from tests/fixtures/audit/expected.json"; exit 1; }
status=0
audit "$fixture/pods.json" > "$work/report.txt" || status=$?
[ "$status" -eq 1 ] || { echo "audit (table) exited $status, want 1"; exit 1; }
diff -u "$fixture/expected.txt" "$work/report.txt" || { echo "the table differs from tests/fixtures/audit/expected.txt"; exit 1; }

# The first twelve pods were patched at creation: nothing to report, exit 0, from standard input.
/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["items"]=d["items"][:12]; print(json.dumps(d))' \
  "$fixture/pods.json" > "$work/protected.json"
audit --output json - < "$work/protected.json" > "$work/protected-report.json"
/usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r == {"pods": 12, "exposedPods": 0, "exposures": []}, r' \
  "$work/protected-report.json"

# --nodes: the nodes whose GPUIsolation condition is not True make the audit fail even where every pod is
# protected; a node without the condition (no GPU plugin there) is counted, not listed.
status=0
audit --nodes "$fixture/nodes.json" - < "$work/protected.json" > "$work/nodes.txt" || status=$?
[ "$status" -eq 1 ] || { echo "audit --nodes exited $status with two nodes not holding, want 1"; exit 1; }
diff -u "$fixture/expected-nodes.txt" "$work/nodes.txt" || { echo "the table differs from tests/fixtures/audit/expected-nodes.txt"; exit 1; }
audit --nodes "$fixture/nodes.json" --output json - < "$work/protected.json" > "$work/nodes.json" || true
/usr/bin/python3 - "$work/nodes.json" <<'PY'
import json, sys
nodes = json.load(open(sys.argv[1]))["nodes"]
assert (nodes["nodes"], nodes["reporting"]) == (4, 3), nodes
assert [(n["name"], n["status"], n["reason"]) for n in nodes["notHolding"]] == [
    ("gpu-b", "False", "BreaksPods"), ("gpu-c", "False", "Leaks")], nodes
assert nodes["notHolding"][0]["lastTransitionTime"] == "2026-11-25T09:40:00Z", nodes
PY
/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["items"]=[n for n in d["items"] if n["metadata"]["name"] in ("gpu-a","cpu-1")]; print(json.dumps(d))' \
  "$fixture/nodes.json" > "$work/holding-nodes.json"
audit --nodes "$work/holding-nodes.json" - < "$work/protected.json" > /dev/null

# A protected pod on a node where the value does not hold is exposed all the same: each of its GPU-less
# containers, through the node's runtime.
/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["items"]=d["items"][:1]; d["items"][0]["spec"]["nodeName"]="gpu-c"; print(json.dumps(d))' \
  "$work/protected.json" > "$work/on-leaky-node.json"
status=0
audit --nodes "$fixture/nodes.json" --output json "$work/on-leaky-node.json" > "$work/on-leaky-node-report.json" || status=$?
[ "$status" -eq 1 ] || { echo "audit of a pod on a leaking node exited $status, want 1"; exit 1; }
/usr/bin/python3 - "$work/on-leaky-node-report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["exposedPods"] == 1, r
assert {(e["door"], e["detail"]) for e in r["exposures"]} == {("node runtime", "node gpu-c: GPUIsolation False (Leaks)")}, r
PY

# Bad input is an error, not a clean report.
for bad in "--output yaml $fixture/pods.json" "$fixture/policy/mode" "--claims $fixture/pods.json $fixture/pods.json" "/nonexistent" \
           "--nodes $fixture/pods.json $fixture/pods.json" "--nodes /nonexistent $fixture/pods.json"; do
  status=0
  # shellcheck disable=SC2086
  "$webhook" audit $bad > /dev/null 2>&1 || status=$?
  [ "$status" -eq 2 ] || { echo "audit $bad exited $status, want 2"; exit 1; }
done
echo "audit: 54 pods, the reports match, protected pods exit 0, nodes not holding exit 1 (and expose the pods on them), bad input exits 2"

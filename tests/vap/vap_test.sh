#!/usr/bin/env bash
# The ValidatingAdmissionPolicy backstop (manifests/base/backstop.yaml), evaluated against the webhook's
# fixture table: every Pod the webhook lets through must pass it, and every Pod the webhook had to inject
# into must be refused when it arrives without the webhook. And the outage scope (the chart's
# webhook.gpuNodeTaints) as the chart renders it, over tests/fixtures/outage-scope: each webhook entry is
# called for the pods its condition says, the backstop judges at CREATE only those that could land on a GPU
# node, and it refuses an UPDATE of tolerations that would let one land that could not.
# Usage: vap_test.sh WEBHOOK_BINARY WORK_DIR HELM
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
webhook="$1"
work="$2"
helm="$3"
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "vap_test.sh: node and npm are needed to evaluate CEL (scripts/install-deps.sh installs them)"; exit 1; }
mkdir -p "$work"
cp "$root/tests/vap/package.json" "$root/tests/vap/package-lock.json" "$root/tests/vap/evaluate.mjs" "$work/"
if ! cmp -s "$work/package-lock.json" "$work/node_modules/.package-lock.json" 2>/dev/null; then
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || {
    echo "vap_test.sh: npm ci failed: @bufbuild/cel could not be installed from the npm registry"; exit 1; }
fi

/usr/bin/python3 - "$root" "$webhook" "$work" "$helm" <<'PY'
import base64, copy, json, os, subprocess, sys, tempfile, yaml
root, webhook, work, helm = sys.argv[1:5]
policy = next(yaml.safe_load_all(open(os.path.join(root, "manifests/base/backstop.yaml"))))["spec"]
defaults = yaml.safe_load(open(os.path.join(root, "manifests/base/policy.yaml")))["data"]
fixtures = os.path.join(root, "tests/fixtures/admission")
cases = []
for name in sorted(os.listdir(fixtures)):
    d = os.path.join(fixtures, name)
    review = json.load(open(os.path.join(d, "review.json")))
    request = review["request"]
    expect = json.load(open(os.path.join(d, "expect.json")))
    matched = request["kind"] == {"group": "", "version": "v1", "kind": "Pod"} and (
        (request["operation"], request.get("subResource", "")) in {("CREATE", ""), ("UPDATE", "ephemeralcontainers"), ("UPDATE", "")})
    # A plain pod UPDATE reaches the backstop alone (the webhook never sees it): its verdict is the fixture's.
    annotation_update = (request["operation"], request.get("subResource", "")) == ("UPDATE", "")
    denied = not expect.get("allowed", True)
    if not matched or (denied and "backstop" not in expect):
        continue  # the backstop never sees these, or the webhook refused the pod outright
    if annotation_update:
        files = dict(defaults)
        if os.path.exists(os.path.join(d, "policy.json")):
            files.update(json.load(open(os.path.join(d, "policy.json"))))
        # The API server leaves request.subResource out where there is none: so does the case.
        cases.append({"name": name + ": a pod UPDATE, which only the backstop judges", "params": {"data": files},
                      "request": {"operation": "UPDATE", "namespace": request["namespace"]},
                      "oldObject": request.get("oldObject"), "object": request["object"],
                      "expect": expect.get("backstop", "allow")})
        continue
    files = dict(defaults)
    if os.path.exists(os.path.join(d, "policy.json")):
        files.update(json.load(open(os.path.join(d, "policy.json"))))
    with tempfile.TemporaryDirectory() as policy_dir:
        for key, value in files.items():
            open(os.path.join(policy_dir, key), "w").write(value)
        claims = os.path.join(d, "claims.json")
        printed = json.loads(subprocess.run([webhook, "review", "--policy-dir", policy_dir]
                                            + (["--claims", claims] if os.path.exists(claims) else [])
                                            + [os.path.join(d, "review.json")],
                                            check=True, capture_output=True, text=True).stdout)
    injects = any(op["op"] in ("add", "replace") for op in printed["patch"])
    enforced = files["mode"].strip() in ("enforce", "strict")
    # expect.json may say "backstop" outright where an add/replace does not tell (a duplicate removed).
    as_submitted = expect.get("backstop", "deny" if enforced and injects else "allow")
    output = os.path.join(d, "expected-object.json")
    common = {"params": {"data": files}, "request": dict({"operation": request["operation"], "namespace": request["namespace"]},
                                                         **({"subResource": request["subResource"]} if request.get("subResource") else {})),
              "oldObject": request.get("oldObject")}
    if not denied:
        cases.append(dict(common, name=name + ": as the webhook leaves it",
                          object=json.load(open(output)) if os.path.exists(output) else request["object"], expect="allow"))
    cases.append(dict(common, name=name + ": as submitted, without the webhook", object=request["object"], expect=as_submitted))

# A ConfigMap without data means the defaults, as it does for the webhook.
bare = json.load(open(os.path.join(fixtures, "no-env/review.json")))["request"]
cases.append({"name": "empty ConfigMap: defaults apply", "params": {}, "request": {"operation": "CREATE", "namespace": "team-a"},
              "object": bare["object"], "expect": "deny"})
fixture_cases = len(cases)

# The outage scope. An independent reading of the scheduler's rule (k8s.io/api/core/v1
# Toleration.ToleratesTaint), widened as the chart promises: neither the operator nor the value compared.
def tolerates(t, taint):
    return t.get("effect", "") in ("", taint["effect"]) and t.get("key", "") in ("", taint["key"])

def lands(spec, taints):
    if spec.get("nodeName", "") or spec.get("schedulerName", "default-scheduler") not in ("", "default-scheduler"):
        return True
    return all(any(tolerates(t, taint) for t in spec.get("tolerations", [])) for taint in taints)

scope = yaml.safe_load(open(os.path.join(root, "tests/fixtures/outage-scope/cases.yaml")))
values = os.path.join(work, "scope-values.yaml")
json.dump({"webhook": {"gpuNodeTaints": scope["taints"], "armAfterReady": False},
           "selfSigned": {"renderWithoutCluster": True}}, open(values, "w"))  # JSON is YAML
rendered = list(yaml.safe_load_all(subprocess.run(
    [helm, "template", "gpuguard", os.path.join(root, "charts/gpuguard"), "--namespace", "gpuguard-system", "-f", values],
    check=True, capture_output=True, text=True).stdout))
def rendered_one(kind, name=None):
    [d] = [d for d in rendered if d and d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return d
entries = rendered_one("MutatingWebhookConfiguration")["webhooks"]
assert [e["name"] for e in entries] == ["visible-devices.gpuguard.io", "visible-devices-elsewhere.gpuguard.io"], entries
chart_backstop = rendered_one("ValidatingAdmissionPolicy", "gpuguard-visible-devices")["spec"]
chart_params = {"data": rendered_one("ConfigMap", "gpuguard-policy")["data"]}
base_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": "app", "image": "cuda"}]}}
patched_env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": chart_params["data"].get("visibleDevicesValue", "none").strip()}]
for pod in scope["pods"]:
    spec = {k: pod[k] for k in ("tolerations", "nodeName", "schedulerName") if k in pod}
    expected = lands(spec, scope["taints"])
    assert expected == pod["lands"], f"{pod['name']}: the Python reading says lands={expected}, the fixture {pod['lands']}"
    obj = copy.deepcopy(base_pod)
    obj["spec"].update(spec)
    create = {"operation": "CREATE", "namespace": "team-a"}
    for entry, called in zip(entries, (expected, not expected)):
        cases.append({"name": f"scope: {pod['name']}: {entry['name']}", "conditionsOnly": True,
                      "policy": {"matchConditions": entry["matchConditions"], "variables": [], "validations": []},
                      "request": create, "object": obj, "expect": "called" if called else "not called"})
    common = {"policy": chart_backstop, "params": chart_params}
    cases.append(dict(common, name=f"scope: {pod['name']}: created unpatched", request=create, object=obj,
                      expect="deny" if expected else "allow"))
    patched = copy.deepcopy(obj)
    patched["spec"]["containers"][0]["env"] = patched_env
    cases.append(dict(common, name=f"scope: {pod['name']}: created patched", request=create, object=patched, expect="allow"))
    if "tolerations" in spec:  # the one field of these an UPDATE may change (it may only add tolerations)
        # Refused where they let it land, patched or not: it was never reviewed as a pod for GPU nodes.
        update = {"operation": "UPDATE", "namespace": "team-a"}
        cases.append(dict(common, name=f"scope: {pod['name']}: tolerations added to a pod stored unpatched", request=update,
                          oldObject=base_pod, object=obj, expect="deny" if expected else "allow"))
        before = copy.deepcopy(base_pod)
        before["spec"]["containers"][0]["env"] = patched_env
        cases.append(dict(common, name=f"scope: {pod['name']}: tolerations added to a patched pod", request=update,
                          oldObject=before, object=patched, expect="deny" if expected else "allow"))
        if expected:  # and a pod that could land already may gain more
            cases.append(dict(common, name=f"scope: {pod['name']}: another toleration added", request=update, oldObject=obj,
                              object=dict(obj, spec=dict(obj["spec"], tolerations=spec["tolerations"] + [{"key": "example.com/spot", "operator": "Exists"}])),
                              expect="allow"))
json.dump({"policy": policy, "cases": cases}, open(os.path.join(work, "cases.json"), "w"))
print(f"{fixture_cases} backstop cases from the fixture table, {len(cases) - fixture_cases} of the outage scope")
PY
node "$work/evaluate.mjs" "$work/cases.json"

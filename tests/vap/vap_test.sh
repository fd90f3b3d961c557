#!/usr/bin/env bash
# The ValidatingAdmissionPolicy backstop (manifests/base/backstop.yaml), evaluated against the webhook's
# fixture table: every Pod the webhook lets through must pass it, and every Pod the webhook had to inject
# into must be refused when it arrives without the webhook. Usage: vap_test.sh WEBHOOK_BINARY WORK_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
webhook="$1"
work="$2"
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "vap_test.sh: node and npm are needed to evaluate CEL (scripts/install-deps.sh installs them)"; exit 1; }
mkdir -p "$work"
cp "$root/tests/vap/package.json" "$root/tests/vap/package-lock.json" "$root/tests/vap/evaluate.mjs" "$work/"
if ! cmp -s "$work/package-lock.json" "$work/node_modules/.package-lock.json" 2>/dev/null; then
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || {
    echo "vap_test.sh: npm ci failed: @bufbuild/cel could not be installed from the npm registry"; exit 1; }
fi

/usr/bin/python3 - "$root" "$webhook" "$work" <<'PY'
import base64, json, os, subprocess, sys, tempfile, yaml
root, webhook, work = sys.argv[1:4]
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
json.dump({"policy": policy, "cases": cases}, open(os.path.join(work, "cases.json"), "w"))
print(f"{len(cases)} backstop cases from the fixture table")
PY
node "$work/evaluate.mjs" "$work/cases.json"

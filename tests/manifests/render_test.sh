#!/usr/bin/env bash
# Renders manifests/default offline with fresh certificates and checks what the apiserver relies on,
# and that the shipped policy ConfigMap is a policy gpuguard-webhook ($1) accepts.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
webhook="$1"
command -v kubectl >/dev/null || { echo "kubectl not installed: cannot render"; exit 77; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$root/manifests/default" "$work/default"
rm -rf "$work/default/certs"
"$root/certs/generate.sh" --out "$work/default/certs" >/dev/null
kubectl kustomize "$work/default" > "$work/rendered.yaml"

python3 - "$work/rendered.yaml" "$work/default/certs/ca.crt" "$work/policy" <<'PY'
import base64, json, os, re, sys
text = open(sys.argv[1]).read()
ca = open(sys.argv[2]).read()
docs = text.split("\n---\n")
kinds = sorted(re.search(r"^kind: (\S+)", d, re.M).group(1) for d in docs)
expected = sorted(["Namespace", "ServiceAccount", "Secret", "Secret", "Service", "Deployment", "ConfigMap",
                   "PodDisruptionBudget", "MutatingWebhookConfiguration"])
assert kinds == expected, kinds
webhook = next(d for d in docs if "kind: MutatingWebhookConfiguration" in d)
lines = webhook.splitlines()
start = next(i for i, l in enumerate(lines) if l.strip() == "caBundle: |")
indent = len(lines[start]) - len(lines[start].lstrip())
bundle = []
for line in lines[start + 1:]:
    if len(line) - len(line.lstrip()) <= indent:
        break
    bundle.append(line.strip())
assert base64.b64decode("".join(bundle)).decode() == ca, "caBundle is not the generated CA"
for needle in ["failurePolicy: Fail", "reinvocationPolicy: IfNeeded", "sideEffects: None", "path: /mutate",
               "pods/ephemeralcontainers", "timeoutSeconds: 5", "matchPolicy: Equivalent"]:
    assert needle in webhook, needle
deployment = next(d for d in docs if "kind: Deployment" in d)
for needle in ["runAsNonRoot: true", "readOnlyRootFilesystem: true", "allowPrivilegeEscalation: false",
               "type: RuntimeDefault", "namespace: gpuguard-system", "priorityClassName: system-cluster-critical"]:
    assert needle in deployment, needle
assert "--policy-dir=/etc/gpuguard/policy" in deployment and "name: gpuguard-policy" in deployment
policy = next(d for d in docs if "kind: ConfigMap" in d)
for key in ["mode: enforce", "visibleDevicesValue: none", "gpuResources: nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*",
            "exemptNamespaces: \"\"", "exemptServiceAccounts: \"\"", "privileged: warn", "stripUserValueFromGpuContainers: \"true\""]:
    assert key in policy, key
# The ConfigMap's data as the kubelet would mount it: one file per key.
os.makedirs(sys.argv[3])
data = policy.split("\ndata:\n", 1)[1]
for line in data.splitlines():
    if not line.startswith("  ") or line.startswith("   "):
        break
    key, value = line.strip().split(": ", 1)
    open(os.path.join(sys.argv[3], key), "w").write(json.loads(value) if value.startswith('"') else value)
print("manifests/default renders:", ", ".join(kinds))
PY

"$webhook" review --policy-dir "$work/policy" "$root/tests/fixtures/admission/mixed/review.json" > "$work/review.json"
python3 - "$work/review.json" "$root/tests/fixtures/admission/mixed/review.json" <<'PY'
import json, sys
reviewed = json.load(open(sys.argv[1]))
assert reviewed["review"]["response"]["allowed"] is True
assert len(reviewed["patch"]) == 4, reviewed["patch"]  # the shipped policy behaves as the defaults do
print("the shipped policy ConfigMap is accepted and behaves as the defaults")
PY

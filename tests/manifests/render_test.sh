#!/usr/bin/env bash
# Renders manifests/default offline with fresh certificates and checks what the apiserver relies on.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
command -v kubectl >/dev/null || { echo "kubectl not installed: cannot render"; exit 77; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$root/manifests/default" "$work/default"
rm -rf "$work/default/certs"
"$root/certs/generate.sh" --out "$work/default/certs" >/dev/null
kubectl kustomize "$work/default" > "$work/rendered.yaml"

python3 - "$work/rendered.yaml" "$work/default/certs/ca.crt" <<'PY'
import base64, re, sys
text = open(sys.argv[1]).read()
ca = open(sys.argv[2]).read()
docs = text.split("\n---\n")
kinds = sorted(re.search(r"^kind: (\S+)", d, re.M).group(1) for d in docs)
expected = sorted(["Namespace", "ServiceAccount", "Secret", "Secret", "Service", "Deployment",
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
print("manifests/default renders:", ", ".join(kinds))
PY

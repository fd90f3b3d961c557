#!/usr/bin/env bash
# The Helm chart (charts/gpuguard): `helm lint --strict` and `helm template` with the defaults and with
# each values file in charts/gpuguard/ci, every rendering held to the checks kustomize's renderings are
# held to (checks.py), the policy and device plugin config each renders accepted by the binaries, and
# the default rendering compared with manifests/default's (and the audit's with manifests/audit's) so that
# the two cannot drift, and the audit's
# PrometheusRule and dashboard expressions through Prometheus's own `promtool check rules`.
#   helm_test.sh HELM KUSTOMIZE WEBHOOK DEVICE_PLUGIN PROMTOOL
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
helm="$1" kustomize="$2" webhook="$3" device_plugin="$4" promtool="$5"
for tool in "$helm" "$kustomize" "$promtool"; do
  [ -x "$tool" ] || { echo "helm_test.sh: no $tool (the build makes it from e2e/go.mod)"; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export HELM_CACHE_HOME="$work/helm/cache" HELM_CONFIG_HOME="$work/helm/config" HELM_DATA_HOME="$work/helm/data"
kube_version=1.37.2  # the release e2e/go.mod pins

render() {  # render NAME [VALUES_FILE]
  local name="$1"; shift
  local values=()
  [ $# -gt 0 ] && values=(-f "$1")
  "$helm" lint --strict --kube-version "$kube_version" "${values[@]}" "$root/charts/gpuguard" > "$work/$name.lint" 2>&1 \
    || { cat "$work/$name.lint"; echo "helm lint failed for $name"; exit 1; }
  "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
    "${values[@]}" > "$work/$name.yaml" 2> "$work/$name.stderr"
  # Helm says nothing on a clean chart (it warned on every command while the backstop was a link).
  [ ! -s "$work/$name.stderr" ] || { cat "$work/$name.stderr"; echo "helm template $name wrote to stderr"; exit 1; }
}
# The repo's helm behaves as a released one: its version, and with no cluster it assumes the Kubernetes
# of its release, which the chart's kubeVersion accepts without --kube-version (scripts/build-helm).
helm_version="$("$helm" version --template '{{.Version}}')"
[[ "$helm_version" =~ ^v3\.[0-9]+\.[0-9]+$ ]] || { echo "helm version: $helm_version, want a release version"; exit 1; }
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system > /dev/null 2> "$work/no-kube-version.err" \
  || { cat "$work/no-kube-version.err"; echo "helm template without --kube-version fails: is helm stamped as released?"; exit 1; }
# The backstop's CEL is written once for both installs: the chart's copy must be manifests/base's, byte for
# byte (a copy, not a link, so that helm does not warn on every command).
cmp "$root/manifests/base/backstop.yaml" "$root/charts/gpuguard/files/backstop.yaml" \
  || { echo "charts/gpuguard/files/backstop.yaml differs from manifests/base/backstop.yaml: cp the one you changed over the other"; exit 1; }
render default
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set webhook.armAfterReady=false --set selfSigned.renderWithoutCluster=true > "$work/armed.yaml"
# Argo CD's way (armAfterReady=false) rendered without a cluster and without cert-manager: refused, naming
# cert-manager, since every render would make a new CA (lookup finds none); cert-manager's renders.
if "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
    --set webhook.armAfterReady=false > "$work/argo.out" 2>&1; then
  echo "helm template: webhook.armAfterReady=false without cert-manager rendered, a new CA at every render"; exit 1
fi
grep -q "rendered without a cluster .* Use cert-manager (--set certManager.enabled=true)" "$work/argo.out" \
  || { cat "$work/argo.out"; echo "webhook.armAfterReady=false without cert-manager: the refusal does not say why"; exit 1; }
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set webhook.armAfterReady=false --set certManager.enabled=true > /dev/null \
  || { echo "helm template: webhook.armAfterReady=false with cert-manager refused"; exit 1; }
# The arm hook's probe namespace must be one the webhook covers: kube-system is refused, naming the key; ""
# arms on readiness alone (checked below).
if "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
    --set webhook.armProbeNamespace=kube-system > "$work/probe.out" 2>&1; then
  echo "helm template: webhook.armProbeNamespace=kube-system rendered, a probe the webhook never reviews"; exit 1
fi
grep -q "webhook.armProbeNamespace: kube-system is a namespace the webhook never covers" "$work/probe.out" \
  || { cat "$work/probe.out"; echo "webhook.armProbeNamespace=kube-system: the refusal does not say why"; exit 1; }
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set webhook.armProbeNamespace= > "$work/no-probe.yaml"
for case in 'policy.exemptNamespaces="monitoring, default"|is in policy.exemptNamespaces' \
    'policy.exemptNamespaces="monitoring\ndefault"|is in policy.exemptNamespaces' \
    'policy.exemptServiceAccounts="monitoring/dcgm-exporter, default/default"|default/default, the account the probe pod runs as' \
    'webhook.armProbeNamespace="gpuguard-system"|is the release.s own namespace'; do
  if "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
      --set-json "${case%%|*}" > "$work/probe.out" 2>&1; then
    echo "helm template --set ${case%%|*} rendered: the probe would never be patched"; exit 1
  fi
  grep -q "${case#*|}" "$work/probe.out" || { cat "$work/probe.out"; echo "--set ${case%%|*}: the refusal does not say why"; exit 1; }
done
# webhook.armEachApiServer=false: the probe through the Service alone, and no Role in namespace default.
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set webhook.armEachApiServer=false > "$work/arm-service-alone.yaml"
if grep -q -e "--each-apiserver" -e "gpuguard-arm-apiservers" "$work/arm-service-alone.yaml"; then
  echo "webhook.armEachApiServer=false still probes each API server"; exit 1
fi
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  > "$work/arm-each-apiserver.yaml"
grep -q -e "- --each-apiserver" "$work/arm-each-apiserver.yaml" && grep -q "name: gpuguard-arm-apiservers" "$work/arm-each-apiserver.yaml" \
  || { echo "the defaults do not probe each API server"; exit 1; }
# webhook.outage=node-enforcer: nothing refuses pods while the webhook is down, with or without arming, and
# no hook; without the node enforcer, refused at render, naming what it needs.
for arm in true false; do
  "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
    --set webhook.outage=node-enforcer --set webhook.armAfterReady=$arm --set selfSigned.renderWithoutCluster=true > "$work/outage-node-enforcer-$arm.yaml"
done
if "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
    --set webhook.outage=node-enforcer --set nodeEnforcer.enabled=false > "$work/outage.out" 2>&1; then
  echo "helm template: webhook.outage=node-enforcer without the node enforcer rendered"; exit 1
fi
grep -q "webhook.outage=node-enforcer .* it needs nodeEnforcer.enabled=true" "$work/outage.out" \
  || { cat "$work/outage.out"; echo "webhook.outage=node-enforcer without the node enforcer: the refusal does not say why"; exit 1; }
# ...and with the node enforcer only counting or off, refused too: nothing would hold the line.
# A value the policy trims, as it reads it.
for mode in audit off " off" "audit
"; do
  if "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
      --set webhook.outage=node-enforcer --set-string "policy.nodeEnforcement=$mode" > "$work/outage.out" 2>&1; then
    echo "helm template: webhook.outage=node-enforcer with policy.nodeEnforcement='$mode' rendered"; exit 1
  fi
  mode="$(echo $mode)"
  grep -q "policy.nodeEnforcement=$mode keeps it from refusing any" "$work/outage.out" \
    || { cat "$work/outage.out"; echo "webhook.outage=node-enforcer, nodeEnforcement=$mode: the refusal does not say why"; exit 1; }
done
# webhook.gpuNodeTaints: rendered armed (as without hooks) and not; a taint that keeps no pod off a node, or a
# key that is not one, refused by the schema and, where the schema is skipped, by the template, whose CEL the
# key is written into (the value is not compared, so not written).
scope_taints='[{"key":"nvidia.com/gpu","value":"present","effect":"NoSchedule"},{"key":"gpu-pool","effect":"NoExecute"}]'
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set-json "webhook.gpuNodeTaints=$scope_taints" > "$work/gpu-node-taints.yaml"
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set-json "webhook.gpuNodeTaints=$scope_taints" --set webhook.armAfterReady=false --set selfSigned.renderWithoutCluster=true \
  > "$work/gpu-node-taints-armed.yaml"
for case in '[{"key":"nvidia.com/gpu","effect":"PreferNoSchedule"}]@@gpuNodeTaints\[0\].effect: "PreferNoSchedule"; want NoSchedule or NoExecute' \
    "[{\"key\":\"gpu') || true || ('\",\"effect\":\"NoSchedule\"}]@@gpuNodeTaints\\[0\\].key: .* is not a taint key" \
    '[{"key":"nvidia.com/gpu","effect":"NoSchedule","operator":"Exists"}]@@gpuNodeTaints\[0\]: unknown field operator'; do
  taints="${case%%@@*}" why="${case#*@@}"
  for schema in "" --skip-schema-validation; do
    if "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" $schema \
        --set-json "webhook.gpuNodeTaints=$taints" > "$work/taints.out" 2>&1; then
      echo "helm template $schema --set-json webhook.gpuNodeTaints=$taints rendered"; exit 1
    fi
    if [ -n "$schema" ]; then
      grep -q "$why" "$work/taints.out" || { cat "$work/taints.out"; echo "webhook.gpuNodeTaints=$taints: the refusal does not say why"; exit 1; }
    else
      grep -q "/webhook/gpuNodeTaints/0" "$work/taints.out" || { cat "$work/taints.out"; echo "webhook.gpuNodeTaints=$taints: the schema's refusal does not name it"; exit 1; }
    fi
  done
done
# ...and without the backstop, or under webhook.outage=node-enforcer, refused naming why.
for case in "backstop.enabled=false@@it needs backstop.enabled=true" "webhook.outage=node-enforcer@@leave the list empty there"; do
  if "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
      --set-json "webhook.gpuNodeTaints=$scope_taints" --set "${case%%@@*}" > "$work/taints.out" 2>&1; then
    echo "helm template --set ${case%%@@*} with webhook.gpuNodeTaints rendered"; exit 1
  fi
  grep -q "${case#*@@}" "$work/taints.out" || { cat "$work/taints.out"; echo "--set ${case%%@@*} with webhook.gpuNodeTaints: the refusal does not say why"; exit 1; }
done
# helm upgrade --reuse-values takes the values of the chart a release was first installed with, its defaults
# included (tests/fixtures/chart-upgrade/values.yaml: the chart's before the built-in lists): this chart's
# templates must render with them, nothing missing, and carry this chart's built-in lists, not that one's.
cp -r "$root/charts/gpuguard" "$work/chart-reuse"
cp "$root/tests/fixtures/chart-upgrade/values.yaml" "$work/chart-reuse/values.yaml"
"$helm" template gpuguard "$work/chart-reuse" --namespace gpuguard-system --kube-version "$kube_version" \
  > "$work/reuse.yaml" 2> "$work/reuse.err" \
  || { cat "$work/reuse.err"; echo "helm template with the earlier chart's values (as --reuse-values) failed"; exit 1; }
# MPS resources named by rename, renameByDefault and neither, with an admin's own share: each in the policy's
# sharedGpuResources, the admin's last.
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set-json 'devicePlugin.config={"version":"v1","sharing":{"mps":{"resources":[{"name":"nvidia.com/gpu","rename":"example.com/mps","devices":[0],"replicas":2},{"name":"nvidia.com/mig-1g.10gb","replicas":2}]}}}' \
  --set policy.sharedGpuResources=hami.io/gpu > "$work/mps-renamed.yaml"
# The built-in lists, left out: an explicit false only.
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set builtInGpuInfrastructure=false --set webhook.builtInExcludedNamespaces=false \
  --set 'webhook.excludedNamespaces={kube-system,dcgm}' --set 'gpuInfrastructure={dcgm/dcgm-exporter:app=dcgm-exporter}' \
  > "$work/no-built-ins.yaml"
# helm uninstall's node cleanup, left out: an explicit false only.
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set uninstall.cleanNodes=false > "$work/no-cleanup.yaml"
# ...and without the device plugin, no Node condition to remove: no token, no write to Nodes.
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set devicePlugin.enabled=false > "$work/no-device-plugin.yaml"
for values in "$root"/charts/gpuguard/ci/*-values.yaml; do
  render "$(basename "$values" -values.yaml)" "$values"
done

cp -r "$root/manifests" "$work/manifests"
"$root/certs/generate.sh" --out "$work/manifests/default/certs" >/dev/null
"$kustomize" build "$work/manifests/default" > "$work/kustomize.yaml"
"$root/certs/generate.sh" --service gpuguard-scheduler-extender --out "$work/manifests/scheduler-extender/certs" >/dev/null
"$kustomize" build "$work/manifests/scheduler-extender" > "$work/kustomize-extender.yaml"
"$kustomize" build "$work/manifests/audit" > "$work/kustomize-audit.yaml"
"$kustomize" build "$work/manifests/webhook-only" > "$work/kustomize-webhook-only.yaml"
"$kustomize" build "$work/manifests/monitoring" > "$work/kustomize-monitoring.yaml"
"$kustomize" build "$work/manifests/uninstall" > "$work/kustomize-uninstall.yaml"
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set webhook.armAfterReady=false --set selfSigned.renderWithoutCluster=true --set monitoring.serviceMonitor.enabled=true \
  --set monitoring.prometheusRule.enabled=true > "$work/armed-monitoring.yaml"
# The image overlay README and operations.md give, beside manifests/ as they say, with every component:
# each container of each runs the image it names.
/usr/bin/python3 - "$root" "$work" <<'PY'
import os, re, sys
root, work = sys.argv[1:3]
blocks = [re.search(r"```yaml\n(# gpuguard-images/kustomization.yaml.*?)```", open(f"{root}/{doc}").read(), re.S)
          for doc in ("README.md", "docs/operations.md")]
assert all(blocks) and blocks[0][1] == blocks[1][1], "README's and operations.md's image overlays differ"
overlay = blocks[0][1]
for name, resources in (("documented", None), ("every-component", "  - ../manifests/default\n  - ../manifests/audit\n  - ../manifests/scheduler-extender\n")):
    os.makedirs(f"{work}/overlay-{name}")
    text = overlay if resources is None else re.sub(r"resources:\n(  - .*\n)+", "resources:\n" + resources, overlay)
    open(f"{work}/overlay-{name}/kustomization.yaml", "w").write(text)
PY
for name in documented every-component; do
  "$kustomize" build "$work/overlay-$name" > "$work/image-overlay-$name.yaml"
  /usr/bin/python3 - "$work/image-overlay-$name.yaml" <<'PY'
import sys, yaml
images = set()
for d in yaml.safe_load_all(open(sys.argv[1])):
    spec = (d or {}).get("spec", {}).get("template", {}).get("spec")
    for c in (spec or {}).get("containers", []) + (spec or {}).get("initContainers", []):
        images.add(c["image"])
assert images == {"registry.example.com/gpuguard:0.1.0"}, (sys.argv[1], images)
PY
done
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set webhook.armAfterReady=false --set selfSigned.renderWithoutCluster=true --set devicePlugin.enabled=false --set hostDevices.enabled=false \
  --set nodeEnforcer.enabled=false > "$work/armed-webhook-only.yaml"
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set audit.enabled=true > "$work/audit-enabled.yaml"
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set-json 'nodeEnforcer.networkPolicy.metricsFrom=[]' --set-json 'devicePlugin.networkPolicy.metricsFrom=[]' \
  > "$work/enforcer-no-scrapers.yaml"
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set hostDevices.gpuNodesOnly=false --set-json 'hostDevices.tolerations=[{"operator":"Exists"}]' > "$work/host-devices-everywhere.yaml"
"$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" \
  --set-json 'devicePlugin.tolerations=[{"key":"dedicated","operator":"Equal","value":"gpu","effect":"NoSchedule"}]' \
  > "$work/host-devices-follow.yaml"

/usr/bin/python3 - "$work" "$root" <<'PY'
import base64, json, os, subprocess, sys, yaml
work, root = sys.argv[1:3]
sys.path.insert(0, os.path.join(root, "tests/manifests"))
from checks import *
ns, excluded = "gpuguard-system", ["kube-system", "kube-node-lease", "gpu-operator", "nvidia-device-plugin", "dra-driver-nvidia-gpu", "nvidia-dra-driver-gpu"]

def secret_pem(docs, name, key):
    return base64.b64decode(one(docs, "Secret", name)["data"][key]).decode()

# The defaults: everything manifests/default installs, with a CA and certificates of the chart's own.
docs = load(f"{work}/default.yaml")
check_namespaces(docs, ns)
ca = secret_pem(docs, "gpuguard-ca", "tls.crt")
# No cluster to look up: nothing is armed yet, and the hook is there to arm it.
policy = check_webhook(docs, ns, excluded, ca=ca, failure_policy="Ignore")
check_network_policy(docs)
check_nvidia_components_exempt(docs, os.path.join(root, "tests/fixtures/nvidia-components/pods.yaml"))
check_backstop(docs, ns, actions=("Warn", "Audit"))
check_arming(docs, ns, armed=False)
check_arming(load(f"{work}/no-probe.yaml"), ns, armed=False, probe="")
armed = load(f"{work}/armed.yaml")
check_webhook(armed, ns, excluded, ca=secret_pem(armed, "gpuguard-ca", "tls.crt"))
check_backstop(armed, ns)
check_arming(armed, ns, armed=True)
# The chart's changes, as Artifact Hub reads them: a list of kinds it knows, each with a description.
import re, yaml
chart = yaml.safe_load(open(os.path.join(root, "charts/gpuguard/Chart.yaml")))
changes = yaml.safe_load(chart["annotations"]["artifacthub.io/changes"])
assert changes and all(c["kind"] in ("added", "changed", "deprecated", "removed", "fixed", "security") and c["description"]
                       for c in changes), changes
# ...and they are the CHANGELOG's newest section, which is this version's: the same kinds, in order.
changelog = open(os.path.join(root, "charts/gpuguard/CHANGELOG.md")).read()
newest = re.search(r"^## (\S+)\n(.*?)(?=^## |\Z)", changelog, re.M | re.S)
assert newest and newest[1] == chart["version"], f"CHANGELOG.md's newest section is {newest and newest[1]}, the chart {chart['version']}"
logged = re.findall(r"^- (\w+): ", newest[2], re.M)
assert logged == [c["kind"] for c in changes], f"CHANGELOG.md {chart['version']} lists {logged}; artifacthub.io/changes {[c['kind'] for c in changes]}"
# The chart's version moves with its content: the digest of every file (Chart.yaml without its version
# line) must be the one tests/fixtures/chart-versions.txt records for Chart.yaml's version.
import hashlib
content = hashlib.sha256()
chart_dir = os.path.join(root, "charts/gpuguard")
for dirpath, dirs, files in os.walk(chart_dir):
    dirs.sort()
    for name in sorted(files):
        path = os.path.join(dirpath, name)
        rel = os.path.relpath(path, chart_dir)
        text = open(path, "rb").read()
        if rel == "Chart.yaml":
            text = b"".join(l for l in text.splitlines(True) if not l.startswith(b"version:"))
        content.update(rel.encode() + b"\0" + text + b"\0")
recorded = [l.split() for l in open(os.path.join(root, "tests/fixtures/chart-versions.txt")) if l.strip() and not l.startswith("#")]
versions = [v for v, _ in recorded]
assert len(set(versions)) == len(versions), f"a chart version recorded twice: {versions}"
assert versions == sorted(versions, key=lambda v: tuple(int(x) for x in v.split("."))), f"versions out of order: {versions}"
assert len(set(d for _, d in recorded)) == len(recorded), "two versions with one content: the version moved without a change"
assert versions[-1] == chart["version"], f"Chart.yaml says {chart['version']}; the newest recorded is {versions[-1]}"
assert recorded[-1][1] == content.hexdigest(), (
    f"charts/gpuguard changed since {chart['version']} was recorded ({content.hexdigest()}): move the version, "
    "say what changed in Chart.yaml's artifacthub.io/changes and CHANGELOG.md, and add a line to tests/fixtures/chart-versions.txt")
assert f"## {chart['version']}" in open(os.path.join(chart_dir, "CHANGELOG.md")).read(), "CHANGELOG.md lacks this version"
# The previous chart, frozen for e2e:chart-upgrade: tests/fixtures/chart-previous.tgz must hold exactly the
# content recorded for the version before this one (refresh it from git when a version lands).
import tarfile
def digest_of(files):
    h = hashlib.sha256()
    for rel in files:
        text = files[rel]
        if rel == "Chart.yaml":
            text = b"".join(l for l in text.splitlines(True) if not l.startswith(b"version:"))
        h.update(rel.encode() + b"\0" + text + b"\0")
    return h.hexdigest()
def walk_order(rel):  # os.walk's order above: a directory's files before its subdirectories', each sorted
    parts = rel.split("/")
    return [(1, p) for p in parts[:-1]] + [(0, parts[-1])]
with tarfile.open(os.path.join(root, "tests/fixtures/chart-previous.tgz")) as frozen:
    files = {m.name.split("/", 1)[1]: frozen.extractfile(m).read() for m in frozen.getmembers() if m.isfile()}
previous_version = yaml.safe_load(files["Chart.yaml"])["version"]
assert len(recorded) >= 2 and previous_version == recorded[-2][0], (
    f"tests/fixtures/chart-previous.tgz is chart {previous_version}; the version before {chart['version']} is {recorded[-2][0]}")
assert digest_of(dict(sorted(files.items(), key=lambda kv: walk_order(kv[0])))) == recorded[-2][1], (
    f"tests/fixtures/chart-previous.tgz's content is not chart {recorded[-2][0]}'s as recorded")
# An upgrade that reuses an earlier chart's values: this chart's built-in lists whole, that chart's entries
# kept as additions, and still refusing during an outage (webhook.outage unset there).
reused = load(f"{work}/reuse.yaml")
built_in = enforcer_exemptions(docs)
assert set(built_in) <= set(enforcer_exemptions(reused)), set(built_in) - set(enforcer_exemptions(reused))
assert "nvidia-device-plugin/*:app.kubernetes.io/name=nvidia-device-plugin" in enforcer_exemptions(reused)
check_webhook(reused, ns, excluded, ca=secret_pem(reused, "gpuguard-ca", "tls.crt"), failure_policy="Ignore")
check_arming(reused, ns, armed=False)
# Without the built-ins: only what was listed, and the release's own namespace.
bare = load(f"{work}/no-built-ins.yaml")
selector = one(bare, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"]
assert selector == ["kube-system", "dcgm", "gpuguard-system"], selector
assert [e for e in enforcer_exemptions(bare) if not e.startswith("gpuguard-system/")] == ["dcgm/dcgm-exporter:app=dcgm-exporter"], enforcer_exemptions(bare)
for arm in ("true", "false"):
    outage = load(f"{work}/outage-node-enforcer-{arm}.yaml")
    assert one(outage, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Ignore"
    assert one(outage, "ValidatingAdmissionPolicyBinding", "gpuguard-visible-devices")["spec"]["validationActions"] == ["Warn", "Audit"]
    assert not find(outage, "Job", "gpuguard-arm"), "webhook.outage=node-enforcer: nothing to arm"
    assert find(outage, "DaemonSet", "gpuguard-node-enforcer")
# The outage scope: without gpuNodeTaints one webhook entry and every pod in the backstop's scope; with them a
# second entry, always at Ignore, for the pods the first's condition leaves out, the two alike in all else,
# and the backstop's scope that same condition (vap_test.sh evaluates them over the fixture table).
[entry] = one(docs, "MutatingWebhookConfiguration")["webhooks"]
assert "matchConditions" not in entry, entry
backstop = one(docs, "ValidatingAdmissionPolicy", "gpuguard-visible-devices")["spec"]
assert [c["name"] for c in backstop["matchConditions"]] == ["create-or-annotations-changed"], backstop["matchConditions"]
variables = {v["name"]: v["expression"] for v in backstop["variables"]}
assert variables["mayLandOnGpuNode"] == variables["mayLandBefore"] == "true", variables
for name, armed in (("gpu-node-taints", False), ("gpu-node-taints-armed", True)):
    scoped = load(f"{work}/{name}.yaml")
    first, second = (dict(w) for w in one(scoped, "MutatingWebhookConfiguration")["webhooks"])
    assert (first["name"], second["name"]) == ("visible-devices.gpuguard.io", "visible-devices-elsewhere.gpuguard.io")
    assert (first["failurePolicy"], second["failurePolicy"]) == ("Fail" if armed else "Ignore", "Ignore"), name
    [may] = first.pop("matchConditions")
    [cannot] = second.pop("matchConditions")
    assert may["name"] == "may-land-on-a-gpu-node" and cannot == {"name": "cannot-land-on-a-gpu-node", "expression": f"!({may['expression']})"}
    assert "'nvidia.com/gpu'" in may["expression"] and "'NoExecute'" in may["expression"] and "present" not in may["expression"]
    for key in ("name", "failurePolicy"):
        first.pop(key), second.pop(key)
    assert first == second, (first, second)
    backstop = one(scoped, "ValidatingAdmissionPolicy", "gpuguard-visible-devices")["spec"]
    [condition] = backstop["matchConditions"]
    assert condition["name"] == "create-or-annotations-or-tolerations-changed" and condition["expression"].endswith(
        " || (has(object.spec.tolerations) ? object.spec.tolerations : []) != (has(oldObject.spec.tolerations) ? oldObject.spec.tolerations : [])"), condition
    variables = {v["name"]: v["expression"] for v in backstop["variables"]}
    assert variables["mayLandOnGpuNode"] == may["expression"], variables
    assert variables["mayLandBefore"] == "oldObject == null || " + may["expression"].replace("object.", "oldObject."), variables
    check_arming(scoped, ns, armed=armed)
# Only the flags an admin set reach the plugin: by default none of those a config file also sets.
args = check_device_plugin(docs)
check_own_node_writes(docs)
assert not [a for a in args if a.split("=")[0] in ("--discovery", "--resource-name", "--device-list-strategy", "--mig-strategy")], args
assert check_host_devices(docs) == ["github.com/fuse=/dev/fuse:16"]
check_node_enforcer(docs, policy)
# No scrapers named: no rule at all (one without "from" would let every pod in), only the node's probes.
# Host devices beyond the GPU nodes only when asked: no affinity, the tolerations given.
everywhere = one(load(f"{work}/host-devices-everywhere.yaml"), "DaemonSet", "gpuguard-host-devices")["spec"]["template"]["spec"]
assert "affinity" not in everywhere and everywhere["tolerations"] == [{"operator": "Exists"}], everywhere
# Unset, its tolerations are the GPU DaemonSet's, whatever taint an admin added there.
follow = load(f"{work}/host-devices-follow.yaml")
assert one(follow, "DaemonSet", "gpuguard-host-devices")["spec"]["template"]["spec"]["tolerations"] == [
    {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
assert one(follow, "DaemonSet", "gpuguard-host-devices")["spec"]["template"]["spec"]["tolerations"] == \
    one(follow, "DaemonSet", "gpuguard-device-plugin")["spec"]["template"]["spec"]["tolerations"]
check_enforcer_network_policy(load(f"{work}/enforcer-no-scrapers.yaml"),
                              one(docs, "DaemonSet", "gpuguard-node-enforcer")["spec"]["template"], scrapers=False)
check_device_plugin_network_policy(load(f"{work}/enforcer-no-scrapers.yaml"), scrapers=False)
check_policy(policy)
assert policy == yaml.safe_load(open(f"{root}/manifests/base/policy.yaml"))["data"], "values.yaml's policy is not the shipped one"
for name in ("ca.crt", "tls.crt"):
    open(f"{work}/{name}", "w").write(secret_pem(docs, "gpuguard-webhook-tls", name))
subprocess.run(["openssl", "verify", "-CAfile", f"{work}/ca.crt", "-verify_hostname", "gpuguard-webhook.gpuguard-system.svc",
                f"{work}/tls.crt"], check=True, stdout=subprocess.DEVNULL)
assert open(f"{work}/ca.crt").read() == ca

# cert-manager, with the scheduler extender.
docs = load(f"{work}/cert-manager.yaml")
check_namespaces(docs, ns)
check_webhook(docs, ns, excluded, cert_manager=True, failure_policy="Ignore")
check_arming(docs, ns, armed=False)
check_extender(docs, ns)
extender = one(docs, "Certificate", "gpuguard-scheduler-extender-tls")["spec"]
assert "gpuguard-scheduler-extender.gpuguard-system.svc" in extender["dnsNames"]
assert not find(docs, "Secret"), "cert-manager makes every Secret"

# The webhook alone.
docs = load(f"{work}/webhook-only.yaml")
check_webhook(docs, ns, excluded, ca=secret_pem(docs, "gpuguard-ca", "tls.crt"), failure_policy="Ignore")
check_arming(docs, ns, armed=False, backstop=False)
# No backstop: the guards of the trusted and the ignored namespaces alone, which judge namespaces only.
assert not find(docs, "DaemonSet") and [d["metadata"]["name"] for d in find(docs, "ValidatingAdmissionPolicy")] == [
    "gpuguard-trusted-namespaces", "gpuguard-ignored-namespaces"], sorted(d["kind"] for d in docs)

# Strict, Ignore, no DRA lookups, no switch watches (so no token), and a device plugin config file.
docs = load(f"{work}/strict.yaml")
policy = check_webhook(docs, ns, excluded, ca=secret_pem(docs, "gpuguard-ca", "tls.crt"), failure_policy="Ignore",
                       resource_claims=False, admission_switches=False)
check_policy(policy)
assert policy["mode"] == "strict" and policy["exemptNamespaces"] == "monitoring"
check_network_policy(docs, pod_cidrs=["10.244.0.0/16", "fd00:10:244::/56"])
# failurePolicy Ignore by choice: only the backstop is armed by the hook.
check_backstop(docs, ns, actions=("Warn", "Audit"))
check_arming(docs, ns, armed=False, webhook=False)
args = check_device_plugin(docs)
assert "--mig-strategy=mixed" in args and "--config-file=/etc/gpuguard/device-plugin/config.yaml" in args
# NFD's local feature source: the plugin's file there, written through a read-write mount of its directory.
features = "/etc/kubernetes/node-feature-discovery/features.d"
assert f"--nfd-feature-file={features}/gpuguard" in args, args
plugin_spec = one(docs, "DaemonSet", "gpuguard-device-plugin")["spec"]["template"]["spec"]
[nfd] = [m for m in plugin_spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/host" + features]
assert not nfd.get("readOnly") and {v["name"]: v for v in plugin_spec["volumes"]}[nfd["name"]]["hostPath"]["path"] == features
assert not any(a.startswith("--nfd-feature-file") for a in one(load(f"{work}/default.yaml"), "DaemonSet",
               "gpuguard-device-plugin")["spec"]["template"]["spec"]["containers"][0]["args"])
assert check_host_devices(docs) == ["github.com/fuse=/dev/fuse:16", "example.com/serial=/dev/ttyUSB*"]
os.makedirs(f"{work}/strict-policy")
for key, value in policy.items():
    open(f"{work}/strict-policy/{key}", "w").write(value)
open(f"{work}/device-plugin.yaml", "w").write(one(docs, "ConfigMap", "gpuguard-device-plugin")["data"]["config.yaml"])
# $(NODE_NAME) as the kubelet expands it.
open(f"{work}/device-plugin.args", "w").write(
    "\n".join(a.replace("$(NODE_NAME)", "gpu-node-1") for a in args if not a.startswith("--config-file")))
# MPS: its control DaemonSet, the plugin's readiness mount, the enforcer's exemption; none in the defaults,
# nor where the config time-slices.
check_mps(load(f"{work}/mps.yaml"), root="/run/gpuguard/mps")
assert "--shm-size=2g" in one(load(f"{work}/mps.yaml"), "DaemonSet", "gpuguard-mps-control")["spec"]["template"]["spec"]["containers"][0]["args"]
assert not find(load(f"{work}/default.yaml"), "DaemonSet", "gpuguard-mps-control")
assert not find(load(f"{work}/strict.yaml"), "DaemonSet", "gpuguard-mps-control")
# helm uninstall's node cleanup looks where the release's device plugin wrote (its MPS root, its config
# file, copied into a hook ConfigMap of its own, since the plugin's is gone with the release); it is in
# every rendering with something on the nodes, a release upgraded with --reuse-values from a chart without
# it included; uninstall.cleanNodes=false and the webhook alone render none, and the enforcer then exempts none.
# sharedGpuResources: none by default, so containers on NVIDIA's nvidia.com/gpu.shared keep their CUDA
# variables; the resources the chart's plugin serves through MPS, by the name the plugin gives them, then the
# admin's; an earlier chart's value, reused, kept.
def shared_gpu_resources(docs):
    return one(docs, "ConfigMap", "gpuguard-policy")["data"]["sharedGpuResources"]
assert shared_gpu_resources(load(f"{work}/default.yaml")) == "", shared_gpu_resources(load(f"{work}/default.yaml"))
assert shared_gpu_resources(load(f"{work}/mps.yaml")) == "nvidia.com/gpu.shared", shared_gpu_resources(load(f"{work}/mps.yaml"))
assert shared_gpu_resources(load(f"{work}/mps-renamed.yaml")) == "example.com/mps, nvidia.com/mig-1g.10gb, hami.io/gpu", \
    shared_gpu_resources(load(f"{work}/mps-renamed.yaml"))
assert shared_gpu_resources(reused) == "nvidia.com/gpu.shared", shared_gpu_resources(reused)
docs = load(f"{work}/mps.yaml")
[cleanup] = one(docs, "DaemonSet", "gpuguard-node-cleanup")["spec"]["template"]["spec"]["containers"]
assert "--mps-root=/run/gpuguard/mps" in cleanup["args"] and "--config-file=/etc/gpuguard/device-plugin/config.yaml" in cleanup["args"], cleanup["args"]
assert one(docs, "ConfigMap", "gpuguard-node-cleanup")["data"] == one(docs, "ConfigMap", "gpuguard-device-plugin")["data"]
assert one(docs, "ConfigMap", "gpuguard-node-cleanup")["metadata"]["annotations"]["helm.sh/hook"] == "post-delete"
assert one(reused, "Job", "gpuguard-node-cleanup-wait")["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--timeout=240"
docs = load(f"{work}/no-device-plugin.yaml")
spec = one(docs, "DaemonSet", "gpuguard-node-cleanup")["spec"]["template"]["spec"]
assert spec["automountServiceAccountToken"] is False and "--node-name=$(NODE_NAME)" not in spec["containers"][0]["args"]
assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy")
            and "node-cleanup" in d["metadata"]["name"]]
for name in ("no-cleanup", "webhook-only"):
    docs = load(f"{work}/{name}.yaml")
    assert not [d for d in docs if "node-cleanup" in d["metadata"]["name"]], name
    assert not [e for e in (enforcer_exemptions(docs) if find(docs, "DaemonSet", "gpuguard-node-enforcer") else [])
                if "node-cleanup" in e], name
# The audit with its CRD, rule and dashboard; none of them in the defaults.
docs = load(f"{work}/audit.yaml")
check_namespaces(docs, ns)
check_audit(docs, ns, root)
check_monitoring(docs, ns, root)
operations = one(docs, "PrometheusRule", "gpuguard")["spec"]["groups"]
yaml.safe_dump({"groups": operations}, open(f"{work}/operations-rules.yaml", "w"))
assert not find(load(f"{work}/default.yaml"), "ServiceMonitor") and not find(load(f"{work}/default.yaml"), "PrometheusRule")
assert not [d for d in load(f"{work}/default.yaml") if "audit" in d["metadata"]["name"] or d["kind"] == "CustomResourceDefinition"]
# For promtool: the rule's groups as a Prometheus rule file (the operator's own fields dropped), and each
# dashboard query as a recording rule, so that Prometheus's parser reads every expression the chart ships.
groups = one(docs, "PrometheusRule", "gpuguard-audit")["spec"]["groups"]
for g in groups:
    g.pop("partial_response_strategy", None)
yaml.safe_dump({"groups": groups}, open(f"{work}/audit-rules.yaml", "w"))
dashboard = json.loads(next(iter(one(docs, "ConfigMap", "gpuguard-audit-dashboard")["data"].values())))
queries = [{"record": f"gpuguard_dashboard:panel{p['id']}_{i}", "expr": t["expr"].replace("$__rate_interval", "5m")}
           for p in dashboard["panels"] for i, t in enumerate(p["targets"])]
assert queries
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": queries}]}, open(f"{work}/dashboard-rules.yaml", "w"))
# Every alert the chart ships has a promtool case where it fires, and one where nothing is scraped.
tests = yaml.safe_load(open(f"{root}/tests/manifests/alerts_test.yaml"))["tests"]
cases = [c for t in tests for c in t["alert_rule_test"]]
shipped = {r["alert"] for g in operations + groups for r in g["rules"] if "alert" in r}
firing = {c["alertname"] for c in cases if c["exp_alerts"]}
silent = {c["alertname"] for t in tests if not t["input_series"] for c in t["alert_rule_test"]}
assert shipped == firing == silent, ("alerts_test.yaml", sorted(shipped ^ firing), sorted(shipped ^ silent))
print("helm: the defaults, cert-manager, webhook-only, strict and audit render and hold")
PY

# Prometheus's checks: every rule and query parses, and no group repeats a rule (--lint=all).
"$promtool" check rules --lint=all --lint-fatal "$work/audit-rules.yaml" "$work/dashboard-rules.yaml" \
  "$work/operations-rules.yaml"
# And what every alert does, with its series present and absent (tests/manifests/alerts_test.yaml).
cp "$root/tests/manifests/alerts_test.yaml" "$work/"
"$promtool" test rules "$work/alerts_test.yaml"

# values.schema.json: a typo in a key, or a policy value the webhook would refuse, fails before anything is
# rendered, and a value the webhook takes is one the schema takes too. Every key's cases
# (tests/fixtures/policy-values/cases.json), each judged by the webhook's own parser and by the schema
# through helm, both wanting the outcome written there.
/usr/bin/python3 - "$root" "$webhook" "$helm" "$work" <<'PY'
import json, os, subprocess, sys
root, webhook, helm, work = sys.argv[1:5]
sys.path.insert(0, root + "/tests/manifests")
from checks import POLICY_KEYS
policy = json.load(open(root + "/charts/gpuguard/values.schema.json"))["properties"]["policy"]
assert set(policy["properties"]) == POLICY_KEYS and policy["additionalProperties"] is False, set(policy["properties"]) ^ POLICY_KEYS
cases = json.load(open(root + "/tests/fixtures/policy-values/cases.json"))
cases.pop("//")
assert set(cases) == POLICY_KEYS, set(cases) ^ POLICY_KEYS
os.makedirs(f"{work}/case", exist_ok=True)
failures, judged = [], 0
for key, outcomes in sorted(cases.items()):
    assert outcomes["accepted"] and outcomes["refused"], f"{key}: a case of each outcome"
    for outcome, values in outcomes.items():
        for value in values:
            for name in os.listdir(f"{work}/case"):
                os.remove(f"{work}/case/{name}")
            # The chart writes a boolean as its toString: true, false.
            open(f"{work}/case/{key}", "w").write(str(value).lower() if isinstance(value, bool) else value)
            webhook_says = "accepted" if subprocess.run(
                [webhook, "review", "--policy-dir", f"{work}/case", root + "/tests/fixtures/admission/mixed/review.json"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0 else "refused"
            json.dump({"policy": {key: value}}, open(f"{work}/case.yaml", "w"))  # JSON is YAML
            schema_says = "accepted" if subprocess.run(
                [helm, "template", "gpuguard", root + "/charts/gpuguard", "--namespace", "gpuguard-system", "-f", f"{work}/case.yaml"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0 else "refused"
            judged += 1
            if webhook_says != outcome or schema_says != outcome:
                failures.append(f"policy.{key}={value!r}: the schema says {schema_says}, the webhook {webhook_says}; want {outcome}")
assert not failures, "\n".join(failures)
print(f"values.schema.json: {judged} policy values judged as the webhook judges them")
PY
# A wrong key, type or enum anywhere is refused, and the refusal names where (the schema's path).
for case in "policy.mode=enforcing /policy/mode" "policy.privilegd=deny /policy" "webhook.failurePolicy=Fial /webhook/failurePolicy" \
    "devicePlugin.gpus=maybe /devicePlugin/gpus" "imageTag=x additional properties 'imageTag'" \
    "webhook.resources.limts.memory=1Gi /webhook/resources" "nodeEnforcer.nodeSelector.gpu=1 /nodeEnforcer/nodeSelector/gpu" \
    "monitoring.prometheusRule.labels.release=1 /monitoring/prometheusRule/labels/release" \
    "gpuInfrastructure[0]=gpu-operator/sa /gpuInfrastructure/0" "webhook.replicas=three /webhook/replicas" \
    "fullnameOverride=Bad_Name /fullnameOverride" "webhook.outage=admit /webhook/outage"; do
  bad="${case%% *}" where="${case#* }"
  if "$helm" lint --strict "$root/charts/gpuguard" --set "$bad" > "$work/bad.lint" 2>&1; then
    echo "helm lint --set $bad passed: values.schema.json should refuse it"; exit 1
  fi
  grep -qF "$where" "$work/bad.lint" || { cat "$work/bad.lint"; echo "helm lint --set $bad: the refusal does not name $where"; exit 1; }
done
echo "values.schema.json: typos refused, each naming its key"

# A disruption budget that keeps every replica would block every drain of their nodes: refused at render,
# naming the values; one that leaves a replica to evict renders.
for case in "webhook.replicas=1" "webhook.podDisruptionBudget.minAvailable=3" "webhook.podDisruptionBudget.minAvailable=100%" \
    "webhook.replicas=2,webhook.podDisruptionBudget.minAvailable=51%" \
    "schedulerExtender.enabled=true,schedulerExtender.replicas=1"; do
  if "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" --set "$case" > "$work/pdb.out" 2>&1; then
    echo "helm template --set $case rendered: a disruption budget that keeps every replica should be refused"; exit 1
  fi
  grep -q "podDisruptionBudget.minAvailable .* keeps all .* so no drain of their nodes could ever evict one" "$work/pdb.out" \
    || { cat "$work/pdb.out"; echo "helm template --set $case: the refusal does not say why"; exit 1; }
done
for case in "webhook.replicas=2" "webhook.podDisruptionBudget.minAvailable=50%" "webhook.replicas=2,webhook.podDisruptionBudget.minAvailable=50%"; do
  "$helm" template gpuguard "$root/charts/gpuguard" --namespace gpuguard-system --kube-version "$kube_version" --set "$case" > "$work/pdb.out" 2>&1 \
    || { cat "$work/pdb.out"; echo "helm template --set $case: refused, though it leaves a replica to evict"; exit 1; }
done
echo "disruption budgets: one that keeps every replica is refused at render"

# nameOverride and fullnameOverride name every object, whatever the release is called, and what refers to
# an object by name follows it: the webhook configuration its Service, the certificate's names that Service.
for case in "fullnameOverride=gpu-isolation gpu-isolation" "nameOverride=guard acme-guard" "nameOverride=acme acme"; do
  "$helm" template acme "$root/charts/gpuguard" --namespace ops --kube-version "$kube_version" --set "${case%% *}" \
    > "$work/names.yaml"
  /usr/bin/python3 - "$work/names.yaml" "${case#* }" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
prefix = sys.argv[2]
assert len(docs) > 20, len(docs)
stray = [(d["kind"], d["metadata"]["name"]) for d in docs if not d["metadata"]["name"].startswith(prefix)]
assert not stray, (prefix, stray)
[configuration] = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
service = configuration["webhooks"][0]["clientConfig"]["service"]
assert service == {**service, "name": prefix + "-webhook", "namespace": "ops"}, service
assert any(d["kind"] == "Service" and d["metadata"]["name"] == service["name"] for d in docs)
PY
done
echo "names: nameOverride and fullnameOverride name every object"

# What the strict values render is accepted by the binaries themselves.
"$webhook" review --policy-dir "$work/strict-policy" "$root/tests/fixtures/admission/mixed/review.json" > /dev/null
mapfile -t plugin_args < "$work/device-plugin.args"
"$device_plugin" --check-config --config-file "$work/device-plugin.yaml" "${plugin_args[@]}" > /dev/null

# Drift: the objects of the default install, from Helm and from kustomize, are the same where it matters.
/usr/bin/python3 - "$work" "$root" <<'PY'
import copy, os, re, sys, yaml
work, root = sys.argv[1:3]
def objects(path):
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(open(path)) if d}
# The chart armed at once (what an upgrade renders once the hook has armed it) against kustomize, whose
# README applies what refuses pods only after the rollout.
helm, kustomize = objects(f"{work}/armed.yaml"), objects(f"{work}/kustomize.yaml")
# Only in one of them: kustomize makes the namespace and publishes the CA in a Secret of its own; Helm
# keeps its CA (with its key, to sign certificates on upgrade) in gpuguard-ca.
only = {("Namespace", "gpuguard-system"), ("Secret", "gpuguard-webhook-ca"), ("Secret", "gpuguard-ca")}
# helm uninstall's node cleanup (post-delete hooks) is kustomize's manifests/uninstall, applied after the
# uninstall: the pod that runs forget-node on every node is the same where it matters, but that the chart's
# also removes its Node's condition (--node-name, with a token) and is ready only then (--ready-file).
hooks = {key for key, d in helm.items() if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "post-delete"}
assert {kind for kind, _ in hooks} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                                       "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                                       "DaemonSet", "Job"}, sorted(hooks)
cleanup = helm[("DaemonSet", "gpuguard-node-cleanup")]["spec"]["template"]["spec"]
uninstall = objects(f"{work}/kustomize-uninstall.yaml")[("DaemonSet", "gpuguard-node-cleanup")]["spec"]["template"]["spec"]
[chart_pod], [kustomize_pod] = cleanup["containers"], uninstall["containers"]
for field in ("command", "securityContext", "resources"):
    assert chart_pod[field] == kustomize_pod[field], (field, chart_pod[field], kustomize_pod[field])
assert uninstall["tolerations"] == [{"operator": "Exists"}]
assert cleanup["securityContext"] == uninstall["securityContext"]
host = lambda spec: [v["hostPath"] for v in spec["volumes"] if "hostPath" in v]
assert host(cleanup) == host(uninstall) == [{"path": "/", "type": "Directory"}]
[chart_host] = [m for m in chart_pod["volumeMounts"] if m["name"] == "host"]
[kustomize_host] = [m for m in kustomize_pod["volumeMounts"] if m["name"] == "host"]
assert chart_host == kustomize_host == {"name": "host", "mountPath": "/host", "mountPropagation": "HostToContainer"}
# The chart's: the GPU nodes, where its GPU DaemonSets ran, with their tolerations; the token's account
# may write its own Node's status alone (a policy as the device plugin's), and the Job has an account of its own.
enforcer_spec = helm[("DaemonSet", "gpuguard-node-enforcer")]["spec"]["template"]["spec"]
assert cleanup["affinity"] == enforcer_spec["affinity"] and cleanup["tolerations"] == enforcer_spec["tolerations"]
assert cleanup["nodeSelector"] == {"kubernetes.io/os": "linux"}
own = helm[("ValidatingAdmissionPolicy", "gpuguard-node-cleanup-own-node")]["spec"]
assert own["matchConditions"][0]["expression"].endswith("'system:serviceaccount:gpuguard-system:gpuguard-node-cleanup'")
plugin_own = helm[("ValidatingAdmissionPolicy", "gpuguard-device-plugin-own-node")]["spec"]
assert [v["expression"] for v in own["validations"]] == [v["expression"] for v in plugin_own["validations"]], own
assert helm[("ValidatingAdmissionPolicyBinding", "gpuguard-node-cleanup-own-node")]["spec"]["validationActions"] == ["Deny"]
wait_spec = helm[("Job", "gpuguard-node-cleanup-wait")]["spec"]["template"]["spec"]
assert wait_spec["serviceAccountName"] == "gpuguard-node-cleanup-wait"
assert [r["resources"] for r in helm[("Role", "gpuguard-node-cleanup-wait")]["rules"]] == [["daemonsets"], ["pods"]]
assert chart_pod["args"] == ["forget-node", "--wait", "--node-name=$(NODE_NAME)", "--host-root=/host",
                             "--ready-file=/run/forgotten/ready"], chart_pod["args"]
assert chart_pod["readinessProbe"]["exec"]["command"][2:] == chart_pod["args"][3:], chart_pod["readinessProbe"]
[wait] = helm[("Job", "gpuguard-node-cleanup-wait")]["spec"]["template"]["spec"]["containers"]
assert wait["command"] == ["/usr/local/bin/gpuguard-webhook", "await-rollout"] and \
    "--daemonset=gpuguard-node-cleanup" in wait["args"], wait
for key in hooks:
    del helm[key]
# The node enforcer exempts the chart's cleanup pods (should one still run as they start), which kustomize's
# enforcer, gone before manifests/uninstall is applied, has no entry for.
[enforcer] = helm[("DaemonSet", "gpuguard-node-enforcer")]["spec"]["template"]["spec"]["containers"]
cleanup_entry = ",gpuguard-system/gpuguard-node-cleanup:app.kubernetes.io/name=gpuguard-node-cleanup"
assert sum(cleanup_entry in arg for arg in enforcer["args"]) == 1, enforcer["args"]
enforcer["args"] = [arg.replace(cleanup_entry, "") for arg in enforcer["args"]]
assert set(helm) ^ set(kustomize) <= only, sorted(set(helm) ^ set(kustomize))

def comparable(d):
    d = copy.deepcopy(d)
    d["metadata"] = {}  # labels and annotations differ by design (Helm's own labels)
    if d["kind"] == "ValidatingAdmissionPolicy":
        # YAML libraries fold the multi-line CEL with different line breaks; CEL reads any whitespace alike.
        for item in d["spec"].get("variables", []) + d["spec"]["validations"]:
            for field in ("expression", "messageExpression"):
                if field in item:
                    item[field] = re.sub(r"\s+", " ", item[field]).strip()
    if d["kind"] == "MutatingWebhookConfiguration":
        for w in d["webhooks"]:
            w["clientConfig"].pop("caBundle", None)  # each install has its own CA
    if d["kind"] == "Secret":
        d["data"] = sorted(d["data"])  # certificates differ; the keys must not
        d["data"] = [k for k in d["data"] if k != "ca.crt"]
    for spec in [d.get("spec", {}).get("template", {}).get("spec")]:
        for c in (spec or {}).get("containers", []):
            c.pop("image", None)
            c.pop("imagePullPolicy", None)
            # The webhook's name for the chart's arm hook (and its pod's, from POD_NAME): kustomize has no
            # hook, and a name it said would be the same whatever namespace or prefix an overlay gives it, so
            # it says none.
            if "args" in c:
                c["args"] = [a for a in c["args"] if not a.startswith(("--instance=", "--replica="))]
            if "env" in c:
                c["env"] = [e for e in c["env"] if e["name"] != "POD_NAME"]
    return d
drift = [key for key in set(helm) & set(kustomize) if comparable(helm[key]) != comparable(kustomize[key])]
for key in drift:
    print("drift:", key)
    print("  helm:     ", yaml.safe_dump(comparable(helm[key]))[:2000])
    print("  kustomize:", yaml.safe_dump(comparable(kustomize[key]))[:2000])
assert not drift, drift
print(f"helm and kustomize agree on the {len(set(helm) & set(kustomize))} objects of the default install")

# The scheduler extender, from the cert-manager values (which enable it) and from its own kustomization.
helm = {k: v for k, v in objects(f"{work}/cert-manager.yaml").items() if "scheduler-extender" in k[1]}
kustomize = {k: v for k, v in objects(f"{work}/kustomize-extender.yaml").items() if k[0] != "Secret"}
assert set(helm) - {("Certificate", "gpuguard-scheduler-extender-tls")} == set(kustomize), sorted(set(helm) ^ set(kustomize))
drift = [key for key in kustomize if comparable(helm[key]) != comparable(kustomize[key])]
assert not drift, drift
print(f"helm and kustomize agree on the {len(kustomize)} objects of the scheduler extender")

# The audit controller, from audit.enabled=true and from manifests/audit.
helm = {k: v for k, v in objects(f"{work}/audit-enabled.yaml").items() if k[1] == "gpuguard-audit"}
kustomize = objects(f"{work}/kustomize-audit.yaml")
assert len(kustomize) == 7 and set(helm) == set(kustomize), sorted(set(helm) ^ set(kustomize))
drift = [key for key in kustomize if comparable(helm[key]) != comparable(kustomize[key])]
for key in drift:
    print("drift:", key, yaml.safe_dump(comparable(helm[key]))[:2000], yaml.safe_dump(comparable(kustomize[key]))[:2000])
assert not drift, drift
print(f"helm and kustomize agree on the {len(kustomize)} objects of the audit controller")

# The webhook alone: manifests/webhook-only is what the chart renders with the node's parts disabled
# (docs/operations.md says so), no object more or less.
helm, kustomize = objects(f"{work}/armed-webhook-only.yaml"), objects(f"{work}/kustomize-webhook-only.yaml")
assert set(helm) ^ set(kustomize) <= only, sorted(set(helm) ^ set(kustomize))
drift = [key for key in set(helm) & set(kustomize) if comparable(helm[key]) != comparable(kustomize[key])]
assert not drift, drift
print(f"helm and kustomize agree on the {len(set(helm) & set(kustomize))} objects of the webhook alone")

# manifests/monitoring is the chart's monitoring for the default install, the webhook's CA from
# manifests/default's Secret; and what it scrapes is there, with the alerts' series, as check_monitoring
# holds the chart's.
helm = {k: v for k, v in objects(f"{work}/armed-monitoring.yaml").items() if k[0] in ("ServiceMonitor", "PrometheusRule")}
kustomize = objects(f"{work}/kustomize-monitoring.yaml")
assert set(helm) == set(kustomize) and len(kustomize) == 4, sorted(set(helm) ^ set(kustomize))
webhook_monitor = kustomize[("ServiceMonitor", "gpuguard-webhook")]["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"]
assert webhook_monitor == {"name": "gpuguard-webhook-ca", "key": "ca.crt"}, webhook_monitor
helm[("ServiceMonitor", "gpuguard-webhook")]["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"]["name"] = "gpuguard-webhook-ca"
drift = [key for key in kustomize if comparable(helm[key]) != comparable(kustomize[key])]
assert not drift, drift
import sys as _sys
_sys.path.insert(0, f"{root}/tests/manifests")
from checks import check_monitoring
check_monitoring(list(objects(f"{work}/kustomize.yaml").values()) + list(kustomize.values()), "gpuguard-system", root, ca_suffix="-ca")
print(f"manifests/monitoring agrees with the chart's {len(kustomize)} monitoring objects")

# The break glass's leftovers of a kustomize install (operations.md): every object manifests/ makes outside
# the namespace, but the namespace itself and what refuses pods (which the break glass deleted).
import shlex
operations = open(f"{root}/docs/operations.md").read()
block = re.search(r"A kustomize install's carry no instance label.*?```sh\n(.*?)```", operations, re.S)[1]
documented = set()
for command in block.replace("\\\n", " ").splitlines():
    words = [w for w in shlex.split(command) if not w.startswith("--")]
    assert words[:2] == ["kubectl", "delete"], command
    kinds = {"clusterrole": "ClusterRole", "clusterrolebinding": "ClusterRoleBinding",
             "validatingadmissionpolicy": "ValidatingAdmissionPolicy",
             "validatingadmissionpolicybinding": "ValidatingAdmissionPolicyBinding"}
    documented |= {(kinds[k], name) for k in words[2].split(",") for name in words[3:]}
made = {(d["kind"], d["metadata"]["name"]) for path in ("kustomize", "kustomize-audit", "kustomize-extender")
        for d in yaml.safe_load_all(open(f"{work}/{path}.yaml")) if d and "namespace" not in d["metadata"]
        and d["kind"] != "Namespace" and d["metadata"].get("labels", {}).get("gpuguard.io/refuses-pods") != "true"}
assert documented == made, ("operations.md's kustomize leftovers", sorted(documented ^ made))
print(f"operations.md names the {len(made)} cluster-wide objects a kustomize install leaves")

# operations.md's list of the ci/ values files is the folder's.
import glob
listed = re.search(r"`charts/gpuguard/ci/` holds the values files the tests render \((.*?);", operations, re.S)[1]
listed = {name.strip() for name in listed.replace("\n", " ").split(",")}
present = {os.path.basename(p)[:-len("-values.yaml")] for p in glob.glob(f"{root}/charts/gpuguard/ci/*-values.yaml")}
assert listed == present, ("operations.md's ci/ values files", sorted(listed ^ present))

# Every rendering: a pod runs as a ServiceAccount the same rendering makes (the kubelet never creates a
# pod whose account is missing, and a DaemonSet then shows no pod and no error of its own).
import glob
renderings = [p for p in sorted(glob.glob(f"{work}/*.yaml")) if not p.endswith(("-rules.yaml", "alerts_test.yaml", "case.yaml", "device-plugin.yaml"))]
assert len(renderings) >= 10, renderings
for path in renderings:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    for d in docs:
        template = d.get("spec", {}).get("jobTemplate", d).get("spec", {}).get("template", {}).get("spec")
        if template is not None:
            account = template.get("serviceAccountName", "default")
            assert account == "default" or account in accounts, f"{path}: {d['kind']} {d['metadata']['name']} runs as {account}, which it does not make"
print("every pod of every rendering runs as an account its rendering makes")
PY

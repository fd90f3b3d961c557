#!/usr/bin/env bash
# Renders every kustomization offline: manifests/default (with fresh certificates) is checked for what the
# apiserver and the kubelet rely on, manifests/cert-manager for its Certificate and CA injection,
# manifests/scheduler-extender for its RBAC and for a kube-scheduler configuration that reaches it, and
# the shipped policy ConfigMap must be a policy gpuguard-webhook ($1) accepts. $2 is the pinned kustomize
# the build made from e2e/go.mod.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
webhook="$1"
kustomize="$2"
[ -x "$kustomize" ] || { echo "render_test.sh: no kustomize at '$kustomize' (the build makes it)"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$root/manifests/." "$work/"
rm -rf "$work/default/certs" "$work/scheduler-extender/certs"
"$root/certs/generate.sh" --out "$work/default/certs" >/dev/null
"$root/certs/generate.sh" --service gpuguard-scheduler-extender --out "$work/scheduler-extender/certs" >/dev/null
"$kustomize" build "$work/default" > "$work/rendered.yaml"
"$kustomize" build "$work/cert-manager" > "$work/cert-manager.yaml"
"$kustomize" build "$work/base" > /dev/null
"$kustomize" build "$work/device-plugin" > /dev/null
"$kustomize" build "$work/webhook-only" > "$work/webhook-only.yaml"
"$kustomize" build "$work/scheduler-extender" > "$work/scheduler-extender.yaml"
"$kustomize" build "$work/uninstall" > "$work/uninstall.yaml"

# manifests/uninstall: on every node, root with no capability and no token, forget-node until deleted, ready
# only while nothing of the plugin is left (the same command as its probe), in a namespace of its own that
# admits the hostPath of /.
/usr/bin/python3 - "$work/uninstall.yaml" "$root/tests/manifests" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from checks import load, one
docs = load(sys.argv[1])
assert sorted(d["kind"] for d in docs) == ["DaemonSet", "Namespace"]
namespace = one(docs, "Namespace", "gpuguard-uninstall")
assert namespace["metadata"]["labels"] == {"pod-security.kubernetes.io/enforce": "privileged"}
spec = one(docs, "DaemonSet", "gpuguard-node-cleanup")["spec"]["template"]["spec"]
[cleanup] = spec["containers"]
assert spec["tolerations"] == [{"operator": "Exists"}] and spec["automountServiceAccountToken"] is False
assert cleanup["command"] == ["/usr/local/bin/gpuguard-device-plugin"]
assert cleanup["args"] == ["forget-node", "--host-root=/host", "--wait"], cleanup["args"]
assert cleanup["readinessProbe"]["exec"]["command"] == cleanup["command"] + cleanup["args"][:-1]
assert cleanup["securityContext"]["capabilities"] == {"drop": ["ALL"]} and not cleanup["securityContext"]["allowPrivilegeEscalation"]
assert spec["volumes"] == [{"name": "host", "hostPath": {"path": "/", "type": "Directory"}}]
print("manifests/uninstall renders: a forget-node pod on every node")
PY

/usr/bin/python3 - "$work/scheduler-extender.yaml" "$work/scheduler-extender" "$root/docs/scheduler.md" "$root/tests/manifests" <<'PY'
import base64, sys, yaml
sys.path.insert(0, sys.argv[4])
from checks import load, one, check_extender, check_namespaces
docs = load(sys.argv[1])
kinds = sorted(d["kind"] for d in docs)
assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
                        "PodDisruptionBudget", "Secret"]), kinds
check_namespaces(docs, "gpuguard-system")
service, args = check_extender(docs, "gpuguard-system")
assert base64.b64decode(one(docs, "Secret")["data"]["tls.crt"]).decode() == open(sys.argv[2] + "/certs/tls.crt").read()

# The kube-scheduler configuration reaches that Service, path and certificate.
config = yaml.safe_load(open(sys.argv[2] + "/scheduler-config.yaml"))
assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1" and config["kind"] == "KubeSchedulerConfiguration"
[extender] = config["extenders"]
name = service["metadata"]["name"] + "." + service["metadata"]["namespace"] + ".svc"
assert extender["urlPrefix"] == "https://" + name + ":443" + args["url-prefix"], extender["urlPrefix"]
assert (extender["filterVerb"], extender["prioritizeVerb"]) == ("filter", "prioritize")
assert extender["enableHTTPS"] is True and extender["tlsConfig"]["serverName"] == name
assert extender["nodeCacheCapable"] is True and extender["ignorable"] is True and extender["httpTimeout"] == "5s"
assert 1 <= extender["weight"] <= 10
assert {r["name"] for r in extender["managedResources"]} == {"nvidia.com/gpu", "nvidia.com/gpu.shared"}
assert all(r["ignoredByScheduler"] is False for r in extender["managedResources"])
open(sys.argv[2] + "/server-name", "w").write(name)

native = yaml.safe_load(open(sys.argv[2] + "/native-most-allocated.yaml"))
[profile] = native["profiles"]
[fit] = profile["pluginConfig"]
assert fit["name"] == "NodeResourcesFit"
assert fit["args"]["scoringStrategy"] == {"type": "MostAllocated", "resources": [{"name": "nvidia.com/gpu", "weight": 1}]}
# docs/scheduler.md shows both files as they are.
guide = open(sys.argv[3]).read()
for shipped in ("scheduler-config.yaml", "native-most-allocated.yaml"):
    assert open(sys.argv[2] + "/" + shipped).read() in guide, "docs/scheduler.md does not show " + shipped + " as shipped"
print("manifests/scheduler-extender renders:", ", ".join(kinds))
PY
openssl verify -CAfile "$work/scheduler-extender/certs/ca.crt" \
  -verify_hostname "$(cat "$work/scheduler-extender/server-name")" "$work/scheduler-extender/certs/tls.crt" >/dev/null

/usr/bin/python3 - "$work/cert-manager.yaml" "$root/tests/manifests" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from checks import load, check_webhook
docs = load(sys.argv[1])
check_webhook(docs, "gpuguard-system", ["kube-system", "kube-node-lease", "gpu-operator", "nvidia-device-plugin", "dra-driver-nvidia-gpu", "nvidia-dra-driver-gpu"], cert_manager=True)
print("manifests/cert-manager renders:", ", ".join(sorted(d["kind"] for d in docs)))
PY

/usr/bin/python3 - "$work/rendered.yaml" "$work/default/certs/ca.crt" "$work/policy" "$root/tests/manifests" <<'PY'
import os, sys
sys.path.insert(0, sys.argv[4])
from checks import *
docs = load(sys.argv[1])
kinds = sorted(d["kind"] for d in docs)
assert kinds == sorted(["Namespace", "ServiceAccount", "ServiceAccount", "Secret", "Secret", "Service", "Service", "Deployment", "NetworkPolicy",
                        "ConfigMap", "PodDisruptionBudget", "MutatingWebhookConfiguration", "DaemonSet", "DaemonSet", "DaemonSet",
                        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole",
                        "ClusterRoleBinding", "ClusterRole", "ClusterRoleBinding",
                        # the pair that keeps the API servers watching the backstop's parameter
                        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                        # the device plugin's own-node policy
                        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                        # the trusted namespaces' guard and its creator role
                        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole",
                        # the ignored namespaces' guard and its labeller role
                        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole",
                        # the device plugins' metrics NetworkPolicy
                        "NetworkPolicy",
                        # the node enforcer's, its Role for the break-glass ConfigMap among them
                        "ServiceAccount", "Service", "DaemonSet", "ClusterRole", "ClusterRoleBinding", "Role",
                        "RoleBinding", "NetworkPolicy"]), kinds
check_namespaces(docs, "gpuguard-system")
policy = check_webhook(docs, "gpuguard-system", ["kube-system", "kube-node-lease", "gpu-operator", "nvidia-device-plugin", "dra-driver-nvidia-gpu", "nvidia-dra-driver-gpu"], ca=open(sys.argv[2]).read())
check_network_policy(docs)
check_backstop(docs, "gpuguard-system")
check_arming(docs, "gpuguard-system", armed=True)  # the README applies these two after the rollout
assert "--gpus=auto" in check_device_plugin(docs)
check_own_node_writes(docs)
assert check_host_devices(docs) == ["github.com/fuse=/dev/fuse:16"]
check_node_enforcer(docs, policy)
check_policy(policy)
# The ConfigMap's data as the kubelet would mount it: one file per key.
os.makedirs(sys.argv[3])
for key, value in policy.items():
    open(os.path.join(sys.argv[3], key), "w").write(value)
print("manifests render:", ", ".join(kinds))
PY

/usr/bin/python3 - "$work/rendered.yaml" "$work/webhook-only.yaml" <<'PY'
import sys, yaml
key = lambda d: (d["kind"], d["metadata"]["name"])
default = {key(d): d for d in yaml.safe_load_all(open(sys.argv[1])) if d}
alone = {key(d): d for d in yaml.safe_load_all(open(sys.argv[2])) if d}
# The device plugin with its node report, which runs as the plugin's account.
plugin = {("DaemonSet", "gpuguard-device-plugin"), ("DaemonSet", "gpuguard-host-devices"), ("ServiceAccount", "gpuguard-device-plugin"),
          ("DaemonSet", "gpuguard-node-report"), ("Service", "gpuguard-device-plugin-metrics"),
          ("ValidatingAdmissionPolicy", "gpuguard-device-plugin-own-node"),
          ("ValidatingAdmissionPolicyBinding", "gpuguard-device-plugin-own-node"),
          ("ClusterRole", "gpuguard-device-plugin"), ("ClusterRoleBinding", "gpuguard-device-plugin"),
          ("NetworkPolicy", "gpuguard-device-plugin")}
enforcer = {("DaemonSet", "gpuguard-node-enforcer"), ("ServiceAccount", "gpuguard-node-enforcer"),
            ("Service", "gpuguard-node-enforcer-metrics"), ("ClusterRole", "gpuguard-node-enforcer"),
            ("ClusterRoleBinding", "gpuguard-node-enforcer"), ("Role", "gpuguard-node-enforcer"),
            ("RoleBinding", "gpuguard-node-enforcer"), ("NetworkPolicy", "gpuguard-node-enforcer")}
assert set(default) - set(alone) == plugin | enforcer and set(alone) <= set(default), sorted(set(default) ^ set(alone))
assert all(alone[k] == default[k] for k in alone)  # the webhook itself exactly as in the default install
print("manifests/webhook-only renders manifests/default without the device plugin, its node report and the node enforcer")
PY

"$webhook" review --policy-dir "$work/policy" "$root/tests/fixtures/admission/mixed/review.json" > "$work/review.json"
/usr/bin/python3 - "$work/review.json" <<'PY'
import json, sys
reviewed = json.load(open(sys.argv[1]))
assert reviewed["review"]["response"]["allowed"] is True
assert len(reviewed["patch"]) == 4, reviewed["patch"]  # the shipped policy behaves as the defaults do
print("the shipped policy ConfigMap is accepted and behaves as the defaults")
PY

# manifests/cri-o: a component that turns the host's / recursively read-only off, and nothing else.
mkdir -p "$work/cri-o-overlay"
printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../default]\ncomponents: [../cri-o]\n' \
  > "$work/cri-o-overlay/kustomization.yaml"
"$kustomize" build "$work/cri-o-overlay" > "$work/cri-o.yaml"
/usr/bin/python3 - "$work/rendered.yaml" "$work/cri-o.yaml" <<'PY'
import sys
import yaml
default, crio = ([d for d in yaml.safe_load_all(open(path)) if d] for path in sys.argv[1:3])
def host_mounts(docs):
    return {d["metadata"]["name"]: [m for c in d["spec"]["template"]["spec"]["containers"]
                                    for m in c.get("volumeMounts", []) if m["mountPath"] == "/host"]
            for d in docs if d["kind"] == "DaemonSet"}
before, after = host_mounts(default), host_mounts(crio)
changed = {name for name in before if before[name]}
assert changed == {"gpuguard-device-plugin", "gpuguard-node-report", "gpuguard-node-enforcer"}, changed
for name in changed:
    assert [m["recursiveReadOnly"] for m in before[name]] == ["IfPossible"], before[name]
    assert after[name] == [dict(before[name][0], recursiveReadOnly="Disabled")], after[name]
for doc in crio:
    doc_default = next(d for d in default if d["kind"] == doc["kind"] and d["metadata"].get("name") == doc["metadata"].get("name")
                       and d["metadata"].get("namespace") == doc["metadata"].get("namespace"))
    if doc["metadata"].get("name") not in changed:
        assert doc == doc_default, doc["metadata"]
assert len(crio) == len(default)
print("manifests/cri-o turns the host's / recursively read-only off in the three DaemonSets that mount it, and changes nothing else")
PY

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

/usr/bin/python3 - "$work/scheduler-extender.yaml" "$work/scheduler-extender" "$root/docs/scheduler.md" <<'PY'
import base64, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = sorted(d["kind"] for d in docs)
assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
                        "PodDisruptionBudget", "Secret"]), kinds
def one(kind):
    return next(d for d in docs if d["kind"] == kind)
# Read-only access to pods and nodes, and nothing more.
assert one("ClusterRole")["rules"] == [{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]
binding = one("ClusterRoleBinding")
assert binding["roleRef"]["name"] == one("ClusterRole")["metadata"]["name"]
assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuguard-scheduler-extender", "namespace": "gpuguard-system"}]
pod = one("Deployment")["spec"]["template"]["spec"]
container = pod["containers"][0]
assert pod["serviceAccountName"] == "gpuguard-scheduler-extender" and pod["automountServiceAccountToken"] is True
assert container["command"] == ["/usr/local/bin/gpuguard-scheduler-extender"]
args = dict(a[2:].split("=", 1) for a in container["args"])
assert args["url-prefix"] == "/scheduler" and args["listen-address"] == "0.0.0.0:8443"
assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
sc = container["securityContext"]
assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
assert pod["securityContext"]["runAsNonRoot"] is True
assert pod["terminationGracePeriodSeconds"] > float(args["shutdown-timeout"])
volumes = {v["name"]: v for v in pod["volumes"]}
assert volumes["policy"]["configMap"] == {"name": "gpuguard-policy", "optional": True}
assert volumes["tls"]["secret"]["secretName"] == one("Secret")["metadata"]["name"]
assert base64.b64decode(one("Secret")["data"]["tls.crt"]).decode() == open(sys.argv[2] + "/certs/tls.crt").read()
service = one("Service")
assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https"}]

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

/usr/bin/python3 - "$work/cert-manager.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = sorted(d["kind"] for d in docs)
assert "Secret" not in kinds, "cert-manager makes the Secret"
webhook_cfg = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
assert webhook_cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "gpuguard-system/gpuguard-webhook-tls"
assert "caBundle" not in webhook_cfg["webhooks"][0]["clientConfig"]
serving = next(d for d in docs if d["kind"] == "Certificate" and d["metadata"]["name"] == "gpuguard-webhook-tls")["spec"]
assert serving["secretName"] == "gpuguard-webhook-tls"
assert "gpuguard-webhook.gpuguard-system.svc" in serving["dnsNames"]
assert serving["privateKey"] == {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"}
pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
assert any(v.get("secret", {}).get("secretName") == "gpuguard-webhook-tls" for v in pod["volumes"])
print("manifests/cert-manager renders:", ", ".join(kinds))
PY

/usr/bin/python3 - "$work/rendered.yaml" "$work/default/certs/ca.crt" "$work/policy" <<'PY'
import base64, os, sys, yaml

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
ca = open(sys.argv[2]).read()
kinds = sorted(d["kind"] for d in docs)
cluster_scoped = {"Namespace", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                  "ClusterRole", "ClusterRoleBinding"}
assert kinds == sorted(["Namespace", "ServiceAccount", "ServiceAccount", "Secret", "Secret", "Service", "Deployment",
                        "ConfigMap", "PodDisruptionBudget", "MutatingWebhookConfiguration", "DaemonSet", "DaemonSet",
                        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole",
                        "ClusterRoleBinding"]), kinds
def one(kind, name=None):
    return next(d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"]))
for d in docs:
    if d["kind"] in cluster_scoped:
        assert "namespace" not in d["metadata"], d["metadata"]
    else:
        assert d["metadata"].get("namespace") == "gpuguard-system", d["metadata"]

policy_doc, binding = one("ValidatingAdmissionPolicy"), one("ValidatingAdmissionPolicyBinding")
assert policy_doc["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
assert policy_doc["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
assert binding["spec"]["policyName"] == policy_doc["metadata"]["name"]
assert binding["spec"]["paramRef"]["name"] == "gpuguard-policy" and binding["spec"]["paramRef"]["namespace"] == "gpuguard-system"
assert binding["spec"]["validationActions"] == ["Deny"]

webhook = one("MutatingWebhookConfiguration")["webhooks"][0]
assert base64.b64decode(webhook["clientConfig"]["caBundle"]).decode() == ca, "caBundle is not the generated CA"
assert webhook["clientConfig"]["service"] == {"name": "gpuguard-webhook", "namespace": "gpuguard-system",
                                              "path": "/mutate", "port": 443}
assert webhook["admissionReviewVersions"] == ["v1", "v1beta1"]
for key, value in {"failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded", "sideEffects": "None",
                   "timeoutSeconds": 5, "matchPolicy": "Equivalent"}.items():
    assert webhook[key] == value, key
rules = {(tuple(r["operations"]), tuple(r["resources"])) for r in webhook["rules"]}
assert rules == {(("CREATE",), ("pods",)), (("UPDATE",), ("pods/ephemeralcontainers",))}, rules
excluded = webhook["namespaceSelector"]["matchExpressions"][0]
assert excluded["operator"] == "NotIn" and set(excluded["values"]) == {"kube-system", "kube-node-lease", "gpuguard-system"}
assert binding["spec"]["matchResources"]["namespaceSelector"] == webhook["namespaceSelector"]  # same coverage

# The webhook reads DRA claims and templates, and nothing else.
assert one("ClusterRole")["rules"] == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"],
                                        "verbs": ["get", "list", "watch"]}]
assert one("ClusterRoleBinding")["subjects"] == [{"kind": "ServiceAccount", "name": "gpuguard-webhook", "namespace": "gpuguard-system"}]
assert one("ClusterRoleBinding")["roleRef"]["name"] == one("ClusterRole")["metadata"]["name"]

deployment = one("Deployment")["spec"]
pod = deployment["template"]["spec"]
container = pod["containers"][0]
assert deployment["replicas"] >= 2
assert pod["priorityClassName"] == "system-cluster-critical"
assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
sc = container["securityContext"]
assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
assert container["readinessProbe"]["httpGet"]["path"] == "/readyz" and container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
assert "--policy-dir=/etc/gpuguard/policy" in container["args"]
assert pod["terminationGracePeriodSeconds"] > 25  # above --shutdown-timeout
assert any(v.get("configMap", {}).get("name") == "gpuguard-policy" for v in pod["volumes"])

# The GPU plugin: on GPU nodes as NVIDIA's chart finds them, GPUs only, NVML also on a hardened node.
daemonset = one("DaemonSet", "gpuguard-device-plugin")["spec"]["template"]["spec"]
plugin = daemonset["containers"][0]
assert daemonset["priorityClassName"] == "system-node-critical"
assert "nodeSelector" not in daemonset
terms = daemonset["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
assert [t["matchExpressions"] for t in terms] == [
    [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}],
    [{"key": "feature.node.kubernetes.io/cpu-model.vendor_id", "operator": "In", "values": ["NVIDIA"]}],
    [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]], terms
assert any(t["key"] == "nvidia.com/gpu" for t in daemonset["tolerations"])
assert "--host-root=/host" in plugin["args"] and "--discovery=auto" in plugin["args"]
assert not any(a.startswith("--host-device") for a in plugin["args"])
mounts = {m["mountPath"]: m.get("readOnly", False) for m in plugin["volumeMounts"]}
assert mounts["/var/lib/kubelet/device-plugins"] is False
assert mounts["/host/dev"] is True and mounts["/host/proc/driver/nvidia"] is True
all_gpus = next(m["name"] for m in plugin["volumeMounts"] if m["mountPath"] == "/var/run/nvidia-container-devices/all")
assert next(v for v in daemonset["volumes"] if v["name"] == all_gpus)["hostPath"] == {"path": "/dev/null", "type": "CharDevice"}
assert not plugin["securityContext"].get("privileged", False)
paths = {v["hostPath"]["path"] for v in daemonset["volumes"]}
assert {"/var/lib/kubelet/device-plugins", "/dev", "/proc/driver/nvidia"} <= paths

# Host devices on every node, with no GPU resource of their own.
hosts = one("DaemonSet", "gpuguard-host-devices")["spec"]["template"]["spec"]
devices = hosts["containers"][0]
assert hosts["tolerations"] == [{"operator": "Exists"}] and "affinity" not in hosts and "nodeSelector" not in hosts
assert "--discovery=none" in devices["args"] and "--host-device=github.com/fuse=/dev/fuse:16" in devices["args"]
for spec in (daemonset, hosts):
    probe = spec["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz" and "--metrics-address=0.0.0.0:8080" in spec["containers"][0]["args"]
    sc = spec["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"] and not sc.get("privileged", False)

# The ConfigMap's data as the kubelet would mount it: one file per key, every key present.
policy = one("ConfigMap")["data"]
assert set(policy) == {"mode", "visibleDevicesValue", "gpuResources", "gpuAnnotations", "gpuDeviceClasses",
                       "exemptNamespaces", "exemptServiceAccounts", "privileged", "hostDeviceMounts", "cdiAnnotations",
                       "runtimeClasses", "runtimeClassAction", "stripUserValueFromGpuContainers"}, set(policy)
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
plugin = {("DaemonSet", "gpuguard-device-plugin"), ("DaemonSet", "gpuguard-host-devices"), ("ServiceAccount", "gpuguard-device-plugin")}
assert set(default) - set(alone) == plugin and set(alone) <= set(default), sorted(set(default) ^ set(alone))
assert all(alone[k] == default[k] for k in alone)  # the webhook itself exactly as in the default install
print("manifests/webhook-only renders manifests/default without the device plugin")
PY

"$webhook" review --policy-dir "$work/policy" "$root/tests/fixtures/admission/mixed/review.json" > "$work/review.json"
/usr/bin/python3 - "$work/review.json" <<'PY'
import json, sys
reviewed = json.load(open(sys.argv[1]))
assert reviewed["review"]["response"]["allowed"] is True
assert len(reviewed["patch"]) == 4, reviewed["patch"]  # the shipped policy behaves as the defaults do
print("the shipped policy ConfigMap is accepted and behaves as the defaults")
PY

"""What every rendering of gpuguard must hold, whether kustomize (render_test.sh) or Helm (helm_test.sh)
made it: the webhook, its configuration, the backstop, the RBAC, the device plugin DaemonSets and the
scheduler extender, each checked for what the apiserver, the kubelet and the security model rely on.
One place for these checks, so that both renderings are held to the same ones."""
import base64
import re
import yaml

CLUSTER_SCOPED = {"Namespace", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
# Series the alerts read that Kubernetes exports, not gpuguard: the API server's account of its webhook calls.
# The API server's own series, and kube-state-metrics' (which most clusters scrape).
KUBERNETES_SERIES = {"apiserver_admission_webhook_fail_open_count", "apiserver_admission_webhook_rejection_count",
                     "kube_deployment_status_replicas_available", "kube_daemonset_status_number_unavailable",
                     "kube_node_status_capacity", "kube_node_labels", "kube_pod_info"}
# The namespace label by which an admin opts a namespace out of the webhook and the backstop.
IGNORE_LABEL = "gpuguard.io/ignore"

POLICY_KEYS = {"mode", "visibleDevicesValue", "gpuResources", "gpuAnnotations", "gpuDeviceClasses",
               "exemptNamespaces", "exemptServiceAccounts", "privileged", "hostDeviceMounts", "cdiAnnotations",
               "nvidiaCdiAnnotations", "featureEnvVars", "runtimeClasses", "runtimeClassAction",
               "stripUserValueFromGpuContainers", "sharedGpuResources", "sharingEnvVars", "nodeEnforcement", "nodeEnforcementExemptNamespaces",
               "nodeEnforcementExemptServiceAccounts", "nodeEnforcementUnknown", "nriTolerationAnnotation"}


def load(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]


def find(docs, kind, name=None):
    return [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]


def one(docs, kind, name=None):
    found = find(docs, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} objects"
    return found[0]


def check_namespaces(docs, namespace):
    """Everything in the install's namespace, but the arm hook's probe RBAC, in the namespace it probes
    (check_arming)."""
    for d in docs:
        if d["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in d["metadata"], d["metadata"]
        elif d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"] == "gpuguard-arm-probe":
            assert d["metadata"]["namespace"] != namespace, d["metadata"]
        elif d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"] == "gpuguard-arm-apiservers":
            assert d["metadata"]["namespace"] == "default", d["metadata"]
        else:
            assert d["metadata"].get("namespace") == namespace, d["metadata"]


def check_hardened(pod, container, non_root=True):
    """No privilege, nothing writable in the image, no capabilities."""
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, sc
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc.get("privileged", False), sc
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    if non_root:
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532


def check_webhook(docs, namespace, excluded, ca=None, cert_manager=False, failure_policy="Fail",
                  resource_claims=True, admission_switches=True):
    """The webhook Deployment, Service and configuration. `ca`: the PEM its caBundle must hold."""
    configuration = one(docs, "MutatingWebhookConfiguration")
    webhook = configuration["webhooks"][0]
    service = one(docs, "Service", "gpuguard-webhook")
    assert webhook["clientConfig"]["service"] == {"name": service["metadata"]["name"], "namespace": namespace,
                                                  "path": "/mutate", "port": 443}
    if cert_manager:
        assert "caBundle" not in webhook["clientConfig"]
        assert configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == namespace + "/gpuguard-webhook-tls"
        serving = one(docs, "Certificate", "gpuguard-webhook-tls")["spec"]
        assert serving["secretName"] == "gpuguard-webhook-tls"
        assert "gpuguard-webhook." + namespace + ".svc" in serving["dnsNames"]
        assert serving["privateKey"] == {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"}
        assert not find(docs, "Secret", "gpuguard-webhook-tls"), "cert-manager makes the Secret"
    elif ca is not None:
        assert base64.b64decode(webhook["clientConfig"]["caBundle"]).decode() == ca, "caBundle is not the CA"
    assert webhook["admissionReviewVersions"] == ["v1", "v1beta1"]
    for key, value in {"failurePolicy": failure_policy, "reinvocationPolicy": "IfNeeded", "sideEffects": "None",
                       "timeoutSeconds": 5, "matchPolicy": "Equivalent"}.items():
        assert webhook[key] == value, (key, webhook[key])
    rules = {(tuple(r["operations"]), tuple(r["resources"])) for r in webhook["rules"]}
    assert rules == {(("CREATE",), ("pods",)), (("UPDATE",), ("pods/ephemeralcontainers",))}, rules
    expression, ignored = webhook["namespaceSelector"]["matchExpressions"]
    assert ignored == {"key": IGNORE_LABEL, "operator": "DoesNotExist"}, ignored
    assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
    assert set(expression["values"]) == set(excluded) | {namespace}, expression

    deployment = one(docs, "Deployment", "gpuguard-webhook")["spec"]
    pod = deployment["template"]["spec"]
    [container] = pod["containers"]
    assert deployment["replicas"] >= 2
    assert deployment["selector"]["matchLabels"].items() <= deployment["template"]["metadata"]["labels"].items()
    assert service["spec"]["selector"] == deployment["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    check_hardened(pod, container)
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    args = dict(a[2:].split("=", 1) for a in container["args"])
    assert args["policy-dir"] == "/etc/gpuguard/policy" and args["listen-address"] == "0.0.0.0:8443"
    assert pod["terminationGracePeriodSeconds"] > float(args["shutdown-timeout"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["policy"]["configMap"]["name"] == "gpuguard-policy"
    assert volumes["tls"]["secret"]["secretName"] == "gpuguard-webhook-tls"
    # Sized from its own memory limit, through the downward API.
    assert args["memory-limit"] == "$(MEMORY_LIMIT)" and int(args["threads"]) >= 1
    [memory] = [e for e in container["env"] if e["name"] == "MEMORY_LIMIT"]
    assert memory["valueFrom"]["resourceFieldRef"] == {"containerName": container["name"], "resource": "limits.memory"}
    assert container["resources"]["limits"]["memory"]
    budget = one(docs, "PodDisruptionBudget", "gpuguard-webhook")["spec"]
    assert budget["minAvailable"] >= 1 and budget["selector"] == deployment["selector"]

    # It reads the namespaces (selected by gpuguard.io/ignore), its own configuration, the backstop's
    # binding and policy and the keeper's pair by name, which its flags name, and DRA claims and templates, and nothing else; with
    # the switches off, not the first three; with the lookups off, not the claims; with both off, nothing
    # (no token, no ClusterRole).
    bindings = [b for b in find(docs, "ValidatingAdmissionPolicyBinding")
                if b["metadata"].get("labels", {}).get("gpuguard.io/refuses-pods") == "true"]
    rules = []
    if admission_switches:
        assert args["webhook-configuration"] == configuration["metadata"]["name"]
        backstop = bindings[0]["metadata"]["name"] if bindings else None
        assert args.get("backstop-binding") == backstop, args
        assert args.get("backstop-policy") == (bindings[0]["spec"]["policyName"] if bindings else None), args
        # The pair that keeps the backstop's parameter watched: a binding without the break glass's label,
        # of the policy of its own name.
        keepers = [b for b in find(docs, "ValidatingAdmissionPolicyBinding") if b["metadata"]["name"].endswith(
            "-keep-configmap-params")]
        keeper = keepers[0]["metadata"]["name"] if keepers else None
        assert args.get("parameter-keeper") == keeper and (not keepers or keepers[0]["spec"]["policyName"] == keeper), args
        rules += [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
                  {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
                   "resourceNames": [configuration["metadata"]["name"]], "verbs": ["list", "watch"]}]
        if bindings:
            assert bindings[0]["spec"]["policyName"] == backstop
            rules.append({"apiGroups": ["admissionregistration.k8s.io"],
                          "resources": ["validatingadmissionpolicybindings", "validatingadmissionpolicies"],
                          "resourceNames": [backstop] + ([keeper] if keeper else []), "verbs": ["list", "watch"]})
    else:
        assert args.get("admission-switches") == "off" and "webhook-configuration" not in args, args
    if resource_claims:
        rules.append({"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"],
                      "verbs": ["list", "watch"]})
    else:
        assert args.get("resource-claims") == "off"
    assert pod["automountServiceAccountToken"] is bool(rules)
    if rules:
        assert one(docs, "ClusterRole", "gpuguard-webhook")["rules"] == rules, one(docs, "ClusterRole", "gpuguard-webhook")
        binding = one(docs, "ClusterRoleBinding", "gpuguard-webhook")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": namespace}]
        assert binding["roleRef"]["name"] == "gpuguard-webhook"
    else:
        assert not find(docs, "ClusterRole", "gpuguard-webhook") and not find(docs, "ClusterRoleBinding", "gpuguard-webhook")
    check_trusted_namespaces(docs, webhook)
    return one(docs, "ConfigMap", "gpuguard-policy")["data"]


def check_trusted_namespaces(docs, webhook):
    """Every namespace the webhook does not look at can be created only with create on
    trustednamespaces.gpuguard.io, by name (cluster-admin's wildcard): the same list in the policy's
    condition, the creator role and the webhook's namespaceSelector, and the binding denies."""
    [selector] = [e["values"] for e in webhook["namespaceSelector"]["matchExpressions"]
                  if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
    policy = one(docs, "ValidatingAdmissionPolicy", "gpuguard-trusted-namespaces")["spec"]
    assert policy["failurePolicy"] == "Fail"
    assert policy["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["namespaces"]}]
    [condition] = policy["matchConditions"]
    listed = re.fullmatch(r"object\.metadata\.name in \[(.*)\]", condition["expression"].strip())[1]
    assert [n.strip().strip("'") for n in listed.split(",")] == selector, (listed, selector)
    check_authorizer_guard(docs, policy, "gpuguard-trusted-namespaces", "trustednamespaces")
    assert one(docs, "ClusterRole", "gpuguard-trusted-namespaces-creator")["rules"] == [
        {"apiGroups": ["gpuguard.io"], "resources": ["trustednamespaces"], "resourceNames": selector, "verbs": ["create"]}]

    # The opt-out: a namespace labelled gpuguard.io/ignore is out of the webhook's selector and the
    # backstop's, and adding that label (at creation or later), or changing its value (the break glass is
    # taken off by its value), takes create on ignorednamespaces.gpuguard.io.
    for backstop in find(docs, "ValidatingAdmissionPolicyBinding", "gpuguard-visible-devices"):
        assert backstop["spec"]["matchResources"]["namespaceSelector"] == webhook["namespaceSelector"]
    policy = one(docs, "ValidatingAdmissionPolicy", "gpuguard-ignored-namespaces")["spec"]
    assert policy["failurePolicy"] == "Fail"
    assert policy["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["namespaces", "namespaces/status", "namespaces/finalize"]}]
    [condition] = policy["matchConditions"]
    assert re.sub(r"\s+", "", condition["expression"]) == (
        f"has(object.metadata.labels)&&'{IGNORE_LABEL}'inobject.metadata.labels&&(request.operation=='CREATE'"
        f"||!has(oldObject.metadata.labels)||!('{IGNORE_LABEL}'inoldObject.metadata.labels)"
        f"||oldObject.metadata.labels['{IGNORE_LABEL}']!=object.metadata.labels['{IGNORE_LABEL}'])"), condition
    check_authorizer_guard(docs, policy, "gpuguard-ignored-namespaces", "ignorednamespaces")
    assert one(docs, "ClusterRole", "gpuguard-ignored-namespaces-labeller")["rules"] == [
        {"apiGroups": ["gpuguard.io"], "resources": ["ignorednamespaces"], "verbs": ["create"]}]


def check_authorizer_guard(docs, policy, name, virtual_resource):
    """A namespace guard's one validation: the authorizer's `create` on `virtual_resource`.gpuguard.io for the
    namespace's name, and its binding denying."""
    [validation] = policy["validations"]
    assert re.sub(r"\s+", "", validation["expression"]) == (
        f"authorizer.group('gpuguard.io').resource('{virtual_resource}').name(object.metadata.name).check('create').allowed()")
    binding = one(docs, "ValidatingAdmissionPolicyBinding", name)["spec"]
    assert binding == {"policyName": name, "validationActions": ["Deny"]}, binding


def check_policy(data):
    assert set(data) == POLICY_KEYS, set(data) ^ POLICY_KEYS
    assert all(isinstance(v, str) for v in data.values()), data


def check_backstop(docs, namespace, actions=("Deny",)):
    """The admission policy, parameterised by the policy ConfigMap, over the webhook's namespaces."""
    policy = one(docs, "ValidatingAdmissionPolicy", "gpuguard-visible-devices")
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "gpuguard-visible-devices")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["paramRef"] == {"name": "gpuguard-policy", "namespace": namespace,
                                           "parameterNotFoundAction": "Deny"}
    assert binding["spec"]["validationActions"] == list(actions), binding["spec"]["validationActions"]
    webhook = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == webhook["namespaceSelector"]  # same coverage
    # The pair that keeps the API servers watching ConfigMaps as parameters while that binding is gone: a binding
    # of a ConfigMap-parameterised policy that matches no request and carries no break-glass label.
    keeper = one(docs, "ValidatingAdmissionPolicy", "gpuguard-keep-configmap-params")["spec"]
    keeper_binding = one(docs, "ValidatingAdmissionPolicyBinding", "gpuguard-keep-configmap-params")
    assert keeper["paramKind"] == policy["spec"]["paramKind"] and keeper["validations"] == [{"expression": "true"}]
    assert [(r["apiGroups"], r["resources"]) for r in keeper["matchConstraints"]["resourceRules"]] == [
        (["gpuguard.io"], ["paramwatchkeepers"])], keeper["matchConstraints"]
    assert "gpuguard.io/refuses-pods" not in keeper_binding["metadata"].get("labels", {})
    assert keeper_binding["spec"] == {"policyName": "gpuguard-keep-configmap-params", "validationActions": ["Audit"],
                                      "paramRef": dict(binding["spec"]["paramRef"], parameterNotFoundAction="Allow")}


def check_arming(docs, namespace, armed, webhook=True, backstop=True, probe="default"):
    """What refuses pods carries the break-glass label. Armed: refusing at once, no hook. Not armed: the webhook
    configuration at Ignore and the binding at Warn and Audit (`webhook`, `backstop`: those the hook arms), and a
    post-install hook Job that arms them once a dry-run pod in `probe` comes back as the webhook answers, with
    RBAC for those two objects by name, the webhook's Deployment, its Events, and pods created in `probe`, and
    nothing else."""
    refusing = [d for d in docs if d["metadata"].get("labels", {}).get("gpuguard.io/refuses-pods") == "true"]
    has_backstop = bool(find(docs, "ValidatingAdmissionPolicyBinding", "gpuguard-visible-devices"))
    assert sorted(d["kind"] for d in refusing) == ["MutatingWebhookConfiguration"] + (
        ["ValidatingAdmissionPolicyBinding"] if has_backstop else []), refusing
    jobs = find(docs, "Job", "gpuguard-arm")
    if armed:
        assert not jobs and not find(docs, "ClusterRole", "gpuguard-arm")
        return
    if webhook:
        assert one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Ignore"
    if backstop:
        assert one(docs, "ValidatingAdmissionPolicyBinding", "gpuguard-visible-devices")["spec"]["validationActions"] == ["Warn", "Audit"]
    [job] = jobs
    # post-rollback: a rollback re-applies a revision's manifest, admitting if that revision armed by hook.
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade,post-rollback"
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    check_hardened(pod, container)
    assert container["command"] == ["/usr/local/bin/gpuguard-webhook", "arm"]
    args = dict(a[2:].split("=", 1) for a in container["args"] if "=" in a)
    want = {"namespace": namespace, "deployment": "gpuguard-webhook", "timeout": args["timeout"]}
    if webhook:
        want["webhook-configuration"] = "gpuguard"
    if backstop:
        want["backstop-binding"] = "gpuguard-visible-devices"
    if probe:
        want["probe-namespace"] = probe
        want["probe-image"] = container["image"]
        want["service"] = "gpuguard-webhook"  # the webhook's Service: each of its ready endpoints must answer
    # Through each API server in turn, where it probes.
    assert [a for a in container["args"] if "=" not in a] == (["--each-apiserver"] if probe else []), container["args"]
    assert args == want, args
    if probe:
        # The probe is armed on by the name the webhook says to it: its --instance must be the one the hook
        # expects, --namespace/--deployment.
        [webhook_container] = one(docs, "Deployment", "gpuguard-webhook")["spec"]["template"]["spec"]["containers"]
        assert f"--instance={args['namespace']}/{args['deployment']}" in webhook_container["args"], webhook_container["args"]
        # Each replica names its pod, by which the hook tells the Service's endpoints apart.
        assert "--replica=$(POD_NAME)" in webhook_container["args"], webhook_container["args"]
        assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in webhook_container["env"]
        assert one(docs, "Service", "gpuguard-webhook")["metadata"]["namespace"] == namespace
    probe_roles = [d for d in find(docs, "Role", "gpuguard-arm-probe")]
    if probe:
        [role] = probe_roles
        assert role["metadata"]["namespace"] == probe
        # Only while the hook runs: made before the Job, deleted once it is done either way.
        for d in (role, one(docs, "RoleBinding", "gpuguard-arm-probe")):
            assert d["metadata"]["annotations"] == {
                "helm.sh/hook": "post-install,post-upgrade,post-rollback", "helm.sh/hook-weight": "-1",
                "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded,hook-failed"}, d["metadata"]
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}], role["rules"]
        binding = one(docs, "RoleBinding", "gpuguard-arm-probe")
        assert binding["metadata"]["namespace"] == probe
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpuguard-arm-probe"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuguard-arm", "namespace": namespace}]
        # The API servers the probe goes through in turn: the kubernetes Service's endpoints, in default, for
        # the hook's life too.
        role = one(docs, "Role", "gpuguard-arm-apiservers")
        binding = one(docs, "RoleBinding", "gpuguard-arm-apiservers")
        for d in (role, binding):
            assert d["metadata"]["namespace"] == "default" and d["metadata"]["annotations"] == {
                "helm.sh/hook": "post-install,post-upgrade,post-rollback", "helm.sh/hook-weight": "-1",
                "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded,hook-failed"}, d["metadata"]
        assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                                  "resourceNames": ["kubernetes"], "verbs": ["get"]}], role["rules"]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpuguard-arm-apiservers"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuguard-arm", "namespace": namespace}]
    else:
        assert not probe_roles and not find(docs, "RoleBinding", "gpuguard-arm-probe")
        assert not find(docs, "Role", "gpuguard-arm-apiservers")
    assert pod["serviceAccountName"] == "gpuguard-arm" and pod["automountServiceAccountToken"] is True
    # The policy ConfigMap too, where a binding is armed: the API server lets only a user who may read a binding's
    # parameter change the binding.
    assert one(docs, "Role", "gpuguard-arm")["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["gpuguard-webhook"], "verbs": ["get"]}] + (
        [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["gpuguard-policy"], "verbs": ["get"]}]
        if find(docs, "ValidatingAdmissionPolicyBinding", "gpuguard-visible-devices") else []) + (
        [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}] if probe else []) + [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert one(docs, "ClusterRole", "gpuguard-arm")["rules"] == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
         "resourceNames": ["gpuguard"], "verbs": ["get", "patch"]},
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicybindings"],
         "resourceNames": ["gpuguard-visible-devices"], "verbs": ["get", "patch"]}]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        assert one(docs, kind, "gpuguard-arm")["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpuguard-arm", "namespace": namespace}]


def gpu_node_terms(operator):
    """GPU nodes as NVIDIA's chart finds them, each term asking whether the GPU Operator deploys its own plugin
    (operator None: every GPU node)."""
    operator_plugin = [{"key": "nvidia.com/gpu.deploy.device-plugin", "operator": operator, "values": ["true"]}] if operator else []
    return [[{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}] + operator_plugin,
            [{"key": "feature.node.kubernetes.io/cpu-model.vendor_id", "operator": "In", "values": ["NVIDIA"]}] + operator_plugin,
            [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}] + operator_plugin]


def check_node_enforcer(docs, policy, namespace="gpuguard-system"):
    """The node enforcer: on every GPU node, the GPU Operator's included; root for the two sockets, but no
    capability, no privilege and a read-only root; only the NRI and pod-resources directories and the host's /
    (recursively read-only, so that nothing is made on the host for a path not there yet) mounted; no host network; RBAC to get pods and create events,
    and to read the one break-glass ConfigMap of its namespace, nothing else;
    gpuguard's own GPU plugin and the enforcer itself exempt; the enforcer's pods carry the toleration the webhook refuses elsewhere."""
    template = one(docs, "DaemonSet", "gpuguard-node-enforcer")["spec"]["template"]
    spec = template["spec"]
    [enforcer] = spec["containers"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"] for t in terms] == gpu_node_terms(None), terms
    assert spec["priorityClassName"] == "system-node-critical"
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    assert spec["securityContext"]["runAsUser"] == 0 and spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert enforcer["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                           "capabilities": {"drop": ["ALL"]}}, enforcer["securityContext"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    host = {volumes[m["name"]]["hostPath"]["path"]: m for m in enforcer["volumeMounts"] if "hostPath" in volumes[m["name"]]}
    # The MPS roots besides, made where missing and read nowhere: a mask goes over a root only where it is.
    mps_root = next(a.split("=", 1)[1] for a in enforcer["args"] if a.startswith("--mps-root="))
    assert set(host) == {"/var/run/nri", "/var/lib/kubelet/pod-resources", "/", "/run/gpuguard", "/run/nvidia/mps",
                         mps_root, "/var/lib/gpuguard/bin"}, set(host)
    for root in ("/run/gpuguard", "/run/nvidia/mps", mps_root, "/var/lib/gpuguard/bin"):
        assert volumes[host[root]["name"]]["hostPath"]["type"] == "DirectoryOrCreate", root
    # Read-only but for one directory of gpuguard's own, at the same path as on the host, where it copies the
    # mask check that CRI-O runs as a createRuntime hook (docs/security.md, "The node enforcer's mask check").
    mask_check = host["/var/lib/gpuguard/bin"]
    assert mask_check["mountPath"] == "/var/lib/gpuguard/bin" and not mask_check.get("readOnly"), mask_check
    assert "--mask-hook-dir=/var/lib/gpuguard/bin" in enforcer["args"], enforcer["args"]
    assert all(m.get("readOnly") is True for m in enforcer["volumeMounts"] if m is not mask_check), enforcer["volumeMounts"]
    # The host's / read-only all the way down, and made by no one: nothing created on the host for a path
    # that is not there yet (/proc/driver/nvidia before the driver), no submount left writable.
    assert host["/"]["mountPath"] == "/host" and host["/"].get("recursiveReadOnly") == "IfPossible", host["/"]
    assert volumes[host["/"]["name"]]["hostPath"].get("type") == "Directory", volumes[host["/"]["name"]]
    assert "--host-root=/host" in enforcer["args"] and any(a.startswith("--mps-root=/") for a in enforcer["args"]), enforcer["args"]
    assert [p["containerPort"] for p in enforcer["ports"]] == [8080]
    # Ready or not, never restarted by a probe any client of the port could fail (docs/security.md, "Network").
    assert enforcer["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert "livenessProbe" not in enforcer and "startupProbe" not in enforcer, enforcer
    # Exempt by namespace, account and label together: gpuguard's GPU plugin, and the enforcer itself (its
    # host root lies above every MPS root), as its own pods are made.
    exempt = [enforcer_exemptions(docs)]
    own = f"{namespace}/{spec['serviceAccountName']}:app.kubernetes.io/name=" + template["metadata"]["labels"]["app.kubernetes.io/name"]
    assert own == f"{namespace}/gpuguard-node-enforcer:app.kubernetes.io/name=gpuguard-node-enforcer", own
    assert own in exempt[0], exempt
    assert f"{namespace}/gpuguard-device-plugin:app.kubernetes.io/name=gpuguard-device-plugin" in exempt[0], exempt
    # Every exemption needs its label too, and lives in a namespace the webhook does not look at (admin-only:
    # the GPU infrastructure's), so that no user namespace holds an exempt pod.
    [excluded] = [e["values"] for e in one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]["matchExpressions"]
                  if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
    for entry in exempt[0]:
        assert re.fullmatch(r"[a-z0-9-]+/([a-z0-9.-]+|\*):[A-Za-z0-9./_-]+=[A-Za-z0-9._-]*", entry), entry
        assert entry.split("/")[0] in excluded, (entry, excluded)
    assert "kube-system/default:name=nvidia-device-plugin-ds" in exempt[0] and any(e.startswith("gpu-operator/") for e in exempt[0])
    assert "--policy-dir=/etc/gpuguard/policy" in enforcer["args"] and "--nri-socket=/var/run/nri/nri.sock" in enforcer["args"]
    assert template["metadata"]["annotations"] == {policy["nriTolerationAnnotation"]: "true"}
    assert one(docs, "ClusterRole", "gpuguard-node-enforcer")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    # The node break glass: that ConfigMap alone, by name, and the flag naming the same one.
    role = one(docs, "Role", "gpuguard-node-enforcer")
    assert role["metadata"]["namespace"] == namespace
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["gpuguard-break-glass"],
                              "verbs": ["get", "list", "watch"]}], role["rules"]
    binding = one(docs, "RoleBinding", "gpuguard-node-enforcer")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpuguard-node-enforcer"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": namespace}]
    assert f"--break-glass-configmap={namespace}/gpuguard-break-glass" in enforcer["args"], enforcer["args"]
    assert one(docs, "Service", "gpuguard-node-enforcer-metrics")["spec"]["selector"] == {"gpuguard.io/metrics": "node-enforcer"}
    check_enforcer_network_policy(docs, template)
    check_own_pods_exempt(docs)


# What the node enforcer refuses a GPU-less container's hostPath to reach: a GPU's device node and every
# directory above one, NVIDIA's MPS root and gpuguard's, and every directory above them (/var/run is /run).
def reaches_gpus(path, mps_root):
    path = path.rstrip("/") or "/"
    for door in ("/dev/nvidia0", "/run/nvidia/mps", "/var/run/nvidia/mps", mps_root):
        if door == path or door.startswith(path.rstrip("/") + "/") or path.startswith(door + "/"):
            return True
    return path.startswith("/dev/nvidia")


def enforcer_exemptions(docs):
    """The entries of the node enforcer's one --exempt-service-accounts flag."""
    [enforcer] = one(docs, "DaemonSet", "gpuguard-node-enforcer")["spec"]["template"]["spec"]["containers"]
    exempt = [a.split("=", 1)[1].split(",") for a in enforcer["args"] if a.startswith("--exempt-service-accounts=")]
    assert len(exempt) == 1, enforcer["args"]
    return exempt[0]


def check_own_pods_exempt(docs, mps_root="/run/gpuguard/mps"):
    """Every workload of gpuguard's whose hostPath reaches a GPU or an MPS root is exempt by namespace,
    account and label: one that is not starts while the enforcer is away (an install) and is refused at its
    next start (a rollout, a reboot), as gpuguard-host-devices was."""
    exempt = enforcer_exemptions(docs)
    reaching = 0
    for doc in docs:
        if doc["kind"] not in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
            continue
        template = doc["spec"]["template"]
        paths = [v["hostPath"]["path"] for v in template["spec"].get("volumes", []) if "hostPath" in v]
        if not any(reaches_gpus(p, mps_root) for p in paths):
            continue
        reaching += 1
        entry = (f"{doc['metadata']['namespace']}/{template['spec'].get('serviceAccountName', 'default')}"
                 f":app.kubernetes.io/name={template['metadata']['labels']['app.kubernetes.io/name']}")
        assert entry in exempt, (doc["metadata"]["name"], paths, entry, exempt)
    assert reaching >= 2, reaching  # the enforcer and the GPU plugin at least: the check sees them


def exempts(entry, namespace, account, labels):
    """Whether one --exempt-service-accounts entry (namespace/account:key=value, the account may be *) leaves
    a pod of that namespace, account and labels alone: all three must match, as the enforcer reads it."""
    who, label = entry.split(":", 1)
    entry_namespace, entry_account = who.split("/", 1)
    key, value = label.split("=", 1)
    return (entry_namespace == namespace and entry_account in ("*", account) and labels.get(key) == value)


def check_nvidia_components_exempt(docs, fixture):
    """Every pod NVIDIA's own manifests make on GPU nodes (the GPU Operator's operands, sandbox, vGPU,
    confidential computing and DRA ones among them, and the charts of NVIDIA's device plugin and DRA driver
    under any release name; the fixture says where each was copied from) is exempt in its namespace by the
    built-in entries, but for those marked enforced, which get their GPU from the kubelet; none is exempt
    without its labels, in a tenant's namespace, or, where the entry names an account, under another
    account."""
    exempt = enforcer_exemptions(docs)
    pods = yaml.safe_load(open(fixture))
    assert len(pods) >= 20 and any(pod.get("enforced") for pod in pods), len(pods)
    for pod in pods:
        namespace, account, labels = pod["namespace"], pod["serviceAccount"], pod["labels"]
        matched = [e for e in exempt if exempts(e, namespace, account, labels)]
        if pod.get("enforced"):
            assert not matched, (pod["source"], matched)
            continue
        assert matched, (pod["source"], namespace, account, labels, exempt)
        assert not any(exempts(e, namespace, account, {}) for e in exempt), pod["source"]
        assert not any(exempts(e, "team-a", account, labels) for e in exempt), pod["source"]
        for entry in matched:
            if entry.split(":", 1)[0].split("/", 1)[1] != "*":
                assert not exempts(entry, namespace, account + "-look-alike", labels), (pod["source"], entry)


def check_enforcer_network_policy(docs, template, scrapers=True):
    """The enforcer's NetworkPolicy: see check_metrics_network_policy."""
    check_metrics_network_policy(docs, "gpuguard-node-enforcer", [template], scrapers)


def check_device_plugin_network_policy(docs, scrapers=True):
    """The device plugins' NetworkPolicy (the GPUs, the node report, host devices): see
    check_metrics_network_policy."""
    templates = [d["spec"]["template"] for d in find(docs, "DaemonSet") if d["metadata"]["name"] in
                 ("gpuguard-device-plugin", "gpuguard-node-report", "gpuguard-host-devices")]
    assert templates
    check_metrics_network_policy(docs, "gpuguard-device-plugin", templates, scrapers)


def check_metrics_network_policy(docs, name, templates, scrapers):
    """A DaemonSet's NetworkPolicy: each of its pods (every template given), ingress to the metrics port from
    the scrapers only (the kubelet's probes come from the node, always let in); never a rule without "from",
    which would let everyone in."""
    policy = one(docs, "NetworkPolicy", name)["spec"]
    for template in templates:
        assert policy["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items(), policy
    assert policy["policyTypes"] == ["Ingress"]
    if not scrapers:
        assert policy["ingress"] == [], policy
        return
    [rule] = policy["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}], rule


def check_own_node_writes(docs, namespace="gpuguard-system"):
    """The device plugin's account may patch every Node's status (RBAC cannot name one node); a policy holds
    each of its pods to the Node its pod-bound token says it runs on."""
    policy = one(docs, "ValidatingAdmissionPolicy", "gpuguard-device-plugin-own-node")["spec"]
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "gpuguard-device-plugin-own-node")["spec"]
    assert policy["failurePolicy"] == "Fail"
    assert policy["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes/status"]}]
    [condition] = policy["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == 'system:serviceaccount:{namespace}:gpuguard-device-plugin'"
    [validation] = policy["validations"]
    assert "request.userInfo.extra['authentication.kubernetes.io/node-name']" in validation["expression"]
    assert "object.metadata.name in" in validation["expression"]
    assert binding == {"policyName": "gpuguard-device-plugin-own-node", "validationActions": ["Deny"]}
    rules = one(docs, "ClusterRole", "gpuguard-device-plugin")["rules"]
    assert rules == DEVICE_PLUGIN_RULES, rules


# The device plugin's account: its own Node's status (a policy holds it to its own), and the ResourceSlices
# it reads for what DRA drivers publish on its node; nothing else.
DEVICE_PLUGIN_RULES = [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                       {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list", "watch"]}]


def check_device_plugin(docs):
    """The GPU plugin: on GPU nodes as NVIDIA's chart finds them but for the GPU Operator's, GPUs only, left to
    NVIDIA's plugin where it answers (--gpus=auto), NVML also on a hardened node; and the node report alone on
    the GPU Operator's nodes."""
    daemonset = one(docs, "DaemonSet", "gpuguard-device-plugin")["spec"]["template"]["spec"]
    [plugin] = daemonset["containers"]
    assert daemonset["priorityClassName"] == "system-node-critical"
    check_device_plugin_network_policy(docs)
    terms = daemonset["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"] for t in terms] == gpu_node_terms("NotIn"), terms
    assert any(t["key"] == "nvidia.com/gpu" for t in daemonset["tolerations"])
    assert "--host-root=/host" in plugin["args"] and not any(a.startswith("--host-device") for a in plugin["args"])
    assert "--gpus=auto" in plugin["args"]
    check_node_report(docs, daemonset)
    check_host_paths(docs)
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in plugin["volumeMounts"]}
    assert mounts["/var/lib/kubelet/device-plugins"] is False
    by_name = {v["name"]: v for v in daemonset["volumes"]}
    # The host's / read-only and recursively so (the GPUs and what the node report reads), and writable
    # only the directory the plugin writes its own CDI spec to, where the host's /var/run/cdi resolves.
    check_host_root(plugin, by_name)
    [cdi] = [m for m in plugin["volumeMounts"] if m["mountPath"] == "/host/run/cdi"]
    assert not cdi.get("readOnly") and by_name[cdi["name"]]["hostPath"] == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}
    all_gpus = next(m["name"] for m in plugin["volumeMounts"] if m["mountPath"] == "/var/run/nvidia-container-devices/all")
    assert next(v for v in daemonset["volumes"] if v["name"] == all_gpus)["hostPath"] == {"path": "/dev/null", "type": "CharDevice"}
    paths = {v["hostPath"]["path"] for v in daemonset["volumes"] if "hostPath" in v}
    assert {"/var/lib/kubelet/device-plugins", "/"} <= paths
    # The Node condition: this node's name from the downward API, the webhook's policy read-only, and a
    # token allowed to patch nodes/status, nothing more.
    assert "--node-name=$(NODE_NAME)" in plugin["args"] and "--policy-dir=/etc/gpuguard/policy" in plugin["args"]
    [node_name] = [e for e in plugin["env"] if e["name"] == "NODE_NAME"]
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert mounts["/etc/gpuguard/policy"] is True
    policy = next(m["name"] for m in plugin["volumeMounts"] if m["mountPath"] == "/etc/gpuguard/policy")
    assert by_name[policy]["configMap"]["name"] == "gpuguard-policy"
    assert daemonset["automountServiceAccountToken"] is True
    assert one(docs, "ClusterRole", "gpuguard-device-plugin")["rules"] == DEVICE_PLUGIN_RULES
    # What the kubelet offers under every resource name, through its socket's directory, read-only.
    assert "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in plugin["args"], plugin["args"]
    # NVIDIA's plugin's pod withholds every GPU in the GPU infrastructure's namespaces, which are all excluded.
    [infrastructure] = [a for a in plugin["args"] if a.startswith("--infrastructure-namespaces=")]
    namespaces = infrastructure.split("=", 1)[1].split(",")
    assert {"gpu-operator", "nvidia-device-plugin", "dra-driver-nvidia-gpu", "nvidia-dra-driver-gpu", "kube-system"} <= set(namespaces), namespaces
    selector = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    [excluded] = [e["values"] for e in selector if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
    assert set(namespaces) <= set(excluded), (namespaces, excluded)
    pod_resources = next(m for m in plugin["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pod-resources")
    assert pod_resources.get("readOnly") is True
    assert by_name[pod_resources["name"]]["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    binding = one(docs, "ClusterRoleBinding", "gpuguard-device-plugin")
    assert binding["roleRef"]["name"] == "gpuguard-device-plugin"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": daemonset["serviceAccountName"],
                                    "namespace": "gpuguard-system"}]
    check_plugin_container(daemonset)
    return plugin["args"]


def check_mps(docs, namespace="gpuguard-system", root="/run/gpuguard/mps"):
    """MPS: the control DaemonSet where the device plugin's config sets sharing.mps, on the GPU plugin's nodes,
    from the plugin's own config; privileged and in the host's PID namespace (compute modes, each GPU's shm
    mount, MPS's PID-keyed clients) and nothing else of the host but the MPS root (Bidirectional, so its
    tmpfs mounts reach the kubelet) and discovery's read-only files; every GPU through NVIDIA's runtime with
    nvidia-smi and MPS; no token. The GPU plugin reads the readiness files read-only; the enforcer exempts
    the daemons."""
    daemonset = one(docs, "DaemonSet", "gpuguard-mps-control")["spec"]["template"]
    spec = daemonset["spec"]
    [control] = spec["containers"]
    plugin = one(docs, "DaemonSet", "gpuguard-device-plugin")["spec"]["template"]["spec"]
    assert spec["affinity"] == plugin["affinity"] and spec["tolerations"] == plugin["tolerations"]
    assert spec["hostPID"] is True and not spec.get("hostNetwork") and not spec.get("hostIPC")
    assert spec["automountServiceAccountToken"] is False and spec["serviceAccountName"] == "gpuguard-mps-control"
    assert control["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True}, control["securityContext"]
    # Root, or the image's user keeps none of privileged's capabilities past exec (found on the real node).
    assert spec["securityContext"] == {"runAsUser": 0, "runAsGroup": 0}, spec["securityContext"]
    assert control["args"][0] == "mps-control" and f"--mps-root={root}" in control["args"]
    assert "--config-file=/etc/gpuguard/device-plugin/config.yaml" in control["args"]
    assert {e["name"]: e["value"] for e in control["env"]} == {"NVIDIA_VISIBLE_DEVICES": "all",
                                                               "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    host = {volumes[m["name"]]["hostPath"]["path"]: m for m in control["volumeMounts"] if "hostPath" in volumes[m["name"]]}
    assert set(host) == {root, "/dev", "/proc/driver", "/sys"}, set(host)
    check_host_paths(docs, root)
    assert host[root]["mountPath"] == "/host" + root and host[root]["mountPropagation"] == "Bidirectional"
    assert all(m.get("readOnly") is True for path, m in host.items() if path != root), host
    config = next(m["name"] for m in control["volumeMounts"] if m["mountPath"] == "/etc/gpuguard/device-plugin")
    assert volumes[config]["configMap"]["name"] == "gpuguard-device-plugin"
    assert "sharing" in yaml.safe_load(one(docs, "ConfigMap", "gpuguard-device-plugin")["data"]["config.yaml"])
    [gpu_plugin] = plugin["containers"]
    assert f"--mps-root={root}" in gpu_plugin["args"]
    [ready] = [m for m in gpu_plugin["volumeMounts"] if m["mountPath"] == "/host" + root]
    assert ready.get("readOnly") is True
    assert {v["name"]: v for v in plugin["volumes"]}[ready["name"]]["hostPath"]["path"] == root
    # Exempt by namespace, service account and the daemons' label together.
    label = daemonset["metadata"]["labels"]["app.kubernetes.io/name"]
    exempt = enforcer_exemptions(docs)
    assert f"{namespace}/gpuguard-mps-control:app.kubernetes.io/name={label}" in exempt, exempt
    assert label == "gpuguard-mps-control"
    check_own_pods_exempt(docs, root)


def check_node_report(docs, gpu_plugin):
    """On the GPU Operator's nodes: the report alone, as the image's non-root user, every host path read-only,
    no kubelet directory, the GPU plugin's service account, policy and tolerations."""
    spec = one(docs, "DaemonSet", "gpuguard-node-report")["spec"]["template"]["spec"]
    [report] = spec["containers"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"] for t in terms] == gpu_node_terms("In"), terms
    assert spec["tolerations"] == gpu_plugin["tolerations"]
    assert spec["serviceAccountName"] == gpu_plugin["serviceAccountName"]
    check_hardened(spec, report)
    # No pod-resources socket read: none is mounted (an empty path, which the plugin takes as none).
    assert report["args"][:5] == ["--gpus=report-only", "--pod-resources-socket", "", "--discovery=procfs",
                                  "--host-root=/host"], report["args"]
    assert "--node-name=$(NODE_NAME)" in report["args"] and "--policy-dir=/etc/gpuguard/policy" in report["args"]
    assert all(m.get("readOnly") is True for m in report["volumeMounts"]), report["volumeMounts"]
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert paths == {"/"}, paths
    check_host_root(report, {v["name"]: v for v in spec["volumes"]})
    assert report["readinessProbe"]["httpGet"]["path"] == "/readyz"


def check_host_root(container, volumes):
    """The host's / at /host, read-only and recursively so."""
    [host] = [m for m in container["volumeMounts"] if m["mountPath"] == "/host"]
    assert host.get("readOnly") is True and host.get("recursiveReadOnly") == "IfPossible", host
    assert volumes[host["name"]]["hostPath"] == {"path": "/", "type": "Directory"}


# The host directories a rendering may make where missing (hostPath DirectoryOrCreate): gpuguard's own MPS
# roots, NVIDIA's (/run/nvidia/mps, which NVIDIA's chart makes so on every node it runs; the node enforcer
# masks it in containers that mount the host's / or /run, which needs it there), CDI's run-time spec
# directory, NFD's feature directory (devicePlugin.nfdFeatures), NRI's socket directory in the host's /run,
# and gpuguard's own /var/lib/gpuguard/bin, where the node enforcer copies its mask check for CRI-O.
# No other: a directory made on the host that is not gpuguard's misleads the
# tools that look for it (an empty /usr/local/nvidia/toolkit, /etc/crio), and one in procfs cannot be made
# (/proc/driver/nvidia before the driver loads), so the pod would never start.
MAY_MAKE = {"/var/run/cdi", "/etc/kubernetes/node-feature-discovery/features.d", "/var/run/nri", "/run/gpuguard",
            "/run/nvidia/mps", "/var/lib/gpuguard/bin"}


def check_host_paths(docs, mps_root="/run/gpuguard/mps"):
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for volume in spec.get("volumes", []):
            host = volume.get("hostPath")
            if not host:
                continue
            assert not host["path"].startswith("/proc/driver/nvidia"), (doc["metadata"]["name"], host)
            if host.get("type") == "DirectoryOrCreate":
                assert host["path"] in MAY_MAKE | {mps_root}, (doc["metadata"]["name"], host)


def check_host_devices(docs):
    """Host devices on every GPU node, past the GPU DaemonSet's taints alone (root pods on every node, past
    every taint, are more than gpuguard should install unasked), with no GPU resource of their own."""
    hosts = one(docs, "DaemonSet", "gpuguard-host-devices")["spec"]["template"]["spec"]
    assert hosts["automountServiceAccountToken"] is False
    [devices] = hosts["containers"]
    terms = hosts["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"] for t in terms] == gpu_node_terms(None), terms
    gpu_plugin = one(docs, "DaemonSet", "gpuguard-device-plugin")["spec"]["template"]["spec"]
    assert hosts["tolerations"] == gpu_plugin["tolerations"] and {"operator": "Exists"} not in hosts["tolerations"], hosts
    assert "nodeSelector" not in hosts
    assert "--discovery=none" in devices["args"]
    check_plugin_container(hosts)
    return [a.split("=", 1)[1] for a in devices["args"] if a.startswith("--host-device=")]


def check_plugin_container(spec):
    [container] = spec["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "--metrics-address=0.0.0.0:8080" in container["args"]
    assert container["command"] == ["/usr/local/bin/gpuguard-device-plugin"]
    check_hardened(spec, container, non_root=False)  # root, to write into the kubelet's root-owned directory


def check_extender(docs, namespace):
    """Read-only access to pods and nodes, and a hardened Deployment that reaches kube-scheduler over HTTPS."""
    assert one(docs, "ClusterRole", "gpuguard-scheduler-extender")["rules"] == [
        {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]
    binding = one(docs, "ClusterRoleBinding", "gpuguard-scheduler-extender")
    assert binding["roleRef"]["name"] == "gpuguard-scheduler-extender"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuguard-scheduler-extender", "namespace": namespace}]
    pod = one(docs, "Deployment", "gpuguard-scheduler-extender")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["serviceAccountName"] == "gpuguard-scheduler-extender" and pod["automountServiceAccountToken"] is True
    assert container["command"] == ["/usr/local/bin/gpuguard-scheduler-extender"]
    args = dict(a[2:].split("=", 1) for a in container["args"])
    assert args["url-prefix"] == "/scheduler" and args["listen-address"] == "0.0.0.0:8443"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    check_hardened(pod, container)
    assert pod["terminationGracePeriodSeconds"] > float(args["shutdown-timeout"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["policy"]["configMap"] == {"name": "gpuguard-policy", "optional": True}
    assert volumes["tls"]["secret"]["secretName"] == "gpuguard-scheduler-extender-tls"
    service = one(docs, "Service", "gpuguard-scheduler-extender")
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https"}]
    return service, args


def check_network_policy(docs, pod_cidrs=()):
    """The webhook's NetworkPolicy: ingress to 8443 only, from any address less `pod_cidrs`, and the scrapers."""
    deployment = one(docs, "Deployment", "gpuguard-webhook")["spec"]
    policy = one(docs, "NetworkPolicy", "gpuguard-webhook")["spec"]
    assert policy["podSelector"]["matchLabels"] == deployment["selector"]["matchLabels"]
    assert policy["policyTypes"] == ["Ingress"]
    [rule] = policy["ingress"]
    assert rule["ports"] == [{"port": "https", "protocol": "TCP"}]
    blocks = [peer["ipBlock"] for peer in rule["from"] if "ipBlock" in peer]
    assert [b["cidr"] for b in blocks] == ["0.0.0.0/0", "::/0"]
    assert sorted(e for b in blocks for e in b.get("except", [])) == sorted(pod_cidrs)
    for b in blocks:  # each family excepts its own
        assert all((":" in e) == (":" in b["cidr"]) for e in b.get("except", []))
    [scrapers] = [peer for peer in rule["from"] if "ipBlock" not in peer]
    assert scrapers["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


def series_names(expression):
    """The series a PromQL expression selects: every name followed by a selector, and every gpuguard_ name."""
    import re
    named = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", expression))
    named |= set(re.findall(r"\b(gpuguard_[a-z0-9_]+)", expression))
    return named


def check_series_exist(expressions, root):
    """Each series an alert or panel reads is one gpuguard's code exports (or Kubernetes' own, named above)."""
    import pathlib
    code = "".join(p.read_text() for top in ("src", "include") for p in pathlib.Path(root, top).rglob("*.[ch]pp"))
    for expression in expressions:
        names = series_names(expression)
        assert names, f"no series in {expression!r}"
        for name in names - KUBERNETES_SERIES:
            assert name.startswith("gpuguard_"), f"{name} in {expression!r} is neither gpuguard's nor Kubernetes'"
            assert '"' + name + '"' in code or '"' + name + '{' in code or '"' + name + ' ' in code, \
                f"{name} (in {expression!r}) is exported nowhere in src/"


def check_audit(docs, namespace, root):
    """The audit controller: least privilege, hardened, its Lease named, and its rule and dashboard sound."""
    import json
    deployment = one(docs, "Deployment", "gpuguard-audit")["spec"]
    pod = deployment["template"]["spec"]
    [container] = pod["containers"]
    check_hardened(pod, container)
    assert deployment["replicas"] >= 2
    assert container["args"][0] == "audit-controller" and "--lease-name=gpuguard-audit" in container["args"]
    assert "--policy-dir=/etc/gpuguard/policy" in container["args"]
    assert {e["name"] for e in container["env"]} == {"POD_NAME", "POD_NAMESPACE"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["limits"]["memory"]
    assert pod["serviceAccountName"] == "gpuguard-audit"
    rules = one(docs, "ClusterRole", "gpuguard-audit")["rules"]
    verbs = {(group, resource): set(r["verbs"]) for r in rules for group in r["apiGroups"] for resource in r["resources"]}
    assert verbs == {("", "pods"): {"list", "watch"}, ("", "nodes"): {"list", "watch"},
                     ("resource.k8s.io", "resourceclaims"): {"list", "watch"},
                     ("resource.k8s.io", "resourceclaimtemplates"): {"list", "watch"},
                     ("wgpolicyk8s.io", "policyreports"): {"list", "create", "patch", "delete"}}, verbs
    lease = one(docs, "Role", "gpuguard-audit")["rules"]
    assert {"create"} == set(lease[0]["verbs"]) and "resourceNames" not in lease[0]
    assert lease[1]["resourceNames"] == ["gpuguard-audit"] and set(lease[1]["verbs"]) == {"get", "update"}
    binding = one(docs, "RoleBinding", "gpuguard-audit")
    assert binding["metadata"]["namespace"] == namespace and binding["roleRef"]["name"] == "gpuguard-audit"

    crd = one(docs, "CustomResourceDefinition", "policyreports.wgpolicyk8s.io")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    [version] = crd["spec"]["versions"]
    assert version["name"] == "v1alpha2" and version["served"] and version["storage"]

    rule = one(docs, "PrometheusRule", "gpuguard-audit")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert {a["alert"] for a in alerts} == {"GPUGuardPodsExposed", "GPUGuardNodeIsolationNotHolding",
                                            "GPUGuardAuditStale"}
    for a in alerts:
        assert a["labels"]["severity"] in ("warning", "critical") and a["annotations"]["summary"], a
    check_series_exist([a["expr"] for a in alerts], root)
    # With every audit pod gone, the Deployment's replicas (kube-state-metrics) still say so.
    audit = one(docs, "Deployment", "gpuguard-audit")["metadata"]
    stale = next(a["expr"] for a in alerts if a["alert"] == "GPUGuardAuditStale")
    assert f'namespace="{audit["namespace"]}",deployment="{audit["name"]}"' in stale, stale

    dashboards = one(docs, "ConfigMap", "gpuguard-audit-dashboard")
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    [(key, text)] = dashboards["data"].items()
    assert key.endswith(".json")
    dashboard = json.loads(text)
    assert dashboard["uid"] and len(dashboard["uid"]) <= 40 and dashboard["title"]
    assert "__inputs" not in dashboard and "${DS_" not in text, "sidecar provisioning resolves no inputs"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    expressions = []
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            expressions.append(t["expr"].replace("$__rate_interval", "5m"))
    check_series_exist(expressions, root)


def check_monitoring(docs, namespace, root, ca_suffix="-tls"):
    """The ServiceMonitors find the Services that carry gpuguard.io/metrics, the HTTPS ones with the release's CA and
    the name on its certificate; the operations rule reads only series gpuguard exports."""
    services = {d["metadata"]["labels"]["gpuguard.io/metrics"]: d for d in find(docs, "Service")
                if "gpuguard.io/metrics" in d["metadata"].get("labels", {})}
    monitors = find(docs, "ServiceMonitor")
    assert {m["spec"]["selector"]["matchLabels"]["gpuguard.io/metrics"] for m in monitors} == set(services), services
    for monitor in monitors:
        component = monitor["spec"]["selector"]["matchLabels"]["gpuguard.io/metrics"]
        service = services[component]
        [endpoint] = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, (component, endpoint)
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
        if endpoint["scheme"] == "https":
            tls = endpoint["tlsConfig"]
            assert tls["serverName"] == f"{service['metadata']['name']}.{namespace}.svc"
            assert tls["ca"] == {"secret": {"name": service["metadata"]["name"] + ca_suffix, "key": "ca.crt"}}
            assert "insecureSkipVerify" not in tls
    # The device plugins' Service is headless and finds every node's plugin.
    plugins = services["device-plugin"]["spec"]
    assert plugins["clusterIP"] == "None" and plugins["selector"] == {"gpuguard.io/metrics": "device-plugin"}
    for name in ("gpuguard-device-plugin", "gpuguard-node-report", "gpuguard-host-devices"):
        labels = one(docs, "DaemonSet", name)["spec"]["template"]["metadata"]["labels"]
        assert labels["gpuguard.io/metrics"] == "device-plugin", (name, labels)
    enforcers = services["node-enforcer"]["spec"]
    assert enforcers["clusterIP"] == "None" and enforcers["selector"] == {"gpuguard.io/metrics": "node-enforcer"}
    rule = one(docs, "PrometheusRule", "gpuguard")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert {a["alert"] for a in alerts} == {"GPUGuardCertificateExpiresSoon", "GPUGuardPolicyNotEnforcing",
                                            "GPUGuardInjectedValueNotHonoured", "GPUGuardGPUHeldTwice", "GPUGuardWebhookErrors",
                                            "GPUGuardConnectionsShed", "GPUGuardNodeEnforcerNotRegistered",
                                            "GPUGuardContainersBeyondAllocation", "GPUGuardPolicyRefused",
                                            "GPUGuardWebhookUnavailable", "GPUGuardNodeEnforcerNotRunning", "GPUGuardNodeNotEnforced",
                                            "GPUGuardNodeEnforcerRefusals", "GPUGuardNodeBreakGlass", "GPUGuardGPUInfrastructureUnlisted",
                                            "GPUGuardNodeEnforcementNotEnforcing", "GPUGuardGPUNodeWithoutEnforcer",
                                            "GPUGuardAdmissionObjectMissing", "GPUGuardAdmissionBreakGlass",
                                            "GPUGuardAdmissionSwitchesUnwatched"}
    for a in alerts:
        assert a["labels"]["severity"] in ("warning", "critical") and a["annotations"]["summary"], a
        assert "absent(" not in a["expr"], f"{a['alert']} fires on missing data"
    check_series_exist([a["expr"] for a in alerts], root)
    # The webhook, Deployment and DaemonSet the series are selected by are the ones the chart installs.
    by_name = {a["alert"]: a["expr"] for a in alerts}
    webhook_name = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["name"]
    assert all(webhook_name in a["expr"] for a in alerts if "apiserver_" in a["expr"])
    deployment = one(docs, "Deployment", "gpuguard-webhook")["metadata"]
    assert f'namespace="{deployment["namespace"]}",deployment="{deployment["name"]}"' in by_name["GPUGuardWebhookUnavailable"]
    enforcer = one(docs, "DaemonSet", "gpuguard-node-enforcer")["metadata"]
    assert f'namespace="{enforcer["namespace"]}",daemonset="{enforcer["name"]}"' in by_name["GPUGuardNodeEnforcerNotRunning"]
    assert (f'namespace="{enforcer["namespace"]}",created_by_kind="DaemonSet",created_by_name="{enforcer["name"]}"'
            in by_name["GPUGuardGPUNodeWithoutEnforcer"])
    # Neither "not enforcing" alert is by pod: a replica's restart must not start its timer again.
    for name in ("GPUGuardPolicyNotEnforcing", "GPUGuardNodeEnforcementNotEnforcing", "GPUGuardAdmissionObjectMissing",
                 "GPUGuardAdmissionBreakGlass", "GPUGuardAdmissionSwitchesUnwatched"):
        assert "pod" not in re.findall(r"by \(([^)]*)\)", by_name[name])[0], by_name[name]

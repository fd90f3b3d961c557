{{/* Names: fullnameOverride when given; else "<release>-<name>", or the release's name alone when it holds
<name> (nameOverride, or "gpuguard": a release named gpuguard names its objects as manifests/ names them). */}}
{{- define "gpuguard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := .Values.nameOverride | default "gpuguard" -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object; selectors use gpuguard.selector only, which never changes across upgrades. */}}
{{- define "gpuguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuguard
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The selector of one component: (dict "root" $ "component" "webhook"). */}}
{{- define "gpuguard.selector" -}}
app.kubernetes.io/name: {{ include "gpuguard.fullname" .root }}-{{ .component }}
{{- end -}}

{{- define "gpuguard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The built-in lists (docs/operations.md#upgrades). They live here, not in values.yaml: an upgrade with
--reuse-values keeps the values of the chart the release was first installed with, its defaults included,
and would keep that chart's lists; these are always this chart's. The values hold the admin's additions,
and a switch each (only an explicit false; unset is true) to leave the built-ins out. */}}
{{- define "gpuguard.builtInExcludedNamespaces" -}}
{{- list "kube-system" "kube-node-lease" "gpu-operator" "nvidia-device-plugin" "dra-driver-nvidia-gpu" "nvidia-dra-driver-gpu" | toJson -}}
{{- end -}}

{{/* NVIDIA's own GPU infrastructure: the GPU Operator's operands in gpu-operator (v26.7 names: its assets/ and
manifests/, the sandbox, vGPU, confidential-computing and DRA ones included; an NVIDIADriver's driver by its
component label, since its account and app label carry the OS and a hash), NVIDIA's device plugin as its
static manifest runs it (kube-system, the default account) and as its Helm chart does (namespace
nvidia-device-plugin, under any release name: the chart names its account after the release, its pods'
label after itself), and NVIDIA's DRA driver for GPUs as its own chart runs its kubelet plugin, under any
release name (the account is named after the release, the pods' component label is fixed in the
template): in dra-driver-nvidia-gpu, where its install guide puts it, and in nvidia-dra-driver-gpu, where
a release of its v25 chart upgraded in place stays, as its upgrade guide says (both read at 22407113).
tests/fixtures/nvidia-components/pods.yaml holds each pod as NVIDIA's sources make it. */}}
{{- define "gpuguard.builtInGpuInfrastructure" -}}
{{- list
  "gpu-operator/nvidia-device-plugin:app=nvidia-device-plugin-daemonset"
  "gpu-operator/nvidia-device-plugin:app=nvidia-device-plugin-mps-control-daemon"
  "gpu-operator/nvidia-gpu-feature-discovery:app=gpu-feature-discovery"
  "gpu-operator/nvidia-dcgm-exporter:app=nvidia-dcgm-exporter"
  "gpu-operator/nvidia-dcgm:app=nvidia-dcgm"
  "gpu-operator/nvidia-mig-manager:app=nvidia-mig-manager"
  "gpu-operator/nvidia-operator-validator:app=nvidia-operator-validator"
  "gpu-operator/nvidia-operator-validator:app=nvidia-cuda-validator"
  "gpu-operator/nvidia-driver:app=nvidia-driver-daemonset"
  "gpu-operator/nvidia-container-toolkit:app=nvidia-container-toolkit-daemonset"
  "gpu-operator/nvidia-node-status-exporter:app=nvidia-node-status-exporter"
  "gpu-operator/*:app.kubernetes.io/component=nvidia-driver"
  "gpu-operator/*:app.kubernetes.io/component=nvidia-vgpu-host-manager"
  "gpu-operator/nvidia-sandbox-device-plugin:app=nvidia-sandbox-device-plugin-daemonset"
  "gpu-operator/nvidia-kata-sandbox-device-plugin:app=nvidia-kata-sandbox-device-plugin-daemonset"
  "gpu-operator/nvidia-sandbox-validator:app=nvidia-sandbox-validator"
  "gpu-operator/nvidia-vfio-manager:name=nvidia-vfio-manager"
  "gpu-operator/nvidia-vgpu-manager:app=nvidia-vgpu-manager-daemonset"
  "gpu-operator/nvidia-vgpu-device-manager:app=nvidia-vgpu-device-manager"
  "gpu-operator/nvidia-kata-manager:name=nvidia-kata-manager"
  "gpu-operator/nvidia-cc-manager:name=nvidia-cc-manager"
  "gpu-operator/nvidia-dra-driver-kubeletplugin:app=nvidia-dra-driver-kubelet-plugin"
  "gpu-operator/nvidia-dra-validator:app=nvidia-operator-validator"
  "gpu-operator/nvidia-dcgm-dra:app=nvidia-dcgm-dra"
  "gpu-operator/nvidia-dcgm-exporter-dra:app=nvidia-dcgm-exporter-dra"
  "kube-system/default:name=nvidia-device-plugin-ds"
  "nvidia-device-plugin/*:app.kubernetes.io/name=nvidia-device-plugin"
  "dra-driver-nvidia-gpu/*:nvidia-dra-driver-gpu-component=kubelet-plugin"
  "nvidia-dra-driver-gpu/*:nvidia-dra-driver-gpu-component=kubelet-plugin"
  | toJson -}}
{{- end -}}

{{/* The namespaces neither the webhook nor the backstop look at, as JSON: the built-in ones (unless
webhook.builtInExcludedNamespaces is false), webhook.excludedNamespaces, and the release's own. */}}
{{- define "gpuguard.excludedNamespaces" -}}
{{- $builtIn := list -}}
{{- if ne (toString .Values.webhook.builtInExcludedNamespaces) "false" -}}
{{- $builtIn = include "gpuguard.builtInExcludedNamespaces" . | fromJsonArray -}}
{{- end -}}
{{- concat $builtIn (.Values.webhook.excludedNamespaces | default list) (list .Release.Namespace) | uniq | toJson -}}
{{- end -}}

{{/* The GPU infrastructure, comma-separated for the node enforcer's --exempt-service-accounts: the built-in
entries whose namespace is excluded (unless builtInGpuInfrastructure is false; one whose namespace an admin
took out of the excluded ones goes with it), then gpuInfrastructure, whose every entry must be in an
excluded namespace (fails otherwise), since exempt pods must live in admin-only namespaces. */}}
{{- define "gpuguard.gpuInfrastructure" -}}
{{- $excluded := include "gpuguard.excludedNamespaces" . | fromJsonArray -}}
{{- $entries := list -}}
{{- if ne (toString .Values.builtInGpuInfrastructure) "false" -}}
{{- range include "gpuguard.builtInGpuInfrastructure" . | fromJsonArray -}}
{{- if has (splitList "/" . | first) $excluded -}}
{{- $entries = append $entries . -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range .Values.gpuInfrastructure | default list -}}
{{- $namespace := splitList "/" . | first -}}
{{- if not (has $namespace $excluded) -}}
{{- fail (printf "gpuInfrastructure: %s is in namespace %s, which webhook.excludedNamespaces does not list: exempt pods must live in namespaces only admins create pods in" . $namespace) -}}
{{- end -}}
{{- $entries = append $entries . -}}
{{- end -}}
{{- join "," ($entries | uniq) -}}
{{- end -}}

{{/* The namespaces of the GPU infrastructure's entries, comma-separated, for the device plugin's
--infrastructure-namespaces: each an excluded namespace, which only admins create pods in. */}}
{{- define "gpuguard.gpuInfrastructureNamespaces" -}}
{{- $namespaces := list -}}
{{- range splitList "," (include "gpuguard.gpuInfrastructure" .) -}}
{{- if . -}}
{{- $namespaces = append $namespaces (splitList "/" . | first) -}}
{{- end -}}
{{- end -}}
{{- join "," ($namespaces | uniq) -}}
{{- end -}}

{{/* hostRoot.recursiveReadOnly, IfPossible where a release's values lack it (--reuse-values from a chart
without the key). */}}
{{- define "gpuguard.recursiveReadOnly" -}}
{{- (.Values.hostRoot | default dict).recursiveReadOnly | default "IfPossible" -}}
{{- end -}}

{{/* The namespaces neither the webhook nor the backstop look at. */}}
{{- define "gpuguard.namespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: {{ include "gpuguard.excludedNamespaces" . }}
  - key: gpuguard.io/ignore
    operator: DoesNotExist
{{- end -}}

{{/* Both programs that serve HTTPS run as the image's non-root user, with nothing writable. */}}
{{- define "gpuguard.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpuguard.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The DNS names of a Service: (dict "root" $ "service" "gpuguard-webhook"). */}}
{{- define "gpuguard.dnsNames" -}}
{{- $ns := .root.Release.Namespace -}}
{{- list .service (printf "%s.%s" .service $ns) (printf "%s.%s.svc" .service $ns) (printf "%s.%s.svc.cluster.local" .service $ns) | toJson -}}
{{- end -}}

{{/* Non-empty where the cluster serves a resource.k8s.io version that gpuguard reads claims through
(v1 from 1.34, v1beta2 or v1beta1 where enabled on 1.33 and 1.32). `helm template` assumes the versions
of Helm's own client library, which include all three. */}}
{{- define "gpuguard.draServed" -}}
{{- if or (.Capabilities.APIVersions.Has "resource.k8s.io/v1") (.Capabilities.APIVersions.Has "resource.k8s.io/v1beta2") (.Capabilities.APIVersions.Has "resource.k8s.io/v1beta1") -}}
true
{{- end -}}
{{- end -}}

{{/* Arming (docs/operations.md#install): what refuses pods is made so only once a replica can answer.
"true" when the webhook configuration should be rendered at failurePolicy Fail now: Fail is asked for,
and either arming after readiness is off or the live configuration is armed already (lookup, so that
`helm upgrade` keeps it armed; `helm template` has no cluster and renders it unarmed). */}}
{{- define "gpuguard.webhookArmed" -}}
{{- if and (eq .Values.webhook.failurePolicy "Fail") (include "gpuguard.outageRefuses" .) -}}
{{- if not .Values.webhook.armAfterReady -}}
true
{{- else -}}
{{- $live := lookup "admissionregistration.k8s.io/v1" "MutatingWebhookConfiguration" "" (include "gpuguard.fullname" .) -}}
{{- range ($live.webhooks | default list) -}}
{{- if and (eq .name "visible-devices.gpuguard.io") (eq (.failurePolicy | default "") "Fail") -}}
true
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* policy.sharedGpuResources as the webhook reads it: the resources the device plugin serves through MPS
(devicePlugin.config.sharing.mps, named as the plugin names them: rename, else <name>.shared under
renameByDefault, else name), whose limits a client's own CUDA_MPS_* would loosen, then the admin's list.
Built here, not in values.yaml, so that --reuse-values keeps it in step with the config. */}}
{{- define "gpuguard.sharedGpuResources" -}}
{{- $names := list -}}
{{- $mps := dig "sharing" "mps" dict (.Values.devicePlugin.config | default dict) -}}
{{- range ($mps.resources | default list) -}}
{{- if .rename -}}
{{- $names = append $names .rename -}}
{{- else if eq (toString $mps.renameByDefault) "true" -}}
{{- $names = append $names (printf "%s.shared" .name) -}}
{{- else -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- end -}}
{{- $added := toString (.Values.policy.sharedGpuResources | default "") | trim -}}
{{- if $added -}}
{{- $names = append $names $added -}}
{{- end -}}
{{- $names | uniq | join ", " -}}
{{- end -}}

{{/* "true" where an outage refuses pods (webhook.outage refuse); node-enforcer leaves them to the node enforcer,
which the chart must then install. Anything but node-enforcer refuses: an upgrade with --reuse-values from a
chart without the key has it unset, and keeps refusing. */}}
{{- define "gpuguard.outageRefuses" -}}
{{- if ne (.Values.webhook.outage | default "refuse") "node-enforcer" -}}
true
{{- else if not .Values.nodeEnforcer.enabled -}}
{{- fail "webhook.outage=node-enforcer admits unpatched pods while the webhook is down and leaves them to the node enforcer: it needs nodeEnforcer.enabled=true" -}}
{{- else if has (trim (toString (.Values.policy.nodeEnforcement | default "enforce"))) (list "audit" "off") -}}
{{- fail (printf "webhook.outage=node-enforcer leaves unpatched pods to the node enforcer, and policy.nodeEnforcement=%s keeps it from refusing any: set policy.nodeEnforcement=enforce, or webhook.outage=refuse" (trim (toString .Values.policy.nodeEnforcement))) -}}
{{- end -}}
{{- end -}}

{{/* CEL, for webhook.gpuNodeTaints: true where the pod in .object ("object" or "oldObject") could land on a GPU
node: it names a node (the kubelet admits a bound pod whatever its taints), it is for a scheduler other than
the default (which may not heed taints), or it tolerates every taint listed. A toleration is read wider than
the scheduler reads it (k8s.io/api/core/v1 Toleration.ToleratesTaint): an empty effect matches every
effect and an empty key every key, as there, but neither the operator nor the value is compared, so a pod
tolerating the key is in scope whatever value the nodes' taint has (a value given here is taken and not
used). "" where no taint is listed: every pod is in scope. Keys are held to Kubernetes' syntax, so nothing
of theirs can end a CEL string. */}}
{{- define "gpuguard.mayLandOnGpuNode" -}}
{{- $o := .object -}}
{{- $tolerates := list -}}
{{- if .root.Values.webhook.gpuNodeTaints -}}
{{- if not .root.Values.backstop.enabled -}}
{{- fail "webhook.gpuNodeTaints admits the pods that cannot land on a GPU node at failurePolicy Ignore, and only the backstop refuses the UPDATE that would later let one land there: it needs backstop.enabled=true" -}}
{{- end -}}
{{- if eq (.root.Values.webhook.outage | default "refuse") "node-enforcer" -}}
{{- fail "webhook.gpuNodeTaints narrows what an outage refuses under webhook.outage=refuse; under node-enforcer an outage refuses nothing and the backstop only warns: leave the list empty there" -}}
{{- end -}}
{{- end -}}
{{- range $i, $taint := (.root.Values.webhook.gpuNodeTaints | default list) -}}
{{- $where := printf "webhook.gpuNodeTaints[%d]" $i -}}
{{- if not (kindIs "map" $taint) -}}
{{- fail (printf "%s: want a taint, {key, value, effect}; got %v" $where $taint) -}}
{{- end -}}
{{- range $name, $_ := $taint -}}
{{- if not (has $name (list "key" "value" "effect")) -}}
{{- fail (printf "%s: unknown field %s; a taint has a key, a value and an effect" $where $name) -}}
{{- end -}}
{{- end -}}
{{- $key := toString ($taint.key | default "") -}}
{{- $effect := toString ($taint.effect | default "") -}}
{{- if not (regexMatch "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" $key) -}}
{{- fail (printf "%s.key: %q is not a taint key (a qualified name, such as nvidia.com/gpu)" $where $key) -}}
{{- end -}}
{{- if not (has $effect (list "NoSchedule" "NoExecute")) -}}
{{- fail (printf "%s.effect: %q; want NoSchedule or NoExecute, which keep pods that do not tolerate the taint off the node (PreferNoSchedule does not)" $where $effect) -}}
{{- end -}}
{{- $tolerates = append $tolerates (printf "(has(%[1]s.spec.tolerations) && %[1]s.spec.tolerations.exists(t, (!has(t.effect) || t.effect == '' || t.effect == '%[3]s') && (!has(t.key) || t.key == '' || t.key == '%[2]s')))" $o $key $effect) -}}
{{- end -}}
{{- if $tolerates -}}
(has({{ $o }}.spec.nodeName) && {{ $o }}.spec.nodeName != '') || (has({{ $o }}.spec.schedulerName) && {{ $o }}.spec.schedulerName != '' && {{ $o }}.spec.schedulerName != 'default-scheduler') || ({{ join " && " $tolerates }})
{{- end -}}
{{- end -}}

{{/* "true" when the backstop binding should be rendered denying now, as for the webhook configuration. */}}
{{- define "gpuguard.backstopArmed" -}}
{{- if not (include "gpuguard.outageRefuses" .) -}}
{{- else if not .Values.webhook.armAfterReady -}}
true
{{- else -}}
{{- $live := lookup "admissionregistration.k8s.io/v1" "ValidatingAdmissionPolicyBinding" "" (printf "%s-visible-devices" (include "gpuguard.fullname" .)) -}}
{{- if and $live (has "Deny" ($live.spec.validationActions | default list)) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when the post-install hook must arm something: the webhook configuration, or the backstop. */}}
{{- define "gpuguard.armingNeeded" -}}
{{- if .Values.webhook.armAfterReady -}}
{{- if and (include "gpuguard.outageRefuses" .) (or (and (eq .Values.webhook.failurePolicy "Fail") (not (include "gpuguard.webhookArmed" .))) (and .Values.backstop.enabled (not (include "gpuguard.backstopArmed" .)))) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The namespace where the arm hook creates its dry-run probe pod ("": none). A release whose values predate
the key (--reuse-values) probes in default too. */}}
{{- define "gpuguard.armProbeNamespace" -}}
{{- ternary .Values.webhook.armProbeNamespace "default" (hasKey .Values.webhook "armProbeNamespace") -}}
{{- end -}}

{{/* Why the probe namespace cannot show the API server calls the webhook (the first reason), or "": the
webhook does not cover it, or answers its probe pod without a word. An install refuses it (arm.yaml); an
armed release's upgrade is then not probed (gpuguard.armedUnprobed). */}}
{{- define "gpuguard.armProbeProblem" -}}
{{- $probe := include "gpuguard.armProbeNamespace" . -}}
{{- $problem := "" -}}
{{- if $probe -}}
{{- if eq $probe .Release.Namespace -}}
{{- $problem = printf "webhook.armProbeNamespace: %s is the release's own namespace, which the webhook never covers (so that it can always restart), so the probe pod there would never be reviewed and the install never armed; install into a namespace of its own (gpuguard-system), or name another probe namespace" $probe -}}
{{- else if has $probe (include "gpuguard.excludedNamespaces" . | fromJsonArray) -}}
{{- $problem = printf "webhook.armProbeNamespace: %s is a namespace the webhook never covers, so the probe pod there would never be reviewed and the install never armed; name one it covers (default), or set it empty to arm once a replica is available" $probe -}}
{{- else if hasKey (dig "metadata" "labels" dict (lookup "v1" "Namespace" "" $probe | default dict)) "gpuguard.io/ignore" -}}
{{- $problem = printf "webhook.armProbeNamespace: namespace %s is labelled gpuguard.io/ignore, which the webhook never covers, so the probe pod there would never be reviewed and the install never armed; name one it covers, or set it empty to arm once a replica is available" $probe -}}
{{- end -}}
{{- range regexSplit "[,\n]" (toString .Values.policy.exemptNamespaces) -1 -}}
{{- if and (not $problem) (eq (trim .) $probe) -}}
{{- $problem = printf "webhook.armProbeNamespace: %s is in policy.exemptNamespaces, so the webhook would answer the probe pod without patching it and the install would never be armed; name a namespace it covers, or set it empty to arm once a replica is available" $probe -}}
{{- end -}}
{{- end -}}
{{- /* The probe pod names no service account, so it runs as the namespace's default one. */ -}}
{{- range regexSplit "[,\n]" (toString .Values.policy.exemptServiceAccounts) -1 -}}
{{- if and (not $problem) (eq (trim .) (printf "%s/default" $probe)) -}}
{{- $problem = printf "webhook.armProbeNamespace: %s/default, the account the probe pod runs as, is in policy.exemptServiceAccounts, so the webhook would answer the probe pod without a word and the install would never be armed; name a namespace whose default account is not exempt, or set it empty to arm once a replica is available" $probe -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $problem -}}
{{- end -}}

{{/* "true" on a release the hook has armed already (nothing left to arm, and armed by the hook, not at
once). */}}
{{- define "gpuguard.armedByHook" -}}
{{- if and (not (include "gpuguard.armingNeeded" .)) .Values.webhook.armAfterReady (include "gpuguard.outageRefuses" .) (or (eq .Values.webhook.failurePolicy "Fail") .Values.backstop.enabled) -}}
true
{{- end -}}
{{- end -}}

{{/* Why an upgrade of a release armed by the hook is not probed, or "" (NOTES.txt says it): no probe
namespace, policy mode off (a webhook of chart 0.4.6 or earlier says nothing the probe recognises there,
and an upgrade that does not roll the webhook's Deployment, its image tag unchanged, leaves its replicas
answering; an install in mode off is probed, with no older replica to answer), or a probe namespace the
webhook does not cover or answers without a word now (during the break glass every namespace is labelled
gpuguard.io/ignore), which would fail every upgrade. */}}
{{- define "gpuguard.armedUnprobed" -}}
{{- if include "gpuguard.armedByHook" . -}}
{{- if not (include "gpuguard.armProbeNamespace" .) -}}
webhook.armProbeNamespace is empty
{{- else if eq .Values.policy.mode "off" -}}
policy mode off, in which a webhook of chart 0.4.6 or earlier, whose replicas an upgrade may leave answering, says nothing the probe recognises
{{- else if include "gpuguard.armProbeProblem" . -}}
the probe namespace {{ include "gpuguard.armProbeNamespace" . }} is one the webhook does not cover or answers without a word (excluded, labelled gpuguard.io/ignore as during the break glass, or exempt)
{{- end -}}
{{- end -}}
{{- end -}}

{{/* What the post-install, post-upgrade and post-rollback hook Job does: "arm" while something is left to arm;
"verify" on a release the hook has armed already, where it only shows, as when arming, that the API server
still calls the webhook (an upgrade after which it does not fails, and says so), unless
gpuguard.armedUnprobed says why not; "" else. */}}
{{- define "gpuguard.armHook" -}}
{{- if include "gpuguard.armingNeeded" . -}}
arm
{{- else if and (include "gpuguard.armedByHook" .) (not (include "gpuguard.armedUnprobed" .)) -}}
verify
{{- end -}}
{{- end -}}

{{/* GPU nodes as NVIDIA's chart finds them, each term also asking whether the GPU Operator deploys its own
device plugin there: (dict "operator" "NotIn") for gpuguard's plugin, "In" for the node report alone, ""
for every GPU node (the node enforcer). */}}
{{- define "gpuguard.gpuNodeTerms" -}}
{{- range list (list "feature.node.kubernetes.io/pci-10de.present" "true") (list "feature.node.kubernetes.io/cpu-model.vendor_id" "NVIDIA") (list "nvidia.com/gpu.present" "true") }}
- matchExpressions:
    - key: {{ index . 0 }}
      operator: In
      values: [{{ index . 1 | quote }}]
    {{- if $.operator }}
    - key: nvidia.com/gpu.deploy.device-plugin
      operator: {{ $.operator }}
      values: ["true"]
    {{- end }}
{{- end }}
{{- end -}}

{{/* "true" when the device plugin's config shares GPUs with MPS (devicePlugin.config.sharing.mps), else "". */}}
{{- define "gpuguard.mps" -}}
{{- if and .Values.devicePlugin.enabled (dig "sharing" "mps" "" .Values.devicePlugin.config) -}}true{{- end -}}
{{- end -}}

{{/* A PodDisruptionBudget's minAvailable (a number, or a percentage that Kubernetes rounds up), refused at
render when it keeps every replica: a drain of their nodes could then never evict one, and would wait for
ever. Takes .what (the values' section), .replicas and .minAvailable. */}}
{{- define "gpuguard.minAvailable" -}}
{{- $replicas := int .replicas -}}
{{- $kept := 0 -}}
{{- if and (kindIs "string" .minAvailable) (hasSuffix "%" .minAvailable) -}}
{{- $kept = div (add (mul $replicas (trimSuffix "%" .minAvailable | int)) 99) 100 -}}
{{- else -}}
{{- $kept = int .minAvailable -}}
{{- end -}}
{{- if ge (int $kept) $replicas -}}
{{- fail (printf "%s.podDisruptionBudget.minAvailable %v keeps all %d of %s.replicas, so no drain of their nodes could ever evict one: raise %s.replicas, or lower minAvailable" .what .minAvailable $replicas .what .what) -}}
{{- end -}}
{{- .minAvailable -}}
{{- end -}}

{{/* "true" unless checkPodSecurity is false; absent (--reuse-values from a chart before it) is true. */}}
{{- define "gpuguard.checksPodSecurity" -}}
{{- if ne (toString .Values.checkPodSecurity) "false" }}true{{ end -}}
{{- end -}}

{{/* The Pod Security level the release's namespace enforces by its label, "" when it has none or the
namespace cannot be looked up (helm template): the install check and the notes read it. */}}
{{- define "gpuguard.enforcedPodSecurity" -}}
{{- $namespace := lookup "v1" "Namespace" "" .Release.Namespace -}}
{{- dig "metadata" "labels" "pod-security.kubernetes.io/enforce" "" ($namespace | default dict) -}}
{{- end -}}

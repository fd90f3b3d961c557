#pragma once
// What gpuguard enforces, as the gpuguard-policy ConfigMap says: pure data plus its parser, shared by the
// webhook's admission core, the backstop's tests and the scheduler extender (gpuResources). Reading the
// ConfigMap from disk and watching it is policy_watcher's.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::policy {

enum class Mode {
  enforce,  // patch
  strict,   // patch, and deny pods that set NVIDIA_VISIBLE_DEVICES themselves
  audit,    // never patch or deny; report what enforce would have done
  off,      // allow everything untouched
};

// What to do about a door to the GPUs other than the environment: say nothing, warn (and annotate the
// audit log), or refuse the pod.
enum class Action { allow, warn, deny };

// What gpuguard-node-enforcer does at each container's creation: give it exactly the GPUs the kubelet
// allocated it (changing NVIDIA_VISIBLE_DEVICES, refusing device nodes beyond them), only count and
// report what it would do, or nothing.
enum class NodeEnforcement { enforce, audit, off };

// What gpuguard-node-enforcer does with a container that reaches a GPU when it cannot prove the GPU is the
// container's: the kubelet's allocation unreadable, the node's GPUs unreadable, a MIG device it cannot
// map, more of a list than it reads, or its own error. Refuse (the kubelet tries the create again), or
// let it be created as it is.
enum class NodeEnforcementUnknown { refuse, allow };

// What the webhook does with a variable by which a container holding a share of a GPU could undo what
// the device plugin chose for the share: remove it, refuse the pod, or leave it.
enum class SharingEnv { strip, deny, allow };

struct Policy {
  Mode mode = Mode::enforce;
  // The value injected into every container that does not ask for a GPU: "none" or "void".
  std::string visible_devices_value = "none";
  // Resource names that count as a GPU; a trailing '*' makes the entry a prefix match.
  std::vector<std::string> gpu_resources = {"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"};
  std::vector<std::string> exempt_namespaces;
  std::vector<std::string> exempt_service_accounts;  // "namespace/name"
  // Pod annotations with which fractional-GPU schedulers (KAI-Scheduler, Run:ai) ask for a share of a
  // GPU: the container they deliver it to counts as a GPU user, its NVIDIA_VISIBLE_DEVICES valueFrom kept.
  std::vector<std::string> gpu_annotations = {"gpu-fraction", "gpu-memory"};
  // DRA device classes that are GPUs, for containers that get devices through resources.claims.
  std::vector<std::string> gpu_device_classes = {"gpu.nvidia.com", "mig.nvidia.com"};
  // For any privileged container: it sees every GPU on the node, whatever it asked for and whatever
  // its env says.
  Action privileged = Action::warn;
  // A container without a GPU that mounts the host's GPU device nodes (/dev/nvidia*, /dev/dri, /dev
  // itself or a directory above them) or the toolkit's device lists (/var/run/nvidia-container-devices,
  // /run/nvidia) through a hostPath volume.
  Action host_device_mounts = Action::warn;
  // A pod with a container without a GPU and a cdi.k8s.io/ annotation, which names CDI devices directly.
  Action cdi_annotations = Action::warn;
  // A container without a GPU for which a nvidia.cdi.k8s.io annotation names CDI devices: the NVIDIA
  // Container Toolkit's NRI plugin (which the GPU Operator can run) injects them, whatever its env says.
  Action nvidia_cdi_annotations = Action::warn;
  // A container without a GPU whose env sets NVIDIA_GDS, NVIDIA_MOFED, NVIDIA_NVSWITCH, NVIDIA_GDRCOPY or
  // NVIDIA_IMEX_CHANNELS so that the NVIDIA runtime adds those devices, as it does under
  // NVIDIA_VISIBLE_DEVICES=none (not under void).
  Action feature_env_vars = Action::warn;
  // runtimeClassName values that bypass the NVIDIA hook, or are the hook, on a pod with a container
  // without a GPU; empty: nothing is checked. By default the GPU Operator's: it runs NVIDIA's runtime as
  // the class nvidia, not as the node's default, so a GPU-less pod that names it asks for that runtime.
  std::vector<std::string> runtime_classes{"nvidia"};
  Action runtime_class_action = Action::warn;
  // A user-set NVIDIA_VISIBLE_DEVICES in a GPU container would override the device plugin's choice.
  bool strip_user_value_from_gpu_containers = true;
  // Resource names (exact, or a prefix with '*') that are shares of a GPU whose limits a client's own
  // variables could loosen: gpuguard's MPS replicas. None by default, so the variables users set on
  // NVIDIA's own shares (nvidia.com/gpu.shared) stay theirs; the chart lists the resources its device
  // plugin serves through MPS (docs/policy.md#sharedgpuresources).
  std::vector<std::string> shared_gpu_resources;
  // A container holding one that sets CUDA_VISIBLE_DEVICES, CUDA_DISABLE_CONTROL or a CUDA_MPS_* variable
  // itself: the pod's env comes after the device plugin's, so its value would win.
  SharingEnv sharing_env_vars = SharingEnv::strip;
  // gpuguard-node-enforcer's mode, and the GPU infrastructure it leaves alone besides what the webhook
  // exempts: namespaces, and namespace/serviceaccount pairs (the driver, the toolkit, dcgm-exporter, the
  // device plugins), such as those of namespaces the webhook never sees.
  NodeEnforcement node_enforcement = NodeEnforcement::enforce;
  std::vector<std::string> node_enforcement_exempt_namespaces;
  // "namespace/name", or "namespace/name:key=value": that account's pods carrying that label.
  std::vector<std::string> node_enforcement_exempt_service_accounts;
  NodeEnforcementUnknown node_enforcement_unknown = NodeEnforcementUnknown::refuse;
  // The pod annotation with which the runtime's NRI validator lets a pod start while a required plugin
  // (gpuguard-node-enforcer, under fail-closed) is missing: the webhook refuses it on every pod it
  // covers. Empty: not checked.
  std::string nri_toleration_annotation = "tolerate-missing-nri-plugins.noderesource.dev";

  bool is_gpu_resource(std::string_view resource_name) const;
  bool is_shared_gpu_resource(std::string_view resource_name) const;
  bool is_gpu_device_class(std::string_view device_class) const;
  // `service_account` empty means the pod names none, i.e. "default".
  bool is_exempt(std::string_view pod_namespace, std::string_view service_account) const;
  // For gpuguard-node-enforcer: what the webhook exempts, and the nodeEnforcementExempt keys.
  // `service_account` empty: unknown, so only the namespace can exempt; `pod_labels` nullptr: unknown, so
  // an entry that requires a label does not.
  bool is_node_enforcement_exempt(std::string_view pod_namespace, std::string_view service_account,
                                  const std::map<std::string, std::string>* pod_labels = nullptr) const;
  // Whether some namespace/serviceaccount entry could exempt a pod of this namespace with these labels, by
  // its account: only then is the account worth a look (the enforcer asks the API server for it). An entry
  // that requires a label the pod does not carry exempts it under no account.
  bool names_service_accounts_for(std::string_view pod_namespace,
                                  const std::map<std::string, std::string>& pod_labels) const;
  // The labelled nodeEnforcementExempt entry ("namespace/name:key=value") whose label the pod carries in
  // another namespace: GPU infrastructure, NVIDIA's chart say, running where the admin did not list it, and
  // so enforced as any pod. Empty when there is none.
  std::string unlisted_infrastructure(std::string_view pod_namespace,
                                      const std::map<std::string, std::string>& pod_labels) const;
};

std::string_view mode_name(Mode mode);
std::string_view node_enforcement_name(NodeEnforcement mode);
std::string_view node_enforcement_unknown_name(NodeEnforcementUnknown action);

// The ConfigMap keys, one file each: mode, visibleDevicesValue, gpuResources, gpuAnnotations,
// gpuDeviceClasses, exemptNamespaces, exemptServiceAccounts, privileged, hostDeviceMounts, cdiAnnotations,
// nvidiaCdiAnnotations, featureEnvVars, runtimeClasses, runtimeClassAction, stripUserValueFromGpuContainers,
// sharedGpuResources, sharingEnvVars, nodeEnforcement, nodeEnforcementExemptNamespaces,
// nodeEnforcementExemptServiceAccounts, nodeEnforcementUnknown, nriTolerationAnnotation.
struct PolicyParse {
  std::optional<Policy> policy;           // empty when any value is invalid: the whole policy is refused
  std::string error;                      // names the key and what is wrong with it
  std::vector<std::string> unknown_keys;  // ignored, for the caller to log
};

// Values are trimmed; lists are comma- or newline-separated. Missing keys keep their defaults.
PolicyParse parse_policy(const std::map<std::string, std::string>& files);

// The policy in force now; each request takes one and keeps it for its whole answer.
using PolicyProvider = std::function<std::shared_ptr<const Policy>()>;

}  // namespace gpuguard::policy

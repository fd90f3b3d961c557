#pragma once
// The facts the decoder extracts from an AdmissionReview. Its strings are views into the simdjson parser's
// document, so a model lives only inside one review() call.
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::admission {

inline constexpr std::string_view kVisibleDevices = "NVIDIA_VISIBLE_DEVICES";
// The variables with which the NVIDIA runtime adds devices besides GPUs (nvidia-container-toolkit's
// feature-gated modifier: GPUDirect Storage, MOFED, NVSwitch, GDRCopy; and IMEX channels). It honours them
// in any container whose NVIDIA_VISIBLE_DEVICES selects something, `none` included, and not under `void`.
inline constexpr std::array<std::string_view, 5> kFeatureVariables = {"NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH",
                                                                      "NVIDIA_GDRCOPY", "NVIDIA_IMEX_CHANNELS"};
inline constexpr std::string_view kImexChannels = "NVIDIA_IMEX_CHANNELS";
inline constexpr std::string_view kMirrorPodAnnotation = "kubernetes.io/config.mirror";

// The input is not an AdmissionReview we can answer; the message becomes the HTTP 400 reason.
struct DecodeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ContainerList { init, regular, ephemeral };

struct ContainerListNames {
  std::string_view field;  // in the Pod spec and in JSON Patch paths
  std::string_view human;  // in warnings and denials
  std::string_view path;   // in decode errors
};

constexpr ContainerListNames names_of(ContainerList list) {
  switch (list) {
    case ContainerList::init: return {"initContainers", "init container", "request.object.spec.initContainers[]"};
    case ContainerList::ephemeral:
      return {"ephemeralContainers", "ephemeral container", "request.object.spec.ephemeralContainers[]"};
    case ContainerList::regular: break;
  }
  return {"containers", "container", "request.object.spec.containers[]"};
}

struct VisibleDevicesEntry {
  std::size_t env_index = 0;
  bool has_value = false;
  std::string_view value;
  bool has_value_from = false;
};

// An env entry that sets one of kFeatureVariables.
struct FeatureEntry {
  std::string_view name;
  std::string_view value;
  bool has_value_from = false;
};

// An env entry that sets a variable of GPU sharing: CUDA_VISIBLE_DEVICES, CUDA_DISABLE_CONTROL or
// CUDA_MPS_* (is_sharing_variable).
struct SharingEntry {
  std::size_t env_index = 0;
  std::string_view name;
};

inline bool is_sharing_variable(std::string_view name) {
  return name == "CUDA_VISIBLE_DEVICES" || name == "CUDA_DISABLE_CONTROL" || name.starts_with("CUDA_MPS_");
}

// An envFrom source: every key of the ConfigMap or Secret, with the prefix in front, becomes a variable.
struct EnvFromSource {
  std::string_view kind;  // "configMap" or "secret"
  std::string_view name;
  std::string_view prefix;
};

struct ResourceAmount {
  std::string_view name;
  bool nonzero = false;
  bool limit = false;  // from limits (else requests)
};

// resources.claims[] of a container: one of the pod's resourceClaims, and optionally one request of it.
struct ClaimUse {
  std::string_view name;
  std::string_view request;  // empty: every request of the claim
};

struct Container {
  ContainerList list = ContainerList::regular;
  std::size_t index = 0;
  std::string_view name;
  bool privileged = false;
  bool env_is_array = false;  // false: absent or null
  std::size_t env_size = 0;
  std::vector<VisibleDevicesEntry> visible_devices;  // every env entry named NVIDIA_VISIBLE_DEVICES
  std::vector<FeatureEntry> feature_variables;       // every env entry named one of kFeatureVariables, in order
  std::vector<SharingEntry> sharing_variables;       // every env entry that is_sharing_variable, in order
  std::vector<EnvFromSource> env_from;
  std::vector<ResourceAmount> resources;  // limits and requests together
  std::vector<ClaimUse> claims;
  std::vector<std::string_view> volume_mounts;  // volumeMounts[].name, read only when the pod has hostPath volumes
};

struct Annotation {
  std::string_view key;
  std::string_view value;
};

// spec.resourceClaims[]: a name the containers use, for a ResourceClaim or a ResourceClaimTemplate.
struct PodClaim {
  std::string_view name;
  std::string_view claim;           // resourceClaimName
  std::string_view claim_template;  // resourceClaimTemplateName
};

struct HostPathVolume {
  std::string_view name;
  std::string_view path;
};

struct Pod {
  bool mirror = false;
  std::string_view service_account;  // spec.serviceAccountName; empty when absent
  std::string_view scheduler;        // spec.schedulerName; empty when absent
  std::string_view runtime_class;    // spec.runtimeClassName; empty when absent
  std::vector<Annotation> annotations;
  std::vector<PodClaim> resource_claims;
  std::vector<HostPathVolume> host_paths;  // the hostPath volumes of spec.volumes
  std::vector<Container> containers;
};

struct Review {
  std::string_view api_version;
  std::string_view uid;
  std::string_view operation;
  std::string_view kind_group;
  std::string_view kind;
  std::string_view sub_resource;
  std::string_view namespace_;  // request.namespace: set on CREATE even when the Pod's metadata has none
  bool has_pod = false;         // `object` was decoded as a Pod (only for the reviews we may mutate)
  Pod pod;
  std::vector<std::string_view> old_ephemeral_names;  // UPDATE pods/ephemeralcontainers: already running
};

}  // namespace gpuguard::admission

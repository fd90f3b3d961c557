#pragma once
// Where gpuguard-node-enforcer's truth about a container's GPUs comes from: the kubelet, never the pod's
// author. First the kubelet's pod-resources API (what each device plugin and DRA claim gave each
// container); where it does not list the container (an init or ephemeral container) or cannot be read,
// the annotation gpuguard's device plugin sets through Allocate, which the kubelet puts on the container,
// trusted only where the runtime shows it apart from the pod's own annotations. Pure: the kubelet's answer
// and the runtime's view come in as plain data.
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/enforcement/decision.hpp"
#include "gpuguard/policy/policy.hpp"

namespace gpuguard::enforcement {

// The annotation gpuguard's device plugin puts on each container it allocates GPUs to: their IDs,
// comma-separated.
inline constexpr std::string_view kAllocatedAnnotation = "gpuguard.io/allocated-gpus";
// CRI-O copies every pod annotation into the container's; this one of its own holds the container's
// CRI annotations alone, as JSON.
inline constexpr std::string_view kCrioContainerAnnotations = "io.kubernetes.cri-o.Annotations";

// The kubelet's pod-resources answer for one pod.
struct PodResources {
  struct Devices {
    std::string resource;
    std::vector<std::string> ids;
  };
  struct Container {
    std::string name;
    std::vector<Devices> devices;
    std::vector<std::string> cdi_devices;  // of its DRA claims
  };
  std::vector<Container> containers;
  // Not empty: the kubelet's entry for the pod is over what the enforcer reads (pod_resources_reader.hpp),
  // and says why: its allocation cannot be judged.
  std::string unreadable;
};

struct KubeletAnswer {
  bool answered = false;            // false: pod-resources could not be read (`error` says why)
  std::optional<PodResources> pod;  // nullopt: the kubelet lists no resources for the pod
  std::string error;
};

// The allocated GPU IDs the annotation trustworthily carries (see above), or nullopt: on CRI-O (`crio`: the
// runtime said so at registration), the value in its copy of the container's own annotations; on
// containerd, the container's, unless the pod carries the key too (an admin's pod_annotations passes a pod's
// on, which is the pod author's), and never where CRI-O's key is there (the pod's too, passed on).
std::optional<std::string> trusted_annotation(const ContainerView& container, bool crio);

// The allocation of `container` (its name, in the pod the answer is for): its GPUs from the resources the
// policy counts as GPUs (gpuResources), a time-sliced replica as its GPU, and its DRA claims' CDI devices.
Allocation allocation_for(const KubeletAnswer& kubelet, const std::string& container,
                          const std::optional<std::string>& annotation, const policy::Policy& policy);

}  // namespace gpuguard::enforcement

// The kubelet's allocation of a container (include/gpuguard/enforcer/allocation.hpp).
#include "gpuguard/enforcer/allocation.hpp"

#include <nlohmann/json.hpp>

namespace gpuguard::enforcer {
namespace {

std::string normalized(std::string id) {
  const std::size_t replica = id.find("::");
  if (replica != std::string::npos) id.erase(replica);
  return id;
}

void add(const PodResources::Container& from, const policy::Policy& policy, Allocation& allocation) {
  for (const auto& devices : from.devices) {
    if (!policy.is_gpu_resource(devices.resource)) continue;
    for (const std::string& id : devices.ids) allocation.gpus.insert(normalized(id));
  }
  allocation.cdi_devices.insert(from.cdi_devices.begin(), from.cdi_devices.end());
}

}  // namespace

std::optional<std::string> trusted_annotation(const std::map<std::string, std::string>& container_annotations,
                                              const std::map<std::string, std::string>& pod_annotations) {
  const std::string key(kAllocatedAnnotation);
  const auto crio = container_annotations.find(std::string(kCrioContainerAnnotations));
  if (crio != container_annotations.end()) {
    // CRI-O: the container's own CRI annotations, apart from the pod's.
    const auto own = nlohmann::json::parse(crio->second, nullptr, false);
    if (!own.is_object()) return std::nullopt;
    const auto value = own.find(key);
    return value != own.end() && value->is_string() ? std::optional<std::string>(value->get<std::string>())
                                                    : std::nullopt;
  }
  // containerd shows the container's CRI annotations, and a pod annotation only where an admin passes it
  // through (pod_annotations in its runtime config): one the pod carries too may be the pod author's.
  if (pod_annotations.contains(key)) return std::nullopt;
  const auto value = container_annotations.find(key);
  return value != container_annotations.end() ? std::optional<std::string>(value->second) : std::nullopt;
}

Allocation allocation_for(const KubeletAnswer& kubelet, const std::string& container,
                          const std::optional<std::string>& annotation, const policy::Policy& policy) {
  Allocation allocation;
  const auto from_annotation = [&](const std::string& why) {
    allocation.source = Allocation::Source::plugin_annotation;
    std::size_t start = 0;
    while (start <= annotation->size()) {
      const std::size_t end = std::min(annotation->find(',', start), annotation->size());
      if (end > start) allocation.gpus.insert(normalized(annotation->substr(start, end - start)));
      start = end + 1;
    }
    allocation.detail = why + "; gpuguard's device plugin's annotation on the container";
  };
  if (!kubelet.answered) {
    if (annotation) {
      from_annotation("pod-resources: " + kubelet.error);
    } else {
      allocation.detail = "pod-resources: " + kubelet.error;
    }
    return allocation;
  }
  allocation.source = Allocation::Source::pod_resources;
  if (!kubelet.pod) {
    allocation.detail = "the kubelet lists no resources for the pod";
    return allocation;
  }
  for (const auto& listed : kubelet.pod->containers) {
    if (listed.name != container) continue;
    add(listed, policy, allocation);
    allocation.detail = "the kubelet's pod-resources";
    return allocation;
  }
  // An init or ephemeral container, which pod-resources never lists.
  if (annotation) {
    from_annotation("pod-resources does not list the container");
    return allocation;
  }
  allocation.source = Allocation::Source::pod_union;
  for (const auto& listed : kubelet.pod->containers) add(listed, policy, allocation);
  allocation.detail = "pod-resources does not list the container (an init or ephemeral container): its pod's";
  return allocation;
}

}  // namespace gpuguard::enforcer

// The kubelet's allocation of a container (include/gpuguard/enforcement/allocation.hpp).
#include "gpuguard/enforcement/allocation.hpp"

namespace gpuguard::enforcement {
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

std::optional<std::string> trusted_annotation(const ContainerView& container, bool crio) {
  if (container.crio_annotations) return crio ? container.allocated_annotation : std::nullopt;
  if (container.allocated_annotation_on_pod) return std::nullopt;
  return container.allocated_annotation;
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
  if (kubelet.pod && !kubelet.pod->unreadable.empty()) {
    allocation.detail = "pod-resources: " + kubelet.pod->unreadable;
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

}  // namespace gpuguard::enforcement

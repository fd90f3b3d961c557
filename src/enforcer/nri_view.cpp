// NRI's messages to and from the decision's plain data (include/gpuguard/enforcer/nri_view.hpp).
#include "gpuguard/enforcer/nri_view.hpp"

#include "nri/v1alpha1/api.pb.h"

namespace gpuguard::enforcer {

namespace api = ::nri::pkg::api::v1alpha1;

ContainerView view_of(const api::PodSandbox& pod, const api::Container& container) {
  ContainerView view;
  view.pod_namespace = pod.namespace_();
  view.pod_name = pod.name();
  view.pod_uid = pod.uid();
  view.container = container.name();
  view.pod_labels.insert(pod.labels().begin(), pod.labels().end());
  view.env.assign(container.env().begin(), container.env().end());
  for (const api::Mount& mount : container.mounts()) {
    view.mounts.push_back(
        {mount.destination(), mount.source(), mount.type(), {mount.options().begin(), mount.options().end()}});
  }
  for (const api::LinuxDevice& device : container.linux().devices()) {
    view.devices.push_back({device.path(), device.type(), device.major(), device.minor()});
  }
  for (const api::CDIDevice& device : container.cdi_devices()) view.cdi_devices.push_back(device.name());
  for (const api::LinuxDeviceCgroup& rule : container.linux().resources().devices()) {
    // "a" (or no type) with no major and minor: every device, as a privileged container's cgroup has it.
    if (rule.allow() && (rule.type().empty() || rule.type() == "a") && !rule.has_major() && !rule.has_minor()) {
      view.all_devices_allowed = true;
    }
  }
  return view;
}

std::map<std::string, std::string> annotations_of(const api::PodSandbox& pod) {
  return {pod.annotations().begin(), pod.annotations().end()};
}

std::map<std::string, std::string> annotations_of(const api::Container& container) {
  return {container.annotations().begin(), container.annotations().end()};
}

std::unique_ptr<api::CreateContainerResponse> visible_devices_adjustment(const std::string& value) {
  auto response = std::make_unique<api::CreateContainerResponse>();
  auto* removal = response->mutable_adjust()->add_env();
  removal->set_key("-NVIDIA_VISIBLE_DEVICES");
  auto* set = response->mutable_adjust()->add_env();
  set->set_key("NVIDIA_VISIBLE_DEVICES");
  set->set_value(value);
  return response;
}

}  // namespace gpuguard::enforcer

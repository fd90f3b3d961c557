#pragma once
// NRI's messages as the decision reads them (decision.hpp's ContainerView), and the adjustment it sends
// back: the one place that knows both NRI's protobuf and the pure core.
#include <map>
#include <memory>
#include <string>

#include "gpuguard/enforcer/decision.hpp"

namespace nri::pkg::api::v1alpha1 {
class PodSandbox;
class Container;
class CreateContainerResponse;
}  // namespace nri::pkg::api::v1alpha1

namespace gpuguard::enforcer {

ContainerView view_of(const ::nri::pkg::api::v1alpha1::PodSandbox& pod,
                      const ::nri::pkg::api::v1alpha1::Container& container);

std::map<std::string, std::string> annotations_of(const ::nri::pkg::api::v1alpha1::PodSandbox& pod);
std::map<std::string, std::string> annotations_of(const ::nri::pkg::api::v1alpha1::Container& container);

// NVIDIA_VISIBLE_DEVICES set to `value`. The removal first makes gpuguard the key's owner even where a
// plugin before it set the key (NRI refuses two plugins setting one key); NRI drops a removal without a
// set after it, so the two always go together.
std::unique_ptr<::nri::pkg::api::v1alpha1::CreateContainerResponse> visible_devices_adjustment(
    const std::string& value);

}  // namespace gpuguard::enforcer

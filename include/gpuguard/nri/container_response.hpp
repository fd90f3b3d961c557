#pragma once
// The node enforcer's answer to a CreateContainer as NRI's protobuf: the only NRI message it writes beyond
// the plugin's own (src/nri/plugin.cpp), kept apart from container_view.hpp's reading so that the reading
// stays free of protobuf's library, for the fuzzers.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace nri::pkg::api::v1alpha1 {
class CreateContainerResponse;
}  // namespace nri::pkg::api::v1alpha1

namespace gpuguard::nri {

// The variables set, and the masks mounted (an empty read-only tmpfs at each, enforcement::kMaskOptions):
// each removed, then set. The removal first makes gpuguard the key's or the destination's owner even where a
// plugin before it set it (NRI refuses two plugins setting one); NRI drops a removal without a set after
// it, so the two always go together. `mask_hook`, where not empty, is the mask check's argv (path first),
// added as a createRuntime hook (enforcement/mask_hook.hpp).
std::unique_ptr<::nri::pkg::api::v1alpha1::CreateContainerResponse> adjustment(
    const std::map<std::string, std::string>& set_env, const std::set<std::string>& masks = {},
    const std::vector<std::string>& mask_hook = {});

}  // namespace gpuguard::nri

#pragma once
// The node enforcer's answer to a CreateContainer as NRI's protobuf: the only NRI message it writes beyond
// the plugin's own (src/nri/plugin.cpp), kept apart from container_view.hpp's reading so that the reading
// stays free of protobuf's library, for the fuzzers.
#include <map>
#include <memory>
#include <string>

namespace nri::pkg::api::v1alpha1 {
class CreateContainerResponse;
}  // namespace nri::pkg::api::v1alpha1

namespace gpuguard::nri {

// The variables set: each removed, then set. The removal first makes gpuguard the key's owner even where a
// plugin before it set the key (NRI refuses two plugins setting one key); NRI drops a removal without a set
// after it, so the two always go together.
std::unique_ptr<::nri::pkg::api::v1alpha1::CreateContainerResponse> env_adjustment(
    const std::map<std::string, std::string>& set_env);

}  // namespace gpuguard::nri

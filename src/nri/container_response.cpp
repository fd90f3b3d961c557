// The node enforcer's answer to a CreateContainer (include/gpuguard/nri/container_response.hpp).
#include "gpuguard/nri/container_response.hpp"

#include "nri/v1alpha1/api.pb.h"

namespace gpuguard::nri {

std::unique_ptr<::nri::pkg::api::v1alpha1::CreateContainerResponse> env_adjustment(
    const std::map<std::string, std::string>& set_env) {
  auto response = std::make_unique<::nri::pkg::api::v1alpha1::CreateContainerResponse>();
  for (const auto& [name, value] : set_env) {
    response->mutable_adjust()->add_env()->set_key("-" + name);
    auto* set = response->mutable_adjust()->add_env();
    set->set_key(name);
    set->set_value(value);
  }
  return response;
}

}  // namespace gpuguard::nri

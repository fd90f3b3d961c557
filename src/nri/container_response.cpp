// The node enforcer's answer to a CreateContainer (include/gpuguard/nri/container_response.hpp).
#include "gpuguard/nri/container_response.hpp"

#include "gpuguard/enforcement/decision.hpp"
#include "gpuguard/enforcement/mask_hook.hpp"
#include "nri/v1alpha1/api.pb.h"

namespace gpuguard::nri {

std::unique_ptr<::nri::pkg::api::v1alpha1::CreateContainerResponse> adjustment(
    const std::map<std::string, std::string>& set_env, const std::set<std::string>& masks,
    const std::vector<std::string>& mask_hook) {
  auto response = std::make_unique<::nri::pkg::api::v1alpha1::CreateContainerResponse>();
  for (const auto& [name, value] : set_env) {
    response->mutable_adjust()->add_env()->set_key("-" + name);
    auto* set = response->mutable_adjust()->add_env();
    set->set_key(name);
    set->set_value(value);
  }
  for (const std::string& at : masks) {
    response->mutable_adjust()->add_mounts()->set_destination("-" + at);
    auto* mask = response->mutable_adjust()->add_mounts();
    mask->set_destination(at);
    mask->set_type("tmpfs");
    mask->set_source("tmpfs");
    for (const std::string_view option : enforcement::kMaskOptions) mask->add_options(std::string(option));
  }
  if (!mask_hook.empty()) {
    auto* hook = response->mutable_adjust()->mutable_hooks()->add_create_runtime();
    hook->set_path(mask_hook.front());
    for (const std::string& arg : mask_hook) hook->add_args(arg);
    hook->mutable_timeout()->set_value(enforcement::kMaskHookTimeoutSeconds);
  }
  return response;
}

}  // namespace gpuguard::nri

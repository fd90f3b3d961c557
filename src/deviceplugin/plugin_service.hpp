#pragma once
// The whole device plugin at run time: discovery, the resources the config makes of it, their gRPC
// servers and kubelet registration, health, and the status server, until SIGTERM or SIGINT.
#include <optional>
#include <string>
#include <vector>

#include "gpuguard/deviceplugin/config.hpp"
#include "gpuguard/kube/api_server.hpp"

namespace gpuguard::deviceplugin {

// Throws std::runtime_error when it cannot start (the reason is logged by cli::run_service). `apiserver`
// is where the Node condition goes, when config.node_name names one.
void serve(const PluginConfig& config, const std::vector<std::string>& config_warnings,
           const std::optional<kube::ApiServer>& apiserver);

}  // namespace gpuguard::deviceplugin

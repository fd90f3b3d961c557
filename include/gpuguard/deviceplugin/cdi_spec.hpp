#pragma once
// The CDI spec that makes the cdi-cri and cdi-annotations strategies work without nvidia-ctk: one CDI
// device per GPU and MIG device the plugin advertises, with its device nodes, and the driver's control
// nodes for every container. The driver's libraries, binaries and firmware, and the toolkit's hooks, are
// not in it: they cannot be derived without the driver's own files (docs/device-plugin.md#cdi).
#include <filesystem>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpuguard/deviceplugin/gpu_resource.hpp"

namespace gpuguard::deviceplugin {

nlohmann::json cdi_spec(std::string_view kind, const std::vector<GpuUnit>& units,
                        const std::vector<std::string>& control_nodes);

// Writes <root>/<vendor>-<class>.json (k8s.gpuguard.io-gpu.json): to a temporary file in the same
// directory, then renamed over the old one, so that a runtime never reads half a spec. Returns its path;
// throws std::runtime_error with the reason.
std::filesystem::path write_cdi_spec(const std::filesystem::path& root, const nlohmann::json& spec);

}  // namespace gpuguard::deviceplugin

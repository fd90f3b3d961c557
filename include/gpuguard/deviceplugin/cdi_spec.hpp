#pragma once
// The CDI spec that makes the cdi-cri and cdi-annotations strategies work without nvidia-ctk: one CDI
// device per GPU and MIG device the plugin advertises, with its device nodes; `all`, with every one of
// them; `none`, with none (the names NVIDIA's runtime asks for in cdi mode); and the driver's control
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

// A spec of another kind (the node's NVIDIA runtime's default, nvidia.com/gpu) with the one device
// `none`, for nodes whose specs lack it: nvidia-ctk's generated specs do.
nlohmann::json none_spec(std::string_view kind);

// The prefix of the file none_spec is written to, beside the other vendor's specs.
inline constexpr std::string_view kNoneSpecPrefix = "gpuguard-none-";

// <root>/<prefix><vendor>-<class>.json for a spec of `kind` (<vendor>/<class>): k8s.gpuguard.io-gpu.json.
std::filesystem::path cdi_spec_path(const std::filesystem::path& root, std::string_view kind,
                                    std::string_view prefix = {});

// Writes the spec to cdi_spec_path(root, its kind, prefix): to a temporary file in the same directory,
// then renamed over the old one, so that a runtime never reads half a spec. Returns its path; throws
// std::runtime_error with the reason.
std::filesystem::path write_cdi_spec(const std::filesystem::path& root, const nlohmann::json& spec,
                                     std::string_view prefix = {});

}  // namespace gpuguard::deviceplugin

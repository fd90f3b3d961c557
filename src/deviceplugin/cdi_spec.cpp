#include "gpuguard/deviceplugin/cdi_spec.hpp"

#include <algorithm>
#include <stdexcept>

#include "gpuguard/files/write_file.hpp"

namespace gpuguard::deviceplugin {
namespace {

// The oldest CDI version with everything the spec uses, so that older runtimes read it too.
constexpr const char* kCdiVersion = "0.5.0";

nlohmann::json device_nodes(const std::vector<std::string>& paths) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const std::string& path : paths) nodes.push_back({{"path", path}});  // the runtime stats the host's node
  return nodes;
}

// CDI forbids a device without edits, so none sets a variable that means nothing, as the toolkit's own
// jit-cdi none device does.
nlohmann::json none_device() { return {{"name", "none"}, {"containerEdits", {{"env", {"GPUGUARD_EMPTY_DEVICE="}}}}}; }

}  // namespace

nlohmann::json cdi_spec(std::string_view kind, const std::vector<GpuUnit>& units,
                        const std::vector<std::string>& control_nodes) {
  nlohmann::json devices = nlohmann::json::array();
  std::vector<std::string> every_node;
  for (const GpuUnit& unit : units) {
    devices.push_back(
        {{"name", cdi_device_name(unit.uuid)}, {"containerEdits", {{"deviceNodes", device_nodes(unit.device_nodes)}}}});
    for (const std::string& node : unit.device_nodes) {
      if (std::find(every_node.begin(), every_node.end(), node) == every_node.end()) every_node.push_back(node);
    }
  }
  // What NVIDIA's runtime asks for in cdi mode when the image says NVIDIA_VISIBLE_DEVICES=all or the
  // webhook says none: <kind>=all and <kind>=none. Without a device named none, creating any container
  // without a GPU fails there.
  if (!every_node.empty()) {
    devices.push_back({{"name", "all"}, {"containerEdits", {{"deviceNodes", device_nodes(every_node)}}}});
  }
  devices.push_back(none_device());
  nlohmann::json spec = {{"cdiVersion", kCdiVersion}, {"kind", kind}, {"devices", std::move(devices)}};
  if (!control_nodes.empty()) spec["containerEdits"] = {{"deviceNodes", device_nodes(control_nodes)}};
  return spec;
}

nlohmann::json none_spec(std::string_view kind) {
  return {{"cdiVersion", kCdiVersion}, {"kind", kind}, {"devices", nlohmann::json::array({none_device()})}};
}

std::filesystem::path cdi_spec_path(const std::filesystem::path& root, std::string_view kind, std::string_view prefix) {
  std::string name(kind);
  name[name.find('/')] = '-';
  name.insert(0, prefix);
  return root / (name + ".json");
}

std::filesystem::path write_cdi_spec(const std::filesystem::path& root, const nlohmann::json& spec,
                                     std::string_view prefix) {
  std::filesystem::path path = cdi_spec_path(root, spec.at("kind").get<std::string>(), prefix);
  try {
    files::write_file_atomically(path, spec.dump(2) + "\n");
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("the CDI spec: ") + e.what());
  }
  return path;
}

}  // namespace gpuguard::deviceplugin

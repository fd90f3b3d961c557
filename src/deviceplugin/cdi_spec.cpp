#include "gpuguard/deviceplugin/cdi_spec.hpp"

#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <system_error>

namespace gpuguard::deviceplugin {
namespace {

// The oldest CDI version with everything the spec uses, so that older runtimes read it too.
constexpr const char* kCdiVersion = "0.5.0";

nlohmann::json device_nodes(const std::vector<std::string>& paths) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const std::string& path : paths) nodes.push_back({{"path", path}});  // the runtime stats the host's node
  return nodes;
}

}  // namespace

nlohmann::json cdi_spec(std::string_view kind, const std::vector<GpuUnit>& units,
                        const std::vector<std::string>& control_nodes) {
  nlohmann::json devices = nlohmann::json::array();
  for (const GpuUnit& unit : units) {
    devices.push_back(
        {{"name", cdi_device_name(unit.uuid)}, {"containerEdits", {{"deviceNodes", device_nodes(unit.device_nodes)}}}});
  }
  nlohmann::json spec = {{"cdiVersion", kCdiVersion}, {"kind", kind}, {"devices", std::move(devices)}};
  if (!control_nodes.empty()) spec["containerEdits"] = {{"deviceNodes", device_nodes(control_nodes)}};
  return spec;
}

std::filesystem::path write_cdi_spec(const std::filesystem::path& root, const nlohmann::json& spec) {
  std::string name = spec.at("kind").get<std::string>();
  name[name.find('/')] = '-';
  std::filesystem::path path = root / (name + ".json");
  const std::filesystem::path temporary = root / ("." + name + ".json." + std::to_string(::getpid()));
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) throw std::runtime_error("cannot create the CDI directory " + root.string() + ": " + ec.message());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << spec.dump(2) << "\n";
    out.close();
    if (!out) throw std::runtime_error("cannot write " + temporary.string());
  }
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(temporary, ec);
    throw std::runtime_error("cannot move the CDI spec to " + path.string() + ": " + why);
  }
  return path;
}

}  // namespace gpuguard::deviceplugin

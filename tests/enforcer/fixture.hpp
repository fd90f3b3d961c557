#pragma once
// A case of tests/fixtures/enforcer/: a container as NRI shows it (its pod and container in NRI's
// protojson), what the kubelet's pod-resources answers, the node (its GPUs, the toolkit's mode and version
// where the case says them, the CDI devices its specs define), the policy, and what the enforcer must do. The unit test
// decides each in process; the integration test sends each through NRI's own runtime library to the real binary, with a
// fake kubelet giving the same answer.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpuguard/enforcement/allocation.hpp"
#include "gpuguard/enforcement/decision.hpp"

namespace gpuguard::test {

struct EnforcerFixture {
  std::string name;
  nlohmann::json raw;
  std::map<std::string, std::string> policy_files;
  enforcement::NodeView node;
  enforcement::KubeletAnswer kubelet;
  std::map<std::string, std::vector<std::string>> cdi_nodes;
  // Where the node's links lead a bind mount's host path ("host_paths": {path: {"path": ..., "doubt": ...}});
  // any other path leads where it says.
  std::map<std::string, enforcement::HostPathResolution> host_paths;

  enforcement::HostPathResolution resolve(std::string_view path) const {
    const auto found = host_paths.find(std::string(path));
    return found == host_paths.end() ? enforcement::HostPathResolution{} : found->second;
  }
};

inline std::vector<discovery::Gpu> default_node() {
  return {{"GPU-11111111-1111-4111-8111-111111111111", 0, "0000:10:00.0", {}},
          {"GPU-22222222-2222-4222-8222-222222222222", 1, "0000:20:00.0", {}}};
}

inline std::vector<EnforcerFixture> enforcer_fixtures(const std::filesystem::path& dir) {
  std::vector<EnforcerFixture> fixtures;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    std::ifstream in(file);
    EnforcerFixture f;
    f.name = file.stem().string();
    f.raw = nlohmann::json::parse(in);
    const nlohmann::json policy = f.raw.value("policy", nlohmann::json::object());
    for (const auto& [key, value] : policy.items()) f.policy_files[key] = value;
    if (f.raw.contains("node")) {
      for (const auto& gpu : f.raw["node"]) {
        discovery::Gpu node{gpu["uuid"], gpu["minor"], gpu["pci"], {}};
        const nlohmann::json migs = gpu.value("mig", nlohmann::json::object());
        for (const auto& [mig, caps] : migs.items()) {
          node.mig_devices.push_back({mig, 0, 0, "", caps.get<std::vector<unsigned>>()});
        }
        node.mig_enabled = node.mig_listed = !migs.empty();  // MIG devices a fixture lists come from NVML
        f.node.gpus.push_back(std::move(node));
      }
      if (f.node.gpus.empty()) f.node.gpus_unknown = "the driver lists no GPU (/proc/driver/nvidia/gpus)";
    } else {
      f.node.gpus = default_node();
    }
    // The toolkit: a current one (auto, 1.20.1, not Tegra) unless the case says; "toolkit": {} is one whose
    // mode and version cannot be read.
    if (!f.raw.contains("toolkit")) {
      f.node.toolkit.mode = "auto";
      f.node.toolkit.version = enforcement::ToolkitVersion{1, 20, 1};
    }
    const nlohmann::json toolkit = f.raw.value("toolkit", nlohmann::json::object());
    if (toolkit.contains("mode")) f.node.toolkit.mode = toolkit["mode"].get<std::string>();
    if (toolkit.contains("version")) {
      const auto v = toolkit["version"].get<std::vector<int>>();
      f.node.toolkit.version = enforcement::ToolkitVersion{v.at(0), v.at(1), v.at(2)};
    }
    if (toolkit.contains("swarm_variables")) {
      f.node.toolkit.swarm_variables = toolkit["swarm_variables"].get<std::vector<std::string>>();
    }
    if (f.raw.contains("mps_roots")) f.node.mps_roots = f.raw["mps_roots"].get<std::vector<std::string>>();
    // The MPS roots that are directories on the node (none unless the case says): only those can be masked.
    for (const auto& root : f.raw.value("mps_roots_present", nlohmann::json::array()))
      f.node.mps_roots_maskable.insert(root.get<std::string>());
    // CDI devices the node's specs define: name -> device nodes.
    const nlohmann::json specs = f.raw.value("cdi_specs", nlohmann::json::object());
    for (const auto& [name, paths] : specs.items()) f.node.cdi_devices[name] = paths.get<std::vector<std::string>>();
    const auto& kubelet = f.raw["kubelet"];
    f.kubelet.answered = kubelet.value("answered", false);
    f.kubelet.error = kubelet.value("error", "");
    if (kubelet.contains("pod") && kubelet["pod"].is_object()) {
      enforcement::PodResources pod;
      for (const auto& c : kubelet["pod"]["containers"]) {
        enforcement::PodResources::Container container{
            c["name"], {}, c.value("cdi_devices", std::vector<std::string>{})};
        for (const auto& d : c["devices"]) container.devices.push_back({d["resource"], d["ids"]});
        pod.containers.push_back(std::move(container));
      }
      f.kubelet.pod = std::move(pod);
    }
    const nlohmann::json cdi_nodes = f.raw.value("cdi_nodes", nlohmann::json::object());
    for (const auto& [name, paths] : cdi_nodes.items()) {
      f.cdi_nodes[name] = paths.get<std::vector<std::string>>();
      f.node.cdi_devices[name] = f.cdi_nodes[name];
    }
    const nlohmann::json host_paths = f.raw.value("host_paths", nlohmann::json::object());
    for (const auto& [path, where] : host_paths.items()) {
      f.host_paths[path] = {where.value("path", ""), where.value("doubt", "")};
    }
    if (toolkit.contains("tegra")) f.node.toolkit.tegra = toolkit["tegra"].get<bool>();
    enforcement::add_mig_devices_from_cdi(f.node);
    fixtures.push_back(std::move(f));
  }
  return fixtures;
}

}  // namespace gpuguard::test

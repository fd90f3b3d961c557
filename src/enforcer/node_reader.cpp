// What the node enforcer knows of its node (node_reader.hpp).
#include "node_reader.hpp"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <set>

#include "gpuguard/deviceplugin/discovery.hpp"
#include "gpuguard/files/read_file.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/nodereport/host_root.hpp"
#include "gpuguard/nodereport/report.hpp"

namespace gpuguard::enforcer {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kCdiSpecMax = std::size_t{1} << 20;
// containerd's and CRI-O's CDI directories; the toolkit's own (spec-dirs) are read besides.
constexpr const char* kRuntimeSpecDirs[] = {"/etc/cdi", "/var/run/cdi"};
constexpr std::string_view kKnownModes[] = {"legacy", "cdi", "jit-cdi", "csv"};

std::optional<ToolkitVersion> parse_version(std::string_view text) {
  int parts[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parts[i]);
    if (error != std::errc()) return std::nullopt;
    text.remove_prefix(static_cast<std::size_t>(end - text.data()));
    if (i < 2) {
      if (!text.starts_with('.')) return std::nullopt;
      text.remove_prefix(1);
    }
  }
  return ToolkitVersion{parts[0], parts[1], parts[2]};
}

// The paths of an object's containerEdits.deviceNodes (a spec's or a device's), where it has them.
std::vector<std::string> device_node_paths(const YAML::Node& holder) {
  std::vector<std::string> paths;
  const YAML::Node edits = holder["containerEdits"];
  if (!edits || !edits.IsMap() || !edits["deviceNodes"] || !edits["deviceNodes"].IsSequence()) return paths;
  for (const auto& node : edits["deviceNodes"]) {
    if (node.IsMap() && node["path"] && node["path"].IsScalar()) paths.push_back(node["path"].as<std::string>());
  }
  return paths;
}

std::vector<std::string> spec_dirs(const std::vector<std::string>& toolkit_dirs) {
  std::vector<std::string> dirs(std::begin(kRuntimeSpecDirs), std::end(kRuntimeSpecDirs));
  for (const std::string& dir : toolkit_dirs) {
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
  }
  return dirs;
}

}  // namespace

NodeReader::NodeReader(fs::path host_root, std::vector<std::string> mps_roots)
    : host_root_(std::move(host_root)), mps_roots_(std::move(mps_roots)) {
  refresh();
}

std::shared_ptr<const NodeView> NodeReader::current() {
  std::shared_ptr<const NodeView> node = node_.load();
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return node;  // another thread is reading it
  std::vector<fs::file_time_type> times = spec_times(*node);
  if (times == times_) return node;
  auto fresh = std::make_shared<NodeView>(*node);
  read_specs(*fresh);
  times_ = std::move(times);
  node_.store(fresh);
  return fresh;
}

void NodeReader::refresh() {
  auto node = read_all();
  const std::lock_guard lock(mutex_);
  times_ = spec_times(*node);
  read_specs(*node);
  log::info("node read", {{"gpus", node->gpus.size()},
                          {"gpus_unknown", node->gpus_unknown},
                          {"toolkit_mode", node->toolkit.mode.value_or("unknown")},
                          {"cdi_devices", node->cdi_devices.size()}});
  node_.store(std::move(node));
}

std::shared_ptr<NodeView> NodeReader::read_all() const {
  auto node = std::make_shared<NodeView>();
  try {
    const deviceplugin::Discovery found = deviceplugin::discover(deviceplugin::DiscoveryMode::automatic, host_root_);
    for (const deviceplugin::Gpu& gpu : found.gpus) {
      NodeGpu entry{gpu.uuid, gpu.minor, gpu.pci_address, {}, gpu.mig_enabled, gpu.mig_listed};
      for (const deviceplugin::MigDevice& mig : gpu.mig_devices) {
        std::vector<unsigned> caps;
        if (mig.gi_cap_minor) caps.push_back(*mig.gi_cap_minor);
        if (mig.ci_cap_minor) caps.push_back(*mig.ci_cap_minor);
        entry.mig_cap_minors[mig.uuid] = std::move(caps);
      }
      node->gpus.push_back(std::move(entry));
    }
    if (node->gpus.empty()) {
      std::error_code ec;
      node->gpus_unknown = fs::exists(deviceplugin::host_path(host_root_, "/proc/driver/nvidia"), ec)
                               ? "the driver lists no GPU (/proc/driver/nvidia/gpus)"
                               : "no driver is loaded (/proc/driver/nvidia)";
    }
  } catch (const std::exception& e) {
    node->gpus_unknown = std::string("the driver's list of GPUs cannot be read: ") + e.what();
  }
  const nodereport::HostRoot host(host_root_);
  const nodereport::Facts facts = nodereport::judge(host, "void").facts;
  Toolkit& toolkit = node->toolkit;
  if (std::find(std::begin(kKnownModes), std::end(kKnownModes), facts.resolved_mode) != std::end(kKnownModes)) {
    toolkit.mode = facts.resolved_mode;
  }
  if (facts.toolkit_version) toolkit.version = parse_version(*facts.toolkit_version);
  toolkit.default_kind = facts.default_kind;
  toolkit.annotation_prefixes = facts.annotation_prefixes;
  toolkit.swarm_variables = facts.swarm_variables;
  node->cdi_spec_dirs = spec_dirs(facts.spec_dirs);
  for (const std::string& root : mps_roots_) {
    if (std::find(node->mps_roots.begin(), node->mps_roots.end(), root) == node->mps_roots.end()) {
      node->mps_roots.push_back(root);
    }
  }
  return node;
}

std::vector<fs::file_time_type> NodeReader::spec_times(const NodeView& node) const {
  std::vector<fs::file_time_type> times;
  for (const std::string& dir : node.cdi_spec_dirs) {
    std::error_code ec;
    times.push_back(fs::last_write_time(deviceplugin::host_path(host_root_, dir), ec));
  }
  return times;
}

void NodeReader::read_specs(NodeView& node) const {
  node.cdi_devices.clear();
  for (const std::string& dir : node.cdi_spec_dirs) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(deviceplugin::host_path(host_root_, dir), ec)) {
      const std::string extension = entry.path().extension().string();
      // A spec may be a link, which the host follows from its own root.
      const fs::path spec_path = deviceplugin::host_path(host_root_, dir + "/" + entry.path().filename().string());
      if ((extension != ".yaml" && extension != ".yml" && extension != ".json") ||
          fs::file_size(spec_path, ec) > kCdiSpecMax || ec) {
        continue;
      }
      const auto text = files::read_file(spec_path);
      if (!text) continue;
      try {
        const YAML::Node spec = YAML::Load(*text);
        if (!spec.IsMap() || !spec["kind"] || !spec["kind"].IsScalar() || !spec["devices"] ||
            !spec["devices"].IsSequence()) {
          continue;
        }
        const std::string kind = spec["kind"].as<std::string>();
        const std::vector<std::string> common = device_node_paths(spec);
        for (const auto& device : spec["devices"]) {
          if (!device.IsMap() || !device["name"] || !device["name"].IsScalar()) continue;
          std::vector<std::string>& nodes = node.cdi_devices[kind + "=" + device["name"].as<std::string>()];
          nodes.insert(nodes.end(), common.begin(), common.end());
          const std::vector<std::string> own = device_node_paths(device);
          nodes.insert(nodes.end(), own.begin(), own.end());
        }
      } catch (const YAML::Exception&) {
        // A spec the runtime would not read either: it injects nothing.
      }
    }
  }
  add_mig_devices_from_cdi(node);
}

}  // namespace gpuguard::enforcer

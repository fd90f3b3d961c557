// `gpuguard-device-plugin forget-node`: what the device plugin wrote on a node, removed after an
// uninstall. The chart's and manifests/uninstall's DaemonSet runs it on every node; it takes the plugin's
// own flags and config file, so that it finds the files where that install wrote them.
#include "forget_node_command.hpp"

#include <boost/program_options.hpp>

#include <chrono>
#include <csignal>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "gpuguard/cli/apiserver_flags.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/deviceplugin/cdi_spec.hpp"
#include "gpuguard/deviceplugin/flags.hpp"
#include "gpuguard/deviceplugin/node_condition_writer.hpp"
#include "gpuguard/deviceplugin/other_servers.hpp"
#include "gpuguard/discovery/discovery.hpp"
#include "gpuguard/kube/request.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/nodereport/node_condition.hpp"

namespace gpuguard::deviceplugin {

using discovery::host_path;
namespace fs = std::filesystem;
namespace {

// The path the chart gives --nfd-feature-file (devicePlugin.nfdFeatures): removed also where the flag is
// not given here, since NFD keeps labelling the node from it. No other program writes that name.
constexpr const char* kChartNfdFeatureFile = "/etc/kubernetes/node-feature-discovery/features.d/gpuguard";
// Where the chart's and the manifests' node enforcer copies its mask check for CRI-O (its --mask-hook-dir):
// the program, then its directory and gpuguard's above it where nothing else is left in them.
constexpr const char* kChartMaskCheckDir = "/var/lib/gpuguard/bin";
constexpr const char* kMaskCheckName = "gpuguard-mask-check";

// Whether a mount point of this process lies at or under dir (a tmpfs an MPS daemon left).
bool mounted_under(const fs::path& dir) {
  std::ifstream mountinfo("/proc/self/mountinfo");
  const std::string prefix = dir.lexically_normal().string();
  for (std::string line; std::getline(mountinfo, line);) {
    std::istringstream fields(line);
    std::string id, parent, numbers, root, mount_point;
    fields >> id >> parent >> numbers >> root >> mount_point;
    if (mount_point == prefix || mount_point.starts_with(prefix + "/")) return true;
  }
  return false;
}

void remove_file(const fs::path& path, Forgotten& forgotten) {
  std::error_code error;
  if (fs::remove(path, error)) {
    forgotten.removed.push_back(path);
  } else if (error) {
    forgotten.kept.push_back(path.string() + ": " + error.message());
  }
}

}  // namespace

Forgotten forget_node(const PluginConfig& config) {
  Forgotten forgotten;
  if (!config.cdi_root.empty()) {
    const fs::path cdi = host_path(config.host_root, config.cdi_root.string());
    remove_file(cdi_spec_path(cdi, config.gpu.cdi_kind), forgotten);
    // The spec of the device none is named for the runtime's default kind, which the node had then.
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(cdi, error)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with(kNoneSpecPrefix) && name.ends_with(".json")) remove_file(entry.path(), forgotten);
    }
  }
  for (const fs::path& file : {config.nfd_feature_file, fs::path(kChartNfdFeatureFile)}) {
    if (!file.empty()) remove_file(host_path(config.host_root, file.string()), forgotten);
  }
  std::error_code error;
  const fs::path record =
      host_path(config.host_root, served_elsewhere_record(config.plugin_dir).parent_path().string());
  if (fs::exists(record, error)) {
    if (fs::remove_all(record, error) != static_cast<std::uintmax_t>(-1) && !error) {
      forgotten.removed.push_back(record);
    } else {
      forgotten.kept.push_back(record.string() + ": " + error.message());
    }
  }
  const fs::path mask_check_dir = host_path(config.host_root, kChartMaskCheckDir);
  remove_file(mask_check_dir / kMaskCheckName, forgotten);
  // And a copy cut short (an enforcer stopped while it wrote one, under a name of its own).
  for (const auto& entry : fs::directory_iterator(mask_check_dir, error)) {
    if (entry.path().filename().string().starts_with(std::string(".") + kMaskCheckName + ".")) {
      remove_file(entry.path(), forgotten);
    }
  }
  for (const fs::path& dir : {mask_check_dir, mask_check_dir.parent_path()}) {
    if (fs::is_empty(dir, error) && !error && fs::remove(dir, error)) forgotten.removed.push_back(dir);
  }
  const fs::path mps = host_path(config.host_root, config.gpu.mps_root);
  if (fs::exists(mps, error)) {
    if (mounted_under(mps)) {
      forgotten.kept.push_back(mps.string() + ": something is still mounted under it (an MPS daemon's shm)");
    } else if (fs::remove_all(mps, error) != static_cast<std::uintmax_t>(-1) && !error) {
      forgotten.removed.push_back(mps);
      // gpuguard's own directory above it (the default /run/gpuguard), when nothing else is left in it.
      if (mps.parent_path().filename() == "gpuguard" && fs::remove(mps.parent_path(), error)) {
        forgotten.removed.push_back(mps.parent_path());
      }
    } else {
      forgotten.kept.push_back(mps.string() + ": " + error.message());
    }
  }
  return forgotten;
}

namespace {

// Connecting, then the request, each within this.
constexpr auto kConditionRequestTimeout = std::chrono::seconds(10);

// Removes the node's GPUIsolation condition; true once it is gone (or the Node is), false after saying why.
bool forget_condition(const kube::ApiServer& api, const std::string& node) {
  const kube::Reply reply = patch_node_status(api, node, nodereport::condition_removal_patch(),
                                              "gpuguard-device-plugin-forget-node", kConditionRequestTimeout);
  if (reply.status / 100 == 2 || reply.status == 404) {
    log::info("removed the node's condition", {{"node", node}, {"condition", nodereport::kConditionType}});
    return true;
  }
  log::warn(
      "cannot remove the node's condition",
      {{"node", node}, {"condition", nodereport::kConditionType}, {"status", reply.status}, {"reason", reply.error}});
  return false;
}

// One round: the node's files, then (once) its condition. True when nothing of either is left.
bool forget_round(const PluginConfig& config, const std::optional<kube::ApiServer>& api, bool& condition_gone,
                  bool quiet) {
  const Forgotten forgotten = forget_node(config);
  for (const fs::path& path : forgotten.removed) log::info("removed", {{"path", path.string()}});
  if (!quiet || !forgotten.removed.empty()) {
    for (const std::string& why : forgotten.kept) log::warn("not removed", {{"reason", why}});
    log::info("this node forgets gpuguard's device plugin",
              {{"removed", forgotten.removed.size()}, {"not_removed", forgotten.kept.size()}});
  }
  if (api && !condition_gone) condition_gone = forget_condition(*api, config.node_name);
  return forgotten.kept.empty() && condition_gone;
}

}  // namespace

int run_forget_node_command(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  po::options_description description(
      "gpuguard-device-plugin forget-node: removes from this node what the device plugin wrote there, after\n"
      "gpuguard is uninstalled: its CDI spec and its spec of the device none (under --cdi-root), the NFD\n"
      "feature file (--nfd-feature-file, and the chart's path), the record of the GPUs it withheld as served\n"
      "elsewhere (gpuguard/ under --device-plugin-dir), the node enforcer's mask check (/var/lib/gpuguard/bin),\n"
      "and the MPS root (--mps-root) unless something is still mounted under it; with --node-name, also the\n"
      "Node's GPUIsolation condition, through the Kubernetes API (needs patch on nodes/status). Takes the\n"
      "plugin's flags and config file, so that it looks where that install wrote. Exits 0 when nothing of it is\n"
      "left, 1 when something could not be removed (or, with --ready-file, that file is not there yet), 2 on bad\n"
      "flags. With --wait it tries again every 2 s until nothing is left, writes --ready-file, then waits for\n"
      "SIGTERM (a DaemonSet's pod, whose readiness probe runs the same command with --ready-file).\n\n"
      "Options");
  add_flags(description);
  cli::add_apiserver_flags(description);
  description.add_options()("help,h", "this text")("wait", po::bool_switch(),
                                                   "remove until nothing is left, then wait for SIGTERM or SIGINT")(
      "ready-file", po::value<std::string>(),
      "with --wait, written once nothing is left; without, exit 0 only where it is there (a readiness probe that "
      "holds until the condition, which only --wait removes, is gone too)");
  const cli::Parsed parsed = cli::parse_subcommand("gpuguard-device-plugin forget-node", description, args);
  if (!parsed.flags) return parsed.exit_status;
  const po::variables_map& flags = *parsed.flags;
  std::vector<std::string> warnings;
  const auto config = config_from(flags, warnings);
  if (!config) return 2;
  const bool wait = flags["wait"].as<bool>();
  const std::string ready_file = flags.count("ready-file") != 0 ? flags["ready-file"].as<std::string>() : "";
  std::optional<kube::ApiServer> api;
  if (wait && !config->node_name.empty()) {
    kube::ApiServer server;
    if (const int status = cli::require_api_server("gpuguard-device-plugin forget-node", flags, server); status != 0) {
      return status;
    }
    api = std::move(server);
  }
  // Blocked before anything else, so that a SIGTERM while removing is taken by the wait below.
  const sigset_t stop = cli::stop_signals();
  ::sigprocmask(SIG_BLOCK, &stop, nullptr);
  bool condition_gone = !api;
  if (!wait) {
    if (!forget_round(*config, api, condition_gone, false)) return 1;
    return ready_file.empty() || fs::exists(ready_file) ? 0 : 1;
  }
  bool quiet = false;
  while (!forget_round(*config, api, condition_gone, quiet)) {
    quiet = true;  // a round that removes nothing says nothing again
    const timespec every{.tv_sec = 2, .tv_nsec = 0};
    if (::sigtimedwait(&stop, nullptr, &every) > 0) return 1;
  }
  if (!ready_file.empty() && !std::ofstream(ready_file).good()) {
    log::error("cannot write the ready file", {{"path", ready_file}});
    return 1;
  }
  log::info("nothing of gpuguard is left on this node");
  int signal = 0;
  ::sigwait(&stop, &signal);
  return 0;
}

}  // namespace gpuguard::deviceplugin

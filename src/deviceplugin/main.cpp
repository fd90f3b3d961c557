// gpuguard-device-plugin: serves NVIDIA GPUs (by UUID) and host devices such as /dev/fuse to the kubelet.
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <boost/program_options.hpp>

#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/deviceplugin/discovery.hpp"
#include "gpuguard/deviceplugin/health.hpp"
#include "gpuguard/deviceplugin/plugin_server.hpp"
#include "gpuguard/deviceplugin/resource.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/watch/poller.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace gpuguard;
using namespace gpuguard::deviceplugin;
using namespace std::chrono_literals;

namespace {

constexpr auto kNvmlReprobeInterval = 30s;

std::optional<ino_t> socket_inode(const fs::path& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0 || !S_ISSOCK(info.st_mode)) return std::nullopt;
  return info.st_ino;
}

struct Discovery {
  std::unique_ptr<Nvml> nvml;  // set when GPUs came from NVML: its events drive health
  std::vector<Gpu> gpus;
};

// auto: NVML when it loads, else procfs. Throws std::runtime_error when `nvml` was asked for and fails.
Discovery discover(const std::string& mode, const fs::path& host_root) {
  Discovery found;
  if (mode != "procfs") {
    std::string why_not;
    found.nvml = load_nvml(why_not);
    if (found.nvml) {
      try {
        found.gpus = discover_nvml(*found.nvml, host_root);
        return found;
      } catch (const Nvml::Error& e) {
        why_not = e.what();
        found.nvml.reset();
      }
    }
    if (mode == "nvml") throw std::runtime_error("--discovery nvml: " + why_not);
    log::info("NVML not available, discovering GPUs through procfs", {{"reason", why_not}});
  }
  found.gpus = discover_procfs(host_root);
  return found;
}

// The kubelet deletes every socket in the directory when it restarts, then creates a new kubelet.sock:
// serve again where a socket is gone, and register again with each new kubelet.
class KubeletSession {
 public:
  KubeletSession(std::vector<std::unique_ptr<PluginServer>>& servers, fs::path kubelet_socket)
      : servers_(servers), kubelet_socket_(std::move(kubelet_socket)) {}

  void reconcile() {
    for (auto& server : servers_) {
      if (server->socket_exists()) continue;
      server->serve();
      // A new kubelet.sock may get the old one's inode number back: only a registration after this counts.
      registered_with_.reset();
    }
    const auto kubelet = socket_inode(kubelet_socket_);
    if (!kubelet || kubelet == registered_with_) return;
    try {
      for (auto& server : servers_) server->register_with_kubelet(kubelet_socket_);
      registered_with_ = kubelet;
      last_error_.clear();
    } catch (const std::exception& e) {
      if (e.what() != last_error_) log::warn("registration failed; retrying every second", {{"reason", e.what()}});
      last_error_ = e.what();
    }
  }

 private:
  std::vector<std::unique_ptr<PluginServer>>& servers_;
  fs::path kubelet_socket_;
  std::optional<ino_t> registered_with_;
  std::string last_error_;
};

}  // namespace

int main(int argc, char** argv) {
  po::options_description description(
      "gpuguard-device-plugin: a kubelet device plugin (v1beta1) for NVIDIA GPUs by UUID and for host devices\n"
      "such as /dev/fuse.\n\nOptions");
  description.add_options()
      ("device-plugin-dir", po::value<std::string>()->default_value("/var/lib/kubelet/device-plugins/"),
       "the kubelet's device plugin directory (kubelet.sock and the plugins' sockets)")
      ("host-root", po::value<std::string>()->default_value("/"), "where the host's /proc, /dev, /sys and /etc are")
      ("discovery", po::value<std::string>()->default_value("auto"), "auto (NVML when it loads, else procfs), nvml or procfs")
      ("resource-name", po::value<std::string>()->default_value("nvidia.com/gpu"), "the GPU resource name")
      ("device-list-strategy", po::value<std::string>()->default_value("envvar"), "envvar, volume-mounts or cdi")
      ("pass-device-specs", po::bool_switch(), "also pass /dev/nvidiaN and the control nodes as DeviceSpecs")
      ("host-device", po::value<std::vector<std::string>>()->composing(),
       "RESOURCE=PATH[:SLOTS], repeatable, e.g. github.com/fuse=/dev/fuse:16");
  const cli::Parsed parsed = cli::parse_command_line("gpuguard-device-plugin", GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;
  const po::variables_map& flags = *parsed.flags;
  const auto strategy = parse_strategy(flags["device-list-strategy"].as<std::string>());
  const std::string discovery_mode = flags["discovery"].as<std::string>();
  if (!strategy || (discovery_mode != "auto" && discovery_mode != "nvml" && discovery_mode != "procfs")) {
    std::cerr << "gpuguard-device-plugin: --device-list-strategy or --discovery has a value it does not take "
                 "(see --help)\n";
    return 2;
  }
  std::vector<HostDevice> host_devices;
  std::set<std::string> resource_names = {flags["resource-name"].as<std::string>()};
  if (flags.count("host-device")) {
    for (const std::string& flag : flags["host-device"].as<std::vector<std::string>>()) {
      std::string error;
      auto device = parse_host_device(flag, error);
      if (!device) {
        std::cerr << "gpuguard-device-plugin: " << error << "\n";
        return 2;
      }
      if (!resource_names.insert(device->resource).second) {
        std::cerr << "gpuguard-device-plugin: resource " << device->resource << " is named twice\n";
        return 2;
      }
      host_devices.push_back(*device);
    }
  }

  // Signals are taken synchronously by the main loop; block them before any thread (gRPC's too) starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const fs::path host_root = flags["host-root"].as<std::string>();
  const fs::path plugin_dir = flags["device-plugin-dir"].as<std::string>();
  try {
    Discovery found = discover(discovery_mode, host_root);
    std::vector<std::unique_ptr<Resource>> resources;
    std::vector<PresenceCheck> checks;
    if (found.gpus.empty()) {
      log::warn("no NVIDIA GPU found; serving host devices only", {{"host_root", host_root.string()}});
    } else {
      log::info("GPUs found", {{"count", found.gpus.size()},
                               {"discovery", found.nvml ? "nvml" : "procfs"},
                               {"driver", driver_version(host_root)}});
      for (const Gpu& gpu : found.gpus) {
        log::info("GPU", {{"uuid", gpu.uuid}, {"minor", gpu.minor}, {"pci", gpu.pci_address}, {"model", gpu.model},
                          {"numa_node", gpu.numa_node ? nlohmann::json(*gpu.numa_node) : nlohmann::json(nullptr)}});
      }
      GpuOptions options{*strategy, flags["pass-device-specs"].as<bool>(), control_device_nodes(host_root)};
      auto gpus = std::make_unique<GpuResource>(flags["resource-name"].as<std::string>(), found.gpus, options);
      if (!found.nvml) checks = presence_checks(host_root, *gpus, found.gpus);
      resources.push_back(std::move(gpus));
    }
    for (const HostDevice& device : host_devices) {
      auto resource = std::make_unique<HostDeviceResource>(device);
      const auto more = presence_checks(host_root, *resource);
      checks.insert(checks.end(), more.begin(), more.end());
      resources.push_back(std::move(resource));
    }
    if (const auto warning = toolkit_hardening_warning(host_root)) log::warn("node not hardened", {{"reason", *warning}});

    run_presence_checks(checks);
    watch::Poller presence(1s, [&checks] { run_presence_checks(checks); });
    std::jthread nvml_health;
    if (found.nvml) {
      nvml_health = std::jthread([&found, &resources](std::stop_token stop) {
        NvmlHealth health(*found.nvml, resources.front()->devices(), kNvmlReprobeInterval);
        while (!stop.stop_requested()) health.step(1s);
      });
    }

    std::vector<std::unique_ptr<PluginServer>> servers;
    for (auto& resource : resources) servers.push_back(std::make_unique<PluginServer>(*resource, plugin_dir));
    if (servers.empty()) log::warn("nothing to serve: no GPU and no --host-device; idling until stopped");
    KubeletSession kubelet(servers, plugin_dir / "kubelet.sock");
    for (;;) {
      kubelet.reconcile();
      const timespec second{1, 0};
      const int signal_number = sigtimedwait(&signals, nullptr, &second);
      if (signal_number == SIGTERM || signal_number == SIGINT) {
        log::info("shutting down", {{"signal", signal_number}});
        break;
      }
    }
    for (auto& server : servers) server->stop();
  } catch (const std::exception& e) {
    log::error("cannot run", {{"reason", e.what()}});
    return 1;
  }
  log::info("stopped");
  return 0;
}

// gpuguard-device-plugin: serves NVIDIA GPUs (by UUID) and host devices such as /dev/fuse to the kubelet.
#include <boost/program_options.hpp>

#include <iostream>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/deviceplugin/discovery.hpp"
#include "gpuguard/deviceplugin/health.hpp"
#include "gpuguard/deviceplugin/kubelet_session.hpp"
#include "gpuguard/deviceplugin/plugin_server.hpp"
#include "gpuguard/deviceplugin/resource.hpp"
#include "gpuguard/deviceplugin/status_handler.hpp"
#include "gpuguard/files/poller.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/server/http_server.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace gpuguard;
using namespace gpuguard::deviceplugin;
using namespace std::chrono_literals;

namespace {

struct Settings {
  fs::path plugin_dir, host_root;
  DiscoveryMode discovery = DiscoveryMode::automatic;
  std::string resource_name;
  GpuOptions gpu;
  std::vector<HostDevice> host_devices;
  bool health_checks = true;
  NvmlHealthOptions nvml_health;
  std::string metrics_address;
};

// The flags as Settings, or nullopt after saying what is wrong (exit status 2).
std::optional<Settings> settings_from(const po::variables_map& flags) {
  auto fail = [](const std::string& why) {
    std::cerr << "gpuguard-device-plugin: " << why << " (see --help)\n";
    return std::nullopt;
  };
  Settings s;
  s.plugin_dir = flags["device-plugin-dir"].as<std::string>();
  s.host_root = flags["host-root"].as<std::string>();
  s.resource_name = flags["resource-name"].as<std::string>();
  s.metrics_address = flags["metrics-address"].as<std::string>();
  s.health_checks = flags["health-checks"].as<bool>();
  const auto discovery = parse_discovery_mode(flags["discovery"].as<std::string>());
  if (!discovery) return fail("--discovery must be auto, nvml, procfs or none");
  s.discovery = *discovery;
  const auto strategy = parse_strategy(flags["device-list-strategy"].as<std::string>());
  if (!strategy) return fail("--device-list-strategy must be envvar, volume-mounts or cdi");
  s.gpu.strategy = *strategy;
  s.gpu.pass_device_specs = flags["pass-device-specs"].as<bool>();
  for (const auto& [flag, xids] : {std::pair{"health-ignored-xids", &s.nvml_health.ignored_xids},
                                   std::pair{"health-reset-xids", &s.nvml_health.reset_xids}}) {
    std::string error;
    auto parsed = parse_xid_list(flags[flag].as<std::string>(), error);
    if (!parsed) return fail(std::string("--") + flag + ": " + error);
    *xids = std::move(*parsed);
  }
  std::set<std::string> resource_names = {s.resource_name};
  if (flags.count("host-device")) {
    for (const std::string& flag : flags["host-device"].as<std::vector<std::string>>()) {
      std::string error;
      auto device = parse_host_device(flag, error);
      if (!device) return fail(error);
      if (!resource_names.insert(device->resource).second)
        return fail("resource " + device->resource + " is named twice");
      s.host_devices.push_back(*device);
    }
  }
  return s;
}

void serve(const Settings& s) {
  Discovery found = discover(s.discovery, s.host_root);
  std::string health = !s.health_checks ? "off" : found.nvml ? "nvml" : "presence";
  if (!found.nvml_unavailable.empty()) {
    log::warn(
        "NVML not available: GPUs discovered through procfs, and their health is the presence of their "
        "device files only, without XID events",
        {{"reason", found.nvml_unavailable}});
  }
  if (!s.health_checks) log::warn("health checks are off: every device stays Healthy");

  std::vector<std::unique_ptr<Resource>> resources;
  std::vector<PresenceCheck> checks;
  if (found.gpus.empty()) {
    if (s.discovery != DiscoveryMode::none)
      log::warn("no NVIDIA GPU found; serving host devices only", {{"host_root", s.host_root.string()}});
  } else {
    log::info("GPUs found", {{"count", found.gpus.size()},
                             {"discovery", found.source},
                             {"health", health},
                             {"driver", driver_version(s.host_root)}});
    for (const Gpu& gpu : found.gpus) {
      log::info("GPU", {{"uuid", gpu.uuid},
                        {"minor", gpu.minor},
                        {"pci", gpu.pci_address},
                        {"model", gpu.model},
                        {"numa_node", gpu.numa_node}});
    }
    GpuOptions options = s.gpu;
    options.control_nodes = control_device_nodes(s.host_root);
    auto gpus = std::make_unique<GpuResource>(s.resource_name, found.gpus, options);
    if (!found.nvml && s.health_checks) checks = presence_checks(s.host_root, *gpus, found.gpus);
    resources.push_back(std::move(gpus));
    if (const auto warning = toolkit_hardening_warning(s.host_root))
      log::warn("node not hardened", {{"reason", *warning}});
  }
  for (const HostDevice& device : s.host_devices) {
    auto resource = std::make_unique<HostDeviceResource>(device);
    if (s.health_checks) {
      const auto more = presence_checks(s.host_root, *resource);
      checks.insert(checks.end(), more.begin(), more.end());
    }
    resources.push_back(std::move(resource));
  }
  if (resources.empty()) log::warn("nothing to serve: no GPU and no --host-device; idling until stopped");

  std::vector<std::unique_ptr<PluginServer>> servers;
  servers.reserve(resources.size());
  for (auto& resource : resources) servers.push_back(std::make_unique<PluginServer>(*resource, s.plugin_dir));
  KubeletSession kubelet(servers, s.plugin_dir / "kubelet.sock");

  // The status server takes SIGTERM and SIGINT from its construction on: before anything is served, so a
  // signal at any later moment still ends in the orderly stop below.
  StatusHandler handler({GPUGUARD_VERSION, found.source, health}, resources, kubelet);
  server::ServerOptions options;
  options.listen_address = s.metrics_address;
  options.threads = 1;
  options.shutdown_delay = 0ms;
  options.shutdown_timeout = 5s;
  server::HttpServer status(options, server::TlsProvider{}, handler);  // plain HTTP: probes and metrics
  log::info("serving probes and metrics", {{"address", status.bind()}});

  run_presence_checks(checks);
  files::Poller presence(1s, [&checks] { run_presence_checks(checks); });
  std::jthread nvml_health;
  if (found.nvml && s.health_checks) {
    nvml_health = std::jthread([&found, &resources, &s](const std::stop_token& stop) {
      NvmlHealth health(*found.nvml, resources.front()->devices(), s.nvml_health);
      while (!stop.stop_requested()) health.step(1s);
    });
  }
  kubelet.reconcile();
  files::Poller session(1s, [&kubelet] { kubelet.reconcile(); });
  status.run();  // until SIGTERM or SIGINT
  kubelet.stop();
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description description(
      "gpuguard-device-plugin: a kubelet device plugin (v1beta1) for NVIDIA GPUs by UUID and for host devices\n"
      "such as /dev/fuse.\n\nOptions");
  description.add_options()("device-plugin-dir",
                            po::value<std::string>()->default_value("/var/lib/kubelet/device-plugins/"),
                            "the kubelet's device plugin directory (kubelet.sock and the plugins' sockets)")(
      "host-root", po::value<std::string>()->default_value("/"), "where the host's /proc, /dev, /sys and /etc are")(
      "discovery", po::value<std::string>()->default_value("auto"),
      "auto (NVML when it loads, else procfs), nvml, procfs, or none (serve host devices only)")(
      "resource-name", po::value<std::string>()->default_value("nvidia.com/gpu"), "the GPU resource name")(
      "device-list-strategy", po::value<std::string>()->default_value("envvar"), "envvar, volume-mounts or cdi")(
      "pass-device-specs", po::bool_switch(), "also pass /dev/nvidiaN and the control nodes as DeviceSpecs")(
      "host-device", po::value<std::vector<std::string>>()->composing(),
      "RESOURCE=PATH[:SLOTS], repeatable, e.g. github.com/fuse=/dev/fuse:16")(
      "health-checks", po::value<bool>()->default_value(true),
      "false: every device stays Healthy (NVIDIA's DP_DISABLE_HEALTHCHECKS=all)")(
      "health-ignored-xids", po::value<std::string>()->default_value("13,31,43,45,68,109"),
      "XIDs an application causes: logged, the GPU stays healthy")(
      "health-reset-xids",
      po::value<std::string>()->default_value("48,62,64,74,79,94,95,110,119,120,136,140,143,155,156,158"),
      "XIDs after which a GPU needs a reset: unhealthy until NVML shows it was reset")(
      "metrics-address", po::value<std::string>()->default_value("0.0.0.0:8080"),
      "IP:port for /healthz, /readyz (registered with the kubelet) and /metrics, over plain HTTP");
  const cli::Parsed parsed =
      cli::parse_command_line("gpuguard-device-plugin", GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;
  const auto settings = settings_from(*parsed.flags);
  if (!settings) return 2;
  return cli::run_service([&] { serve(*settings); });
}

#include "plugin_service.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/deviceplugin/cdi_spec.hpp"
#include "gpuguard/deviceplugin/gpu_resource.hpp"
#include "gpuguard/deviceplugin/health.hpp"
#include "gpuguard/deviceplugin/host_device.hpp"
#include "gpuguard/deviceplugin/kubelet_session.hpp"
#include "gpuguard/deviceplugin/mps.hpp"
#include "gpuguard/deviceplugin/node_condition_writer.hpp"
#include "gpuguard/deviceplugin/other_servers.hpp"
#include "gpuguard/deviceplugin/plugin_server.hpp"
#include "gpuguard/deviceplugin/status_page.hpp"
#include "gpuguard/discovery/discovery.hpp"
#include "gpuguard/files/poller.hpp"
#include "gpuguard/files/write_file.hpp"
#include "gpuguard/kube/informer.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/nodereport/host_root.hpp"
#include "gpuguard/policy/policy_watcher.hpp"
#include "gpuguard/server/http_server.hpp"
#include "gpuguard/server/status_routes.hpp"

namespace gpuguard::deviceplugin {

using discovery::control_device_nodes;
using discovery::discover;
using discovery::Discovery;
using discovery::DiscoveryMode;
using discovery::driver_version;
using discovery::Gpu;
using discovery::host_path;
using discovery::MigDevice;
namespace {

using namespace std::chrono_literals;

// The node report (`node-report` prints it whole) for both values the webhook can inject, kept for
// /metrics, and for the policy's value as the Node condition; logged with what it found to warn about at
// start and whenever it changes.
void judge_node(const std::filesystem::path& host_root, const std::string& value, NodeIsolation& isolation,
                NodeConditionWriter* condition) {
  const nodereport::HostRoot host(host_root);
  const nodereport::Report none = nodereport::judge(host, "none");
  const nodereport::Report void_value = nodereport::judge(host, "void");
  // The metrics first: whoever reads the condition then finds /metrics saying the same.
  const bool changed = isolation.update(none, void_value, value);
  if (condition != nullptr) condition->update(value == "void" ? void_value : none, std::chrono::system_clock::now());
  if (!changed) return;
  log::info("node report", {{"none", nodereport::verdict_name(none.verdict)},
                            {"void", nodereport::verdict_name(void_value.verdict)},
                            {"none_reason", none.reason},
                            {"void_reason", void_value.reason}});
  for (const nodereport::Finding& finding : none.findings) {
    if (finding.severity == nodereport::Severity::info) continue;
    log::warn("node not hardened", {{"severity", nodereport::severity_name(finding.severity)},
                                    {"code", finding.code},
                                    {"reason", finding.message},
                                    {"file", finding.file}});
  }
}

// NVIDIA's runtime in cdi mode reads NVIDIA_VISIBLE_DEVICES=none as the CDI device <default-kind>=none,
// which nvidia-ctk's generated specs do not define: there, every container the webhook gives none would
// fail to be created. So where the node report finds that, the plugin adds the device, in a spec of its
// own beside the one above.
void provide_none_device(const std::filesystem::path& host_root, const std::filesystem::path& cdi_root) {
  const nodereport::Report none = nodereport::judge(nodereport::HostRoot(host_root), "none");
  if (none.facts.resolved_mode != "cdi" || none.facts.none_device) return;
  const auto path = write_cdi_spec(cdi_root, none_spec(none.facts.default_kind), kNoneSpecPrefix);
  log::info("CDI device none written for NVIDIA's runtime in cdi mode",
            {{"path", path.string()}, {"kind", none.facts.default_kind}});
}

void log_gpus(const Discovery& found, const std::string& health, const std::filesystem::path& host_root) {
  log::info("GPUs found", {{"count", found.gpus.size()},
                           {"discovery", found.source},
                           {"health", health},
                           {"driver", driver_version(host_root)}});
  for (const Gpu& gpu : found.gpus) {
    log::info("GPU", {{"uuid", gpu.uuid},
                      {"minor", gpu.minor},
                      {"pci", gpu.pci_address},
                      {"model", gpu.model},
                      {"numa_node", gpu.numa_node},
                      {"mig", gpu.mig_enabled}});
    for (const MigDevice& mig : gpu.mig_devices) {
      log::info("MIG device",
                {{"uuid", mig.uuid}, {"gpu", gpu.uuid}, {"gi", mig.gi}, {"ci", mig.ci}, {"profile", mig.profile}});
    }
  }
}

// Why the plugin should leave its GPU resource to another plugin on this node, or empty: NVIDIA's device
// plugin (alone, or as the GPU Operator runs it) names its socket nvidia-<name>.sock for <domain>/<name>.
// One that accepts a connection is being served; one that is there and does not answer is left by a
// plugin that failed (a plugin that stops removes its socket, and the kubelet empties the directory when
// it starts), which its DaemonSet will start again. Either way the resource is NVIDIA's: two plugins
// registering one resource leave the kubelet with whichever registered last.
std::string other_gpu_plugin(const std::filesystem::path& plugin_dir, const std::string& resource_name) {
  const std::filesystem::path socket_path =
      plugin_dir / ("nvidia-" + resource_name.substr(resource_name.find('/') + 1) + ".sock");
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = socket_path.string();
  if (path.size() >= sizeof address.sun_path) return "";
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  const bool answers = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  if (answers) return "NVIDIA's device plugin serves " + resource_name + " here (" + path + " answers)";
  std::error_code error;
  if (std::filesystem::is_socket(socket_path, error)) {
    return "NVIDIA's device plugin serves " + resource_name + " here (" + path +
           " is there and does not answer: the plugin failed, and is left to come back)";
  }
  return "";
}

std::set<std::string> host_device_names(const PluginConfig& c) {
  std::set<std::string> names;
  for (const HostDevice& device : c.host_devices) names.insert(device.resource);
  return names;
}

// Why the GPUs are only reported, not served, or empty when they are served.
std::string report_only_reason(const PluginConfig& c) {
  switch (c.gpus) {
    case GpuServing::serve: return "";
    case GpuServing::report_only: return "--gpus report-only";
    case GpuServing::automatic: return other_gpu_plugin(c.plugin_dir, c.resource_name);
  }
  return "";
}

// An MPS GPU's replicas are served Unhealthy until its daemon's readiness file exists
// (gpuguard-device-plugin mps-control writes it once the daemon answers with its limits set, and removes
// it when the daemon stops answering or is stopped), so no pod is given a replica nothing serves.
struct MpsReadiness {
  DeviceSet* devices;
  std::string gpu_uuid;
  std::filesystem::path ready;
  bool seen_ready;
};

void check_mps_daemons(std::vector<MpsReadiness>& daemons) {
  for (MpsReadiness& daemon : daemons) {
    std::error_code ec;
    const bool ready = std::filesystem::exists(daemon.ready, ec);
    if (ready == daemon.seen_ready) continue;
    daemon.seen_ready = ready;
    daemon.devices->withhold(daemon.gpu_uuid, Hold::mps_daemon, !ready);
    if (ready) {
      log::info("MPS daemon ready: the GPU's replicas are served", {{"gpu", daemon.gpu_uuid}});
    } else {
      log::warn("MPS daemon not ready: the GPU's replicas are Unhealthy until it is",
                {{"gpu", daemon.gpu_uuid}, {"missing", daemon.ready.string()}});
    }
  }
}

// GPU feature discovery's labels for what is served, as NFD's local feature source reads them: a line
// <key>=<value> each. No labels (no GPU served): the file is removed, so that NFD drops labels that no
// longer hold. A file that cannot be written is logged, and serving goes on.
void publish_feature_labels(const PluginConfig& c, const std::map<std::string, std::string>& labels) {
  if (c.nfd_feature_file.empty()) return;
  const std::filesystem::path path = host_path(c.host_root, c.nfd_feature_file.string());
  if (labels.empty()) {
    std::error_code ec;
    if (std::filesystem::remove(path, ec))
      log::info("NFD feature file removed: no GPU served", {{"path", path.string()}});
    return;
  }
  std::string lines = "# Written by gpuguard-device-plugin: the labels GPU feature discovery sets for its resources.\n";
  for (const auto& [key, value] : labels) lines.append(key).append("=").append(value).append("\n");
  try {
    files::write_file_atomically(path, lines);
    log::info("NFD feature file written", {{"path", path.string()}, {"labels", labels.size()}});
  } catch (const std::runtime_error& e) {
    log::warn("NFD feature file not written: the node keeps the labels it had", {{"reason", e.what()}});
  }
}

// The GPU resources the config makes of what was found, and GPU feature discovery's labels for them;
// empty when there are none to serve.
std::vector<std::unique_ptr<GpuResource>> gpu_resources(const PluginConfig& c, const Discovery& found,
                                                        std::map<std::string, std::string>& labels) {
  GpuPlan plan = plan_gpu_resources(found.gpus, c.mig_strategy, c.resource_name, c.sharing);
  for (const std::string& warning : plan.warnings) log::warn("GPU resources", {{"reason", warning}});
  if (plan.error) {
    if (c.fail_on_init_error || plan.sharing_error) throw std::runtime_error(*plan.error);
    log::error("no GPU is served", {{"reason", *plan.error}});
  } else if (plan.resources.empty() && c.discovery != DiscoveryMode::none) {
    if (c.fail_on_init_error) throw std::runtime_error("no NVIDIA GPU found (--fail-on-init-error)");
    log::warn("no NVIDIA GPU found; serving host devices only", {{"host_root", c.host_root.string()}});
  }
  if (plan.resources.empty()) return {};
  labels = plan.labels;

  GpuOptions options = c.gpu;
  options.control_nodes = control_device_nodes(c.host_root);
  const bool cdi = std::any_of(options.strategies.begin(), options.strategies.end(),
                               [](Strategy s) { return s == Strategy::cdi_cri || s == Strategy::cdi_annotations; });
  if (cdi && c.cdi_root.empty()) {
    options.cdi_kind = "nvidia.com/gpu";  // the devices nvidia-ctk's generated spec names by UUID
  } else if (!c.cdi_root.empty()) {
    // Written for envvar too: NVIDIA's runtime in cdi mode resolves the variable through a spec.
    std::vector<GpuUnit> units;
    for (const GpuResourcePlan& resource : plan.resources)
      units.insert(units.end(), resource.units.begin(), resource.units.end());
    const std::filesystem::path root = host_path(c.host_root, c.cdi_root.string());
    try {
      const auto path = write_cdi_spec(root, cdi_spec(options.cdi_kind, units, options.control_nodes));
      log::info("CDI spec written", {{"path", path.string()}, {"kind", options.cdi_kind}, {"devices", units.size()}});
      provide_none_device(c.host_root, root);
    } catch (const std::runtime_error& e) {
      if (cdi) throw;  // the CRI resolves every allocation through it
      log::warn("no CDI spec written; a runtime in cdi mode cannot resolve the GPUs' names",
                {{"reason", e.what()}, {"kind", options.cdi_kind}});
    }
  }
  std::vector<std::unique_ptr<GpuResource>> resources;
  for (const GpuResourcePlan& resource : plan.resources) {
    log::info("GPU resource",
              {{"resource", resource.name}, {"devices", resource.units.size()}, {"replicas", resource.replicas}});
    resources.push_back(std::make_unique<GpuResource>(resource, options));
  }
  return resources;
}

// What the plugin serves: the GPU resources (none where another plugin serves the GPUs) and the host devices,
// each by a name of its own.
struct Served {
  std::vector<std::unique_ptr<Resource>> resources;
  std::vector<DeviceSet*> gpu_sets;
  std::vector<MpsReadiness> mps_daemons;  // an MPS GPU's replicas wait for its daemon
  std::vector<HostDeviceResource*> host_devices;
  std::string report_only;  // why the GPUs are reported and not served; empty when served (or none found)
};

// A server per resource. A GPU resource's yields to NVIDIA's plugin answering for the same name (its streams
// send nothing more, plugin_server.hpp); a host device's does not.
std::vector<std::unique_ptr<PluginServer>> plugin_servers(const PluginConfig& c, const Served& served) {
  std::vector<std::unique_ptr<PluginServer>> servers;
  servers.reserve(served.resources.size());
  for (const auto& resource : served.resources) {
    const bool gpu = std::any_of(served.gpu_sets.begin(), served.gpu_sets.end(),
                                 [&resource](const DeviceSet* set) { return &resource->devices() == set; });
    std::function<std::string()> yielded_to;
    if (gpu) yielded_to = [dir = c.plugin_dir, name = resource->name()] { return other_gpu_plugin(dir, name); };
    servers.push_back(std::make_unique<PluginServer>(*resource, c.plugin_dir, std::move(yielded_to)));
  }
  return servers;
}

// `--gpus auto` leaving the GPUs to another plugin at start is a yield like any other (other_servers.hpp):
// recorded, so that a later start does not take them back once that plugin's socket is gone (the
// kubelet's start removes it) while that plugin, or the pods it allocated to, may still hold them. Where
// the kubelet's offers are not read (--pod-resources-socket ""), no record is read either.
void record_yield_at_start(const PluginConfig& c, const Discovery& found, const std::string& report_only) {
  if (c.gpus != GpuServing::automatic || report_only.empty() || c.pod_resources_socket.empty()) return;
  const std::filesystem::path record = served_elsewhere_record(c.plugin_dir);
  // Added to what is recorded already (a GPU this start did not find stays in it). A record that cannot be
  // read withholds every GPU at the next start anyway, and is left as it is.
  std::optional<std::map<std::string, std::string>> yielded = read_served_elsewhere(record);
  if (!yielded) return;
  for (const discovery::Gpu& gpu : found.gpus) {
    yielded->emplace(gpu.uuid, "left to another plugin at start: " + report_only);
  }
  if (!write_served_elsewhere(record, *yielded)) return;
  log::info("GPUs recorded as served elsewhere: a later start withholds them until the record is deleted",
            {{"path", record.string()}, {"gpus", found.gpus.size()}});
}

Served resources_to_serve(const PluginConfig& c, const Discovery& found) {
  Served served;
  std::map<std::string, std::string> feature_labels;
  served.report_only = found.gpus.empty() ? "" : report_only_reason(c);
  if (!served.report_only.empty()) {
    log::info("GPUs not served: the node is judged and reported only", {{"reason", served.report_only}});
  } else {
    for (auto& gpu : gpu_resources(c, found, feature_labels)) {
      served.gpu_sets.push_back(&gpu->devices());
      if (gpu->mps()) {
        for (const GpuUnit& unit : gpu->units()) {
          const auto ready = host_path(c.host_root, mps_paths(c.gpu.mps_root, unit.gpu_uuid).ready.string());
          gpu->devices().withhold(unit.gpu_uuid, Hold::mps_daemon, true);  // until its daemon is seen ready
          log::info("MPS GPU: its replicas wait for its daemon", {{"gpu", unit.gpu_uuid}, {"ready", ready.string()}});
          served.mps_daemons.push_back({&gpu->devices(), unit.gpu_uuid, ready, false});
        }
      }
      served.resources.push_back(std::move(gpu));
    }
  }
  publish_feature_labels(c, feature_labels);
  for (const HostDevice& device : c.host_devices) {
    auto resource = std::make_unique<HostDeviceResource>(device, c.host_root);
    served.host_devices.push_back(resource.get());
    served.resources.push_back(std::move(resource));
  }
  std::set<std::string> names;
  for (const auto& resource : served.resources) {
    if (!names.insert(resource->name()).second) {
      throw std::runtime_error("resource " + resource->name() +
                               " would be served twice (a host device named like a GPU resource)");
    }
  }
  if (served.resources.empty()) log::warn("nothing to serve: no GPU and no --host-device; idling until stopped");
  return served;
}

// With --gpus auto, each registration first asks whether NVIDIA's plugin serves the GPU resource now: after a
// kubelet restart both register again, and the kubelet keeps whichever registered last.
KubeletSession::Yield yield_to_nvidia(const PluginConfig& c) {
  if (c.gpus != GpuServing::automatic) return {};
  return [&c, host = host_device_names(c)](const std::string& resource) {
    return host.contains(resource) ? std::string() : other_gpu_plugin(c.plugin_dir, resource);
  };
}

// Says what was found and how its health will be known; that source ("nvml", "presence" or "off").
std::string log_discovery(const PluginConfig& c, const Discovery& found) {
  std::string health_source = !c.health_checks ? "off" : found.nvml ? "nvml" : "presence";
  if (!found.nvml_unavailable.empty()) {
    log::warn(
        "NVML not available: GPUs discovered through procfs, and their health is the presence of their "
        "device files only, without XID events",
        {{"reason", found.nvml_unavailable}});
  }
  if (!c.health_checks) log::warn("health checks are off: every device stays Healthy");
  if (!found.gpus.empty()) log_gpus(found, health_source, c.host_root);
  return health_source;
}

// NVML's health events, followed on a thread of their own while it runs; none without NVML or checks.
std::jthread follow_nvml_health(const PluginConfig& c, const Discovery& found,
                                const std::vector<DeviceSet*>& gpu_sets) {
  if (!found.nvml || !c.health_checks || gpu_sets.empty()) return {};
  return std::jthread([&found, &gpu_sets, &c](const std::stop_token& stop) {
    NvmlHealth health(*found.nvml, gpu_sets, c.health);
    // Short waits, so that a stop is not held up by a wait for events.
    while (!stop.stop_requested()) health.step(250ms);
  });
}

// The GPUs held back where another plugin serves them, asked of the kubelet every kOffersInterval;
// nothing without GPUs to serve, or with --pod-resources-socket empty.
// With the API (--node-name), the node's DRA ResourceSlices too, listed and watched.
struct OffersWatch {
  std::unique_ptr<KubeletOffers> offers;
  std::unique_ptr<PublishedGpus> published;
  std::unique_ptr<kube::Informers> slices;
  std::unique_ptr<OtherServers> others;
};

// GPUs only reported: nothing to withhold, but the pods gpuguard's plugin gave GPUs before it began only to
// report (a start beside NVIDIA's plugin under the same name) may share them with that plugin's pods. What
// pods hold is read all the same, under the names this plugin would serve (plan_gpu_resources, no I/O).
OffersWatch watch_held(const PluginConfig& c, const Discovery& found) {
  std::set<std::string> own;
  for (const GpuResourcePlan& resource :
       plan_gpu_resources(found.gpus, c.mig_strategy, c.resource_name, c.sharing).resources) {
    own.insert(resource.name);
  }
  OffersWatch watch;
  watch.offers = std::make_unique<KubeletOffers>(c.pod_resources_socket);
  watch.others = std::make_unique<OtherServers>([offers = watch.offers.get()] { return offers->read(kOffersInterval); },
                                                found.gpus, std::vector<DeviceSet*>{}, std::move(own));
  log::info("GPUs reported only: what pods hold is read for GPUs held twice",
            {{"pod_resources_socket", c.pod_resources_socket.string()}});
  return watch;
}

OffersWatch watch_offers(const PluginConfig& c, const Discovery& found, const Served& served,
                         const std::optional<kube::ApiServer>& apiserver) {
  if (served.gpu_sets.empty()) {
    return served.report_only.empty() || c.pod_resources_socket.empty() ? OffersWatch{} : watch_held(c, found);
  }
  if (c.pod_resources_socket.empty()) {
    log::warn("--pod-resources-socket is empty: GPUs are served without asking which ones other plugins serve");
    return {};
  }
  OffersWatch watch;
  watch.offers = std::make_unique<KubeletOffers>(c.pod_resources_socket);
  if (apiserver && !c.node_name.empty()) {
    watch.published = std::make_unique<PublishedGpus>(found.gpus);
    kube::InformerOptions options;
    options.user_agent = "gpuguard-device-plugin/" GPUGUARD_VERSION;
    watch.slices = std::make_unique<kube::Informers>(
        *apiserver,
        std::vector<kube::WatchedResource>{{"resourceslices",
                                            "/apis/resource.k8s.io/{version}/resourceslices",
                                            "spec.nodeName=" + c.node_name,
                                            watch.published.get(),
                                            {"v1", "v1beta2", "v1beta1"}}},
        options);
  } else {
    log::warn(
        "no --node-name or no API: the ResourceSlices of DRA drivers are not read, and GPUs they publish "
        "are served too");
  }
  std::set<std::string> own;
  for (const auto& resource : served.resources) own.insert(resource->name());
  // NVIDIA's plugin answering for one of these very names: the kubelet lists either's devices under it.
  std::set<std::string> gpu_names;
  for (const DeviceSet* set : served.gpu_sets) {
    for (const auto& resource : served.resources) {
      if (&resource->devices() == set) gpu_names.insert(resource->name());
    }
  }
  OtherServers::Sources sources{watch.published.get(), kSlicesWait,
                                [&c, gpu_names] {
                                  for (const std::string& name : gpu_names) {
                                    if (std::string why = other_gpu_plugin(c.plugin_dir, name); !why.empty())
                                      return why;
                                  }
                                  return std::string();
                                },
                                served_elsewhere_record(c.plugin_dir), c.infrastructure_namespaces};
  watch.others = std::make_unique<OtherServers>([offers = watch.offers.get()] { return offers->read(kOffersInterval); },
                                                found.gpus, served.gpu_sets, std::move(own), std::move(sources));
  if (watch.slices) watch.slices->start();
  const std::vector<std::string> infrastructure(c.infrastructure_namespaces.begin(), c.infrastructure_namespaces.end());
  log::info("GPUs withheld until the kubelet says which ones other plugins serve",
            {{"pod_resources_socket", c.pod_resources_socket.string()},
             {"resource_slices", watch.slices != nullptr},
             {"infrastructure_namespaces", infrastructure}});
  return watch;
}

}  // namespace

void serve(const PluginConfig& c, const std::vector<std::string>& config_warnings,
           const std::optional<kube::ApiServer>& apiserver) {
  cli::StopSignalsHeld stop_signals;  // first: before gRPC's threads and ours
  for (const std::string& warning : config_warnings) log::warn("config file", {{"reason", warning}});
  Discovery found = discover(c.discovery, c.host_root);
  const std::string health_source = log_discovery(c, found);

  Served served = resources_to_serve(c, found);
  auto& resources = served.resources;
  auto& gpu_sets = served.gpu_sets;
  auto& mps_daemons = served.mps_daemons;
  const auto& host_devices = served.host_devices;
  const std::string& report_only = served.report_only;
  record_yield_at_start(c, found, report_only);
  const bool judged = !gpu_sets.empty() || !report_only.empty();   // a GPU node
  OffersWatch offers = watch_offers(c, found, served, apiserver);  // before any server lists a device
  NodeIsolation isolation;
  // The plugin judges the injected value alone: a bad value of any other key (mode, say) is the
  // webhook's to refuse, and never read here; a bad value of this one is logged and counted, and the
  // default judged until it is fixed. Neither may stop the GPUs being served.
  policy::PolicyWatcher policy(c.policy_dir, isolation, {"visibleDevicesValue"},
                               policy::PolicyWatcher::AtStart::defaults);
  std::optional<NodeConditionWriter> condition;
  if (apiserver && !c.node_name.empty()) condition.emplace(*apiserver, c.node_name, isolation);
  const auto judge = [&](NodeConditionWriter* writer) {
    judge_node(c.host_root, policy.current()->visible_devices_value, isolation, writer);
  };
  if (judged) {
    judge(nullptr);  // the condition from the poller's thread: a slow API server must not hold up serving
  } else if (condition) {
    log::info("no GPU served: no node condition written", {{"node", c.node_name}});
  }

  std::vector<std::unique_ptr<PluginServer>> servers = plugin_servers(c, served);
  KubeletSession kubelet(servers, c.plugin_dir / "kubelet.sock", yield_to_nvidia(c));

  // The status server takes SIGTERM and SIGINT from its construction on; one that comes before its loop
  // runs waits, and is delivered to it then: a signal at any moment ends in the orderly stop below.
  const char* gpus = found.gpus.empty() ? "none" : report_only.empty() ? "served" : "report-only";
  const StatusPage page({GPUGUARD_VERSION, found.source, health_source, gpus}, resources, kubelet, isolation,
                        offers.others.get());
  const server::StatusRoutes routes(
      [&page] {
        return server::StatusRoutes::Readiness{page.ready(), ""};
      },
      [&page] { return page.render_metrics(); });
  server::HttpServer status(server::status_server_options(c.metrics_address, 5s), server::TlsProvider{}, routes);
  log::info("serving probes and metrics", {{"address", status.bind()}});

  std::vector<PresenceCheck> checks;
  if (!found.nvml && c.health_checks) checks = presence_checks(c.host_root, gpu_sets, found.gpus);
  const auto check_presence = [&] {
    run_presence_checks(checks);
    check_mps_daemons(mps_daemons);
    // The devices of a pattern follow its matches always; a group's health only with health checks on.
    for (HostDeviceResource* device : host_devices) {
      if (c.health_checks || device->one_per_match()) device->rescan();
    }
  };
  check_presence();
  files::Poller presence(1s, check_presence);
  std::jthread nvml_health = follow_nvml_health(c, found, gpu_sets);
  std::optional<files::Poller> offers_check;
  if (offers.others)
    offers_check.emplace(
        kOffersInterval, [&offers] { offers.others->check(); }, true);
  kubelet.reconcile();
  files::Poller session(1s, [&kubelet] { kubelet.reconcile(); });
  policy.watch(1s);
  std::optional<files::Poller> node_report;
  if (judged) {
    node_report.emplace(
        kNodeReportInterval, [&] { judge(condition ? &*condition : nullptr); }, condition.has_value());
  }
  const auto stop_delivered = stop_signals.release();  // to this thread alone; held again before the server goes
  status.run();                                        // until SIGTERM or SIGINT
  kubelet.stop();
}

}  // namespace gpuguard::deviceplugin

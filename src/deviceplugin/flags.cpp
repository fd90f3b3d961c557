#include "gpuguard/deviceplugin/flags.hpp"

#include <algorithm>
#include <iostream>
#include <sstream>
#include <utility>

namespace gpuguard::deviceplugin {

using discovery::parse_discovery_mode;
namespace {

namespace po = boost::program_options;

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) items.push_back(item);
  return items;
}

// Applies the flags that were given; returns the reason one is wrong.
std::optional<std::string> apply_flags(const po::variables_map& flags, PluginConfig& c) {
  const auto given = [&](const char* name) { return flags.count(name) != 0; };
  const auto text = [&](const char* name) { return flags[name].as<std::string>(); };
  if (given("device-plugin-dir")) c.plugin_dir = text("device-plugin-dir");
  if (given("pod-resources-socket")) c.pod_resources_socket = text("pod-resources-socket");
  if (given("host-root")) c.host_root = text("host-root");
  if (given("discovery")) {
    const auto mode = parse_discovery_mode(text("discovery"));
    if (!mode) return "--discovery must be auto, nvml, procfs or none";
    c.discovery = *mode;
  }
  if (given("fail-on-init-error")) c.fail_on_init_error = flags["fail-on-init-error"].as<bool>();
  if (given("gpus")) {
    const auto serving = parse_gpu_serving(text("gpus"));
    if (!serving) return "--gpus must be serve, report-only or auto";
    c.gpus = *serving;
  }
  if (given("resource-name")) c.resource_name = text("resource-name");
  if (given("mig-strategy")) {
    const auto strategy = parse_mig_strategy(text("mig-strategy"));
    if (!strategy) return "--mig-strategy must be none, single or mixed";
    c.mig_strategy = *strategy;
  }
  if (given("device-list-strategy")) {
    c.gpu.strategies.clear();
    for (const std::string& name : split_commas(text("device-list-strategy"))) {
      const auto strategy = parse_strategy(name);
      if (!strategy)
        return "--device-list-strategy: \"" + name + "\" is not envvar, volume-mounts, cdi-annotations or cdi-cri";
      c.gpu.strategies.push_back(*strategy);
    }
  }
  if (given("pass-device-specs")) c.gpu.pass_device_specs = flags["pass-device-specs"].as<bool>();
  if (given("cdi-root")) c.cdi_root = text("cdi-root");
  if (given("nfd-feature-file")) {
    c.nfd_feature_file = text("nfd-feature-file");
    if (!c.nfd_feature_file.empty() && !c.nfd_feature_file.is_absolute()) {
      return "--nfd-feature-file must be an absolute path on the host, or empty";
    }
  }
  if (given("mps-root")) {
    c.gpu.mps_root = text("mps-root");
    if (!c.gpu.mps_root.starts_with('/')) return "--mps-root must be an absolute path on the host";
  }
  if (given("cdi-annotation-prefix")) c.gpu.cdi_annotation_prefix = text("cdi-annotation-prefix");
  if (given("shared-devices-allocation-policy")) {
    const auto policy = parse_shared_allocation(text("shared-devices-allocation-policy"));
    if (!policy) return "--shared-devices-allocation-policy must be distributed or packed";
    c.gpu.shared_allocation = *policy;
  }
  if (given("host-device")) {
    c.host_devices.clear();  // the flags' list replaces the file's
    for (const std::string& flag : flags["host-device"].as<std::vector<std::string>>()) {
      std::string error;
      auto device = parse_host_device(flag, error);
      if (!device) return error;
      c.host_devices.push_back(std::move(*device));
    }
  }
  if (given("health-checks")) c.health_checks = flags["health-checks"].as<bool>();
  for (const auto& [flag, xids] : {std::pair{"health-ignored-xids", &c.health.ignored_xids},
                                   std::pair{"health-reset-xids", &c.health.reset_xids}}) {
    if (!given(flag)) continue;
    std::string error;
    auto parsed = parse_xid_list(text(flag), error);
    if (!parsed) return std::string("--") + flag + ": " + error;
    *xids = std::move(*parsed);
  }
  if (given("metrics-address")) c.metrics_address = text("metrics-address");
  if (given("node-name")) c.node_name = text("node-name");
  if (given("policy-dir")) c.policy_dir = text("policy-dir");
  if (given("infrastructure-namespaces")) {
    std::string error;
    auto namespaces = parse_namespace_list(text("infrastructure-namespaces"), error);
    if (!namespaces) return "--infrastructure-namespaces: " + error;
    c.infrastructure_namespaces = std::move(*namespaces);
  }
  return check_config(c);
}

// The config file's keys that each flag sets too: a flag given wins over them, and says so.
constexpr std::pair<const char*, const char*> kFlagKeys[] = {
    {"device-plugin-dir", "gpuguard.devicePluginDir"},
    {"host-root", "gpuguard.hostRoot"},
    {"discovery", "gpuguard.discovery"},
    {"discovery", "flags.deviceDiscoveryStrategy"},
    {"fail-on-init-error", "flags.failOnInitError"},
    {"gpus", "gpuguard.gpus"},
    {"resource-name", "gpuguard.resourceName"},
    {"mig-strategy", "flags.migStrategy"},
    {"device-list-strategy", "flags.plugin.deviceListStrategy"},
    {"pass-device-specs", "flags.plugin.passDeviceSpecs"},
    {"cdi-root", "gpuguard.cdiRoot"},
    {"nfd-feature-file", "gpuguard.nfdFeatureFile"},
    {"mps-root", "flags.mpsRoot"},
    {"cdi-annotation-prefix", "flags.plugin.cdiAnnotationPrefix"},
    {"shared-devices-allocation-policy", "flags.plugin.sharedDevicesAllocationPolicy"},
    {"host-device", "gpuguard.hostDevices"},
    {"health-checks", "gpuguard.health.checks"},
    {"health-ignored-xids", "gpuguard.health.ignoredXids"},
    {"health-reset-xids", "gpuguard.health.resetXids"},
    {"metrics-address", "gpuguard.metricsAddress"},
    {"node-name", "gpuguard.nodeName"},
    {"policy-dir", "gpuguard.policyDir"},
    {"infrastructure-namespaces", "gpuguard.infrastructureNamespaces"},
};

}  // namespace

void add_flags(po::options_description& description) {
  // No flag has a default here: a flag left out keeps the config file's value (or the built-in default
  // the help text names).
  description.add_options()("config-file", po::value<std::string>(),
                            "YAML config in NVIDIA's structure (version: v1, flags, sharing) plus a gpuguard "
                            "section; the flags given override it")(
      "device-plugin-dir", po::value<std::string>(),
      "the kubelet's device plugin directory (default /var/lib/kubelet/device-plugins/)")(
      "pod-resources-socket", po::value<std::string>(),
      "the kubelet's pod-resources API: a GPU the kubelet offers under another plugin's resource is withheld, and "
      "every GPU until it has answered (default /var/lib/kubelet/pod-resources/kubelet.sock); empty: not asked")(
      "host-root", po::value<std::string>(), "where the host's /proc, /dev, /sys and /etc are (default /)")(
      "discovery", po::value<std::string>(),
      "auto (NVML when it loads, else procfs; the default), nvml, procfs, or none (serve host devices only)")(
      "fail-on-init-error", po::value<bool>()->implicit_value(true),
      "exit when no GPU can be served instead of serving host devices alone (default false)")(
      "gpus", po::value<std::string>(),
      "serve (the default): serve the GPU resources to the kubelet; report-only: only judge the node (node report, "
      "GPUIsolation condition), where another plugin serves them; auto: report only where NVIDIA's device plugin "
      "answers on its socket for the resource (nvidia-gpu.sock for nvidia.com/gpu), and record the GPUs so left, "
      "which later starts withhold")("resource-name", po::value<std::string>(),
                                     "the GPU resource name (default nvidia.com/gpu)")(
      "mig-strategy", po::value<std::string>(), "none (the default), single or mixed")(
      "device-list-strategy", po::value<std::string>(),
      "comma-separated: envvar (the default), volume-mounts, cdi-cri (or cdi), cdi-annotations")(
      "pass-device-specs", po::value<bool>()->implicit_value(true),
      "also pass the GPUs' device nodes and the control nodes as DeviceSpecs (default false)")(
      "cdi-root", po::value<std::string>(),
      "the host's directory (under --host-root) where the CDI spec is written, for the cdi strategies and "
      "for NVIDIA's runtime in cdi mode (default /var/run/cdi); empty: write none, and the cdi strategies "
      "name nvidia-ctk's nvidia.com/gpu devices")("cdi-annotation-prefix", po::value<std::string>(),
                                                  "for cdi-annotations (default cdi.k8s.io/)")(
      "nfd-feature-file", po::value<std::string>(),
      "the host's file (under --host-root) that gets the labels NVIDIA's GPU feature discovery sets for the GPU "
      "resources (<resource>.replicas, .sharing-strategy, .product), for NFD's local feature source, such as "
      "/etc/kubernetes/node-feature-discovery/features.d/gpuguard (default: none)")(
      "mps-root", po::value<std::string>(),
      "the host's directory (under --host-root) of the MPS daemons, a directory per GPU shared by sharing.mps "
      "(default /run/gpuguard/mps)")(
      "shared-devices-allocation-policy", po::value<std::string>(),
      "time-sliced replicas preferred from the least used GPUs (distributed, the default) or the most used (packed)")(
      "host-device", po::value<std::vector<std::string>>()->composing(),
      "RESOURCE=PATH[,PATH...][:SLOTS], repeatable: github.com/fuse=/dev/fuse:16, example.com/serial=/dev/ttyUSB*")(
      "health-checks", po::value<bool>(), "false: every device stays Healthy (default true)")(
      "health-ignored-xids", po::value<std::string>(),
      "XIDs an application causes: logged, the GPU stays healthy (default 13,31,43,45,68,109)")(
      "health-reset-xids", po::value<std::string>(),
      "XIDs after which a GPU needs a reset: unhealthy until NVML shows it was reset (default "
      "48,62,64,74,79,94,95,110,119,120,136,140,143,155,156,158)")(
      "metrics-address", po::value<std::string>(),
      "IP:port for /healthz, /readyz and /metrics over plain HTTP (default 0.0.0.0:8080)")(
      "node-name", po::value<std::string>(),
      "this node's name: the plugin keeps its GPUIsolation condition (needs patch on nodes/status); default "
      "none, no condition")("policy-dir", po::value<std::string>(),
                            "the webhook's policy ConfigMap, mounted: the condition judges its visibleDevicesValue "
                            "(default: none)")(
      "infrastructure-namespaces", po::value<std::string>(),
      "comma-separated: the GPU infrastructure's namespaces, which tenants cannot create pods in; a pod of one "
      "that runs NVIDIA's device plugin, or its DRA driver's kubelet plugin for GPUs, on this node withholds every "
      "GPU, before that plugin registers or publishes "
      "(default: none)");
}

std::optional<PluginConfig> config_from(const po::variables_map& flags, std::vector<std::string>& warnings) {
  PluginConfig config;
  if (flags.count("config-file")) {
    ConfigFileResult file = apply_config_file(flags["config-file"].as<std::string>(), config);
    if (file.error) {
      std::cerr << "gpuguard-device-plugin: " << *file.error << "\n";
      return std::nullopt;
    }
    warnings = std::move(file.warnings);
    for (const auto& [flag, key] : kFlagKeys) {
      if (flags.count(flag) != 0 && std::find(file.keys.begin(), file.keys.end(), key) != file.keys.end()) {
        warnings.push_back(std::string("--") + flag + " overrides the config file's " + key);
      }
    }
  }
  if (auto error = apply_flags(flags, config)) {
    std::cerr << "gpuguard-device-plugin: " << *error << " (see --help)\n";
    return std::nullopt;
  }
  return config;
}

}  // namespace gpuguard::deviceplugin

#pragma once
// Everything the device plugin is told: defaults, then the config file (NVIDIA's structure, version v1,
// plus a gpuguard section), then the flags given on the command line. docs/device-plugin.md maps every
// NVIDIA key to gpuguard's.
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/deviceplugin/gpu_resource.hpp"
#include "gpuguard/deviceplugin/health.hpp"
#include "gpuguard/deviceplugin/host_device.hpp"
#include "gpuguard/discovery/discovery.hpp"

namespace gpuguard::deviceplugin {

// Whether the plugin serves its GPU resources to the kubelet, or only judges the node (the node report, the
// GPUIsolation condition) where another plugin serves them: NVIDIA's, or the GPU Operator's.
enum class GpuServing { serve, report_only, automatic };
std::optional<GpuServing> parse_gpu_serving(std::string_view name);  // serve, report-only, auto
// Namespace names, as k8s::split_list splits them, each checked as the API server checks one (a DNS label);
// nullopt with the reason otherwise.
std::optional<std::set<std::string>> parse_namespace_list(std::string_view text, std::string& error);

struct PluginConfig {
  std::filesystem::path plugin_dir = "/var/lib/kubelet/device-plugins/";
  // The kubelet's pod-resources API: what it offers under every resource name, so that no GPU another
  // plugin serves is served here too (other_servers.hpp). Empty: not asked, and every GPU is served.
  std::filesystem::path pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::filesystem::path host_root = "/";
  discovery::DiscoveryMode discovery = discovery::DiscoveryMode::automatic;
  // Exit non-zero when no GPU can be served (NVML failing, no GPU found, the MIG strategy not fitting),
  // instead of serving the host devices alone.
  bool fail_on_init_error = false;
  // automatic: report only when NVIDIA's device plugin already serves the resource on this node.
  GpuServing gpus = GpuServing::serve;
  std::string resource_name = "nvidia.com/gpu";
  MigStrategy mig_strategy = MigStrategy::none;
  GpuOptions gpu;
  // Where the CDI spec is written for the cdi strategies; empty: write none, and name nvidia-ctk's
  // nvidia.com/gpu devices instead.
  std::filesystem::path cdi_root = "/var/run/cdi";  // on the host: written under host_root
  Sharing sharing;                                  // time-slicing or MPS
  // On the host (under host_root): the file, read by NFD's local feature source, that gets the labels
  // NVIDIA's GPU feature discovery would set for the GPU resources (GpuPlan::labels); empty: none written.
  std::filesystem::path nfd_feature_file;
  std::vector<HostDevice> host_devices;
  bool health_checks = true;
  NvmlHealthOptions health;
  std::string metrics_address = "0.0.0.0:8080";
  // The Node whose GPUIsolation condition the plugin keeps; empty: no condition is written.
  std::string node_name;
  // The webhook's policy ConfigMap, mounted: the condition judges its visibleDevicesValue. Without it,
  // the default policy's (none).
  std::optional<std::filesystem::path> policy_dir;
  // The namespaces of the GPU infrastructure, which tenants cannot create pods in: a pod of one of them that
  // runs NVIDIA's device plugin on this node withholds every GPU, before that plugin has registered.
  std::set<std::string> infrastructure_namespaces;
};

struct ConfigFileResult {
  std::optional<std::string> error;   // "<file>: <key>: <reason>"; the config is then unchanged
  std::vector<std::string> warnings;  // keys accepted but without effect, said at start
  std::vector<std::string> keys;      // every key the file sets, dotted ("flags.plugin.deviceListStrategy")
};

// Applies a config file's text on top of `config`. `source` names the file in messages.
ConfigFileResult apply_config_text(std::string_view text, const std::string& source, PluginConfig& config);
ConfigFileResult apply_config_file(const std::filesystem::path& file, PluginConfig& config);

// The whole config, checked together (a resource named twice, a rename that collides); returns the reason.
std::optional<std::string> check_config(const PluginConfig& config);

}  // namespace gpuguard::deviceplugin

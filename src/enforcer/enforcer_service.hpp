#pragma once
// gpuguard-node-enforcer put together: the NRI plugin (src/nri), the decision (decision.hpp) with the
// kubelet's allocation (kubelet_client.hpp), the node's GPUs and CDI devices, the policy ConfigMap, the
// report of running containers, and /healthz, /readyz and /metrics.
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gpuguard/kube/api_server.hpp"

namespace gpuguard::enforcer {

struct EnforcerConfig {
  std::filesystem::path nri_socket = "/var/run/nri/nri.sock";
  std::chrono::milliseconds nri_unserved_after{30'000};  // nri::PluginOptions::unserved_after
  std::string plugin_name = "gpuguard";
  std::string plugin_index = "50";
  std::filesystem::path pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  // Where the host's /proc/driver/nvidia, /dev, /etc/cdi and /var/run/cdi are.
  std::filesystem::path host_root = "/";
  // The kubelet's directory, as a host path: pods' volumes lie under it.
  std::filesystem::path kubelet_root = "/var/lib/kubelet";
  std::optional<std::filesystem::path> policy_dir;
  std::string metrics_address = "0.0.0.0:8080";
  // namespace/name pairs exempt besides the policy's: gpuguard's own device plugin, which needs every GPU
  // for NVML and is not the pod author's to name.
  std::vector<std::string> exempt_service_accounts;
  // MPS roots besides gpuguard's default and NVIDIA's (the device plugin's --mps-root).
  std::vector<std::string> mps_roots;
  // This node's name, for the Node events of the report; empty: no events.
  std::string node_name;
  // For the events, and for the service accounts an exemption names; none: neither.
  std::optional<kube::ApiServer> apiserver;
  // Where gpuguard-mask-check is copied at the start, at the same path on the host (EnforcerOptions::mask_hook);
  // none: no mask check on CRI-O.
  std::optional<std::filesystem::path> mask_hook_dir;
  // The break-glass ConfigMap, as namespace and name (break_glass.hpp); empty: none. Needs the API.
  std::string break_glass_namespace, break_glass_name;
};

// Serves until SIGTERM or SIGINT. Throws std::runtime_error when it cannot start.
void serve(const EnforcerConfig& config);

}  // namespace gpuguard::enforcer

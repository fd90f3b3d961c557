#pragma once
// What the device plugin's status port (server::StatusRoutes) says: whether it is ready (every resource is
// registered with the kubelet, and the GPUs checked against what other plugins serve; reporting only, once
// the node is judged) and its /metrics (where GPUs were
// discovered, where their health comes from, how many devices of each resource are healthy, how many GPUs
// another plugin serves, and on a GPU node whether the injected value keeps GPUs out there).
#include <memory>
#include <string>
#include <vector>

#include "gpuguard/deviceplugin/kubelet_session.hpp"
#include "gpuguard/deviceplugin/node_isolation.hpp"
#include "gpuguard/deviceplugin/other_servers.hpp"
#include "gpuguard/deviceplugin/resource.hpp"

namespace gpuguard::deviceplugin {

struct PluginStatus {
  std::string version;
  std::string discovery;  // nvml, procfs or none
  std::string health;     // nvml (XID events and probes), presence (device files) or off
  std::string gpus;       // served; report-only (another plugin serves them: the node is judged only); none found
};

class StatusPage {
 public:
  StatusPage(PluginStatus status, const std::vector<std::unique_ptr<Resource>>& resources,
             const KubeletSession& kubelet, const NodeIsolation& isolation, const OtherServers* others = nullptr)
      : status_(std::move(status)), resources_(resources), kubelet_(kubelet), isolation_(isolation), others_(others) {}

  bool ready() const;
  std::string render_metrics() const;

 private:
  PluginStatus status_;
  const std::vector<std::unique_ptr<Resource>>& resources_;
  const KubeletSession& kubelet_;
  const NodeIsolation& isolation_;
  const OtherServers* others_;  // null where the kubelet's offers are not asked
};

}  // namespace gpuguard::deviceplugin

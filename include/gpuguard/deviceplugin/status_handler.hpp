#pragma once
// The device plugin's own HTTP routes, for probes and Prometheus: /healthz, /readyz (every resource is
// registered with the kubelet; reporting only, once the node is judged) and /metrics (where GPUs were discovered, where
// their health comes from, how many devices of each resource are healthy, and on a GPU node whether the injected value
// keeps GPUs out there).
#include <memory>
#include <string>
#include <vector>

#include "gpuguard/deviceplugin/kubelet_session.hpp"
#include "gpuguard/deviceplugin/node_isolation.hpp"
#include "gpuguard/deviceplugin/resource.hpp"
#include "gpuguard/server/http.hpp"

namespace gpuguard::deviceplugin {

struct PluginStatus {
  std::string version;
  std::string discovery;  // nvml, procfs or none
  std::string health;     // nvml (XID events and probes), presence (device files) or off
  std::string gpus;       // served; report-only (another plugin serves them: the node is judged only); none found
};

class StatusHandler final : public server::Handler {
 public:
  StatusHandler(PluginStatus status, const std::vector<std::unique_ptr<Resource>>& resources,
                const KubeletSession& kubelet, const NodeIsolation& isolation)
      : status_(std::move(status)), resources_(resources), kubelet_(kubelet), isolation_(isolation) {}

  std::optional<server::Response> reject_early(const server::RequestHead& head) const override;
  server::Response handle(const server::RequestHead& head, std::string body) const override;
  std::string render_metrics() const;

 private:
  PluginStatus status_;
  const std::vector<std::unique_ptr<Resource>>& resources_;
  const KubeletSession& kubelet_;
  const NodeIsolation& isolation_;
};

}  // namespace gpuguard::deviceplugin

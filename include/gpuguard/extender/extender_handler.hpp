#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "gpuguard/extender/cluster_state.hpp"
#include "gpuguard/extender/extender_metrics.hpp"
#include "gpuguard/policy/policy.hpp"
#include "gpuguard/server/http.hpp"

namespace gpuguard::extender {

// The extender's routes: POST <prefix>/filter and <prefix>/prioritize (see scheduling.hpp), GET /healthz,
// GET /readyz (pods and nodes listed, and not shutting down), GET /metrics.
class ExtenderHandler final : public server::Handler {
 public:
  ExtenderHandler(const std::string& url_prefix, const ClusterState& state, std::function<bool()> synced,
                  policy::PolicyProvider policy, ExtenderMetrics& metrics);

  void set_shutting_down() { shutting_down_.store(true); }

  std::optional<server::Response> reject_early(const server::RequestHead& head) const override;
  server::Response handle(const server::RequestHead& head, std::string body) const override;

 private:
  std::string filter_path_, prioritize_path_;
  const ClusterState& state_;
  std::function<bool()> synced_;
  policy::PolicyProvider policy_;
  ExtenderMetrics& metrics_;
  std::atomic<bool> shutting_down_{false};
};

}  // namespace gpuguard::extender

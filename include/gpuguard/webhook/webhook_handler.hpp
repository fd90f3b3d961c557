#pragma once
#include <atomic>
#include <functional>
#include <memory>

#include "gpuguard/admission/policy.hpp"
#include "gpuguard/metrics/registry.hpp"
#include "gpuguard/server/http.hpp"

namespace gpuguard::webhook {

using PolicyProvider = std::function<std::shared_ptr<const admission::Policy>()>;

// The webhook's routes: POST /mutate runs the admission core with the policy in force; GET /healthz says
// the process serves; GET /readyz says the certificate and policy are loaded and it is not shutting
// down; GET /metrics is the Prometheus scrape.
class WebhookHandler final : public server::Handler {
 public:
  WebhookHandler(PolicyProvider policy, metrics::Registry& metrics)
      : policy_(std::move(policy)), metrics_(metrics) {}

  void set_ready(bool ready) { ready_.store(ready); }

  std::optional<server::Response> reject_early(const server::RequestHead& head) const override;
  server::Response handle(const server::RequestHead& head, std::string body) const override;

 private:
  server::Response mutate(std::string body) const;

  PolicyProvider policy_;
  metrics::Registry& metrics_;
  std::atomic<bool> ready_{false};
};

}  // namespace gpuguard::webhook

#pragma once
#include <atomic>
#include <functional>
#include <memory>

#include "gpuguard/policy/policy.hpp"
#include "gpuguard/server/http.hpp"
#include "gpuguard/webhook/webhook_metrics.hpp"

namespace gpuguard::webhook {

// The webhook's routes: POST /mutate runs the admission core with the policy in force; GET /healthz says
// the process serves; GET /readyz says the certificate and policy are loaded and it is not shutting
// down; GET /metrics is the Prometheus scrape.
class WebhookHandler final : public server::Handler {
 public:
  WebhookHandler(policy::PolicyProvider policy, WebhookMetrics& metrics)
      : policy_(std::move(policy)), metrics_(metrics) {}

  void set_ready(bool ready) { ready_.store(ready); }

  std::optional<server::Response> reject_early(const server::RequestHead& head) const override;
  server::Response handle(const server::RequestHead& head, std::string body) const override;

 private:
  server::Response mutate(std::string body) const;

  policy::PolicyProvider policy_;
  WebhookMetrics& metrics_;
  std::atomic<bool> ready_{false};
};

}  // namespace gpuguard::webhook

#pragma once
#include <atomic>

#include "gpuguard/admission/policy.hpp"
#include "gpuguard/server/http.hpp"

namespace gpuguard::webhook {

// The webhook's routes: POST /mutate runs the admission core; GET /healthz says the process is alive;
// GET /readyz says the certificate and policy are loaded and the server is not shutting down.
class WebhookHandler final : public server::Handler {
 public:
  explicit WebhookHandler(admission::Policy policy) : policy_(std::move(policy)) {}

  void set_ready(bool ready) { ready_.store(ready); }

  std::optional<server::Response> reject_early(const server::RequestHead& head) const override;
  server::Response handle(const server::RequestHead& head, std::string body) const override;

 private:
  admission::Policy policy_;
  std::atomic<bool> ready_{false};
};

}  // namespace gpuguard::webhook

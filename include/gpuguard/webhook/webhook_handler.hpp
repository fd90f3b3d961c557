#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "gpuguard/admission/claims.hpp"
#include "gpuguard/policy/policy.hpp"
#include "gpuguard/server/http.hpp"
#include "gpuguard/webhook/admission_switches.hpp"
#include "gpuguard/webhook/webhook_metrics.hpp"

namespace gpuguard::webhook {

// The webhook's routes: POST /mutate runs the admission core with the policy in force and the DRA
// claims the webhook knows; GET /healthz says the process serves; GET /readyz says the certificate and
// policy are loaded, the DRA claims have been listed where they are read (before that, a container that
// claims a GPU would be taken for one that asks for none), and it is not shutting down; GET /metrics is
// the Prometheus scrape.
class WebhookHandler final : public server::Handler {
 public:
  // `claims` may be null (no Kubernetes API): every DRA claim is then unresolved.
  WebhookHandler(policy::PolicyProvider policy, WebhookMetrics& metrics, const admission::ClaimLookup* claims = nullptr,
                 std::function<bool()> claims_synced = {})
      : policy_(std::move(policy)), metrics_(metrics), claims_(claims), claims_synced_(std::move(claims_synced)) {}

  void set_ready(bool ready) { ready_.store(ready); }
  // What /readyz adds below "ok" (claims that cannot be read); set before the server runs.
  void set_readiness_note(std::function<std::string()> note) { readiness_note_ = std::move(note); }
  // Which webhook this is, said to the arm hook's probe pod (admission::kArmProbeAnnotation); set before the
  // server runs. Empty: nothing said.
  void set_instance(std::string instance) { instance_ = std::move(instance); }
  // The switches /metrics says are thrown, where the API is watched; set before the server runs.
  void set_switches(const AdmissionSwitches* switches) { switches_ = switches; }

  std::optional<server::Response> reject_early(const server::RequestHead& head) const override;
  server::Response handle(const server::RequestHead& head, std::string body) const override;

 private:
  server::Response mutate(std::string body) const;

  policy::PolicyProvider policy_;
  WebhookMetrics& metrics_;
  const admission::ClaimLookup* claims_;
  std::function<bool()> claims_synced_;
  std::function<std::string()> readiness_note_;
  std::string instance_;
  const AdmissionSwitches* switches_ = nullptr;
  std::atomic<bool> ready_{false};
  mutable std::mutex large_review_mutex_;
};

}  // namespace gpuguard::webhook

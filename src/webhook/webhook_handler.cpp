#include "gpuguard/webhook/webhook_handler.hpp"

#include <chrono>
#include <mutex>

#include "gpuguard/admission/review.hpp"
#include "gpuguard/log/log.hpp"

namespace gpuguard::webhook {
namespace {

AdmissionResult result_of(const admission::ReviewOutcome& outcome) {
  if (!outcome.ok) return AdmissionResult::invalid;
  if (!outcome.allowed) return AdmissionResult::denied;
  return outcome.patched ? AdmissionResult::patched : AdmissionResult::allowed;
}

}  // namespace

std::optional<server::Response> WebhookHandler::reject_early(const server::RequestHead& head) const {
  if (head.path == "/mutate") return server::require_json_post(head);
  if (server::ProbeRoutes::owns(head.path)) return server::ProbeRoutes::reject_early(head);
  return server::text_response(404, "not found");
}

server::Response WebhookHandler::handle(const server::RequestHead& head, std::string body) const {
  if (head.path == "/mutate") return mutate(std::move(body));
  // Until the claims are listed, a container that claims a GPU would be read as asking for none and get
  // the injected value: a wrong answer, so the replica is not ready (claims off count as listed).
  const bool claims_listed = !claims_synced_ || claims_synced_();
  std::string note;
  if (head.path == "/readyz") {
    if (ready_.load() && !claims_listed) {
      note = "DRA claims not listed yet: a container that claims a GPU would be taken for one that asks for none";
    } else if (readiness_note_) {
      note = readiness_note_();
    }
  }
  return server::ProbeRoutes::respond(
      head.path, ready_.load() && claims_listed,
      [this] {
        std::string page = metrics_.render(claims_synced_ ? std::optional<bool>(claims_synced_()) : std::nullopt);
        if (switches_) switches_->render(page);
        return page;
      },
      note);
}

server::Response WebhookHandler::mutate(std::string body) const {
  const std::size_t bytes = body.size();
  const auto started = std::chrono::steady_clock::now();
  // One large review at a time, process-wide: decoding one costs many times its size (MemoryCosts), and
  // the memory plan counts that once.
  std::unique_lock<std::mutex> large_review(large_review_mutex_, std::defer_lock);
  if (bytes > admission::kReusableParserLimit) large_review.lock();
  admission::ReviewOutcome outcome = admission::review(std::move(body), *policy_(), claims_, instance_);
  if (large_review.owns_lock()) large_review.unlock();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
  metrics_.count_admission(outcome.operation, result_of(outcome), took.count());
  if (!outcome.ok) {
    log::info("admission request rejected", {{"status", 400}, {"reason", outcome.body}, {"bytes", bytes}});
    return server::text_response(400, "invalid AdmissionReview: " + outcome.body);
  }
  metrics_.count_mutations(outcome.mutations);
  metrics_.count_doors(outcome.doors);
  if (!outcome.allowed) {
    log::info("admission denied", {{"uid", outcome.uid}, {"operation", outcome.operation}, {"reason", outcome.denial}});
  } else {
    log::debug("admission reviewed", {{"uid", outcome.uid},
                                      {"operation", outcome.operation},
                                      {"patched", outcome.patched},
                                      {"warnings", outcome.warnings},
                                      {"bytes", bytes},
                                      {"micros", static_cast<long long>(took.count() * 1e6)}});
  }
  server::Response response = server::json_response(std::move(outcome.body));
  // The API server keeps its connection to one replica; closed, its next call opens another, which the
  // Service (or the API server's endpoint routing) may send to another replica, so that the arm hook can
  // hear each one.
  response.close_connection = outcome.arm_probe;
  return response;
}

}  // namespace gpuguard::webhook

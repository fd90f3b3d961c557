#include "gpuguard/webhook/webhook_handler.hpp"

#include "gpuguard/admission/review.hpp"
#include "gpuguard/log/log.hpp"

namespace gpuguard::webhook {
namespace {

server::Response method_not_allowed(std::string_view allowed) {
  server::Response response = server::text_response(405, "method not allowed");
  response.headers.emplace_back("Allow", std::string(allowed));
  return response;
}

bool is_get(std::string_view method) { return method == "GET" || method == "HEAD"; }

}  // namespace

std::optional<server::Response> WebhookHandler::reject_early(const server::RequestHead& head) const {
  if (head.path == "/mutate") {
    if (head.method != "POST") return method_not_allowed("POST");
    if (!server::is_json_content_type(head.content_type)) {
      return server::text_response(415, "Content-Type must be application/json");
    }
    return std::nullopt;
  }
  if (head.path == "/healthz" || head.path == "/readyz") {
    if (!is_get(head.method)) return method_not_allowed("GET, HEAD");
    return std::nullopt;
  }
  return server::text_response(404, "not found");
}

server::Response WebhookHandler::handle(const server::RequestHead& head, std::string body) const {
  if (head.path == "/healthz") return server::text_response(200, "ok");
  if (head.path == "/readyz") {
    return ready_.load() ? server::text_response(200, "ok") : server::text_response(503, "not ready");
  }

  const std::size_t bytes = body.size();
  admission::ReviewOutcome outcome = admission::review(std::move(body), policy_);
  if (!outcome.ok) {
    log::info("admission request rejected", {{"status", 400}, {"reason", outcome.body}, {"bytes", bytes}});
    return server::text_response(400, "invalid AdmissionReview: " + outcome.body);
  }
  log::debug("admission reviewed", {{"uid", outcome.uid},
                                    {"operation", outcome.operation},
                                    {"patched", outcome.patched},
                                    {"containers_mutated", outcome.containers_mutated},
                                    {"warnings", outcome.warnings},
                                    {"bytes", bytes}});
  server::Response response;
  response.content_type = "application/json";
  response.body = std::move(outcome.body);
  return response;
}

}  // namespace gpuguard::webhook

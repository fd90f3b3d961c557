#include "gpuguard/webhook/webhook_handler.hpp"

#include <chrono>

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

bool is_get_route(std::string_view path) { return path == "/healthz" || path == "/readyz" || path == "/metrics"; }

std::string_view result_of(const admission::ReviewOutcome& outcome) {
  if (!outcome.ok) return "invalid";
  if (!outcome.allowed) return "denied";
  return outcome.patched ? "patched" : "allowed";
}

}  // namespace

std::optional<server::Response> WebhookHandler::reject_early(const server::RequestHead& head) const {
  if (head.path == "/mutate") {
    if (head.method != "POST") return method_not_allowed("POST");
    if (!server::is_json_content_type(head.content_type)) {
      return server::text_response(415, "Content-Type must be application/json");
    }
    return std::nullopt;
  }
  if (is_get_route(head.path)) {
    if (!is_get(head.method)) return method_not_allowed("GET, HEAD");
    return std::nullopt;
  }
  return server::text_response(404, "not found");
}

server::Response WebhookHandler::handle(const server::RequestHead& head, std::string body) const {
  if (head.path == "/mutate") return mutate(std::move(body));
  if (head.path == "/healthz") return server::text_response(200, "ok");
  if (head.path == "/readyz") {
    return ready_.load() ? server::text_response(200, "ok") : server::text_response(503, "not ready");
  }
  server::Response scrape;
  scrape.content_type = "text/plain; version=0.0.4; charset=utf-8";
  scrape.body = metrics_.render();
  return scrape;
}

server::Response WebhookHandler::mutate(std::string body) const {
  const std::size_t bytes = body.size();
  const auto started = std::chrono::steady_clock::now();
  admission::ReviewOutcome outcome = admission::review(std::move(body), *policy_());
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
  metrics_.count_admission(outcome.operation, result_of(outcome), took.count());
  if (!outcome.ok) {
    log::info("admission request rejected", {{"status", 400}, {"reason", outcome.body}, {"bytes", bytes}});
    return server::text_response(400, "invalid AdmissionReview: " + outcome.body);
  }
  metrics_.count_mutations(outcome.mutations);
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
  server::Response response;
  response.content_type = "application/json";
  response.body = std::move(outcome.body);
  return response;
}

}  // namespace gpuguard::webhook

#include "gpuguard/extender/extender_handler.hpp"

#include <chrono>

#include "gpuguard/extender/scheduling.hpp"
#include "gpuguard/log/log.hpp"

namespace gpuguard::extender {

ExtenderHandler::ExtenderHandler(const std::string& url_prefix, const ClusterState& state, std::function<bool()> synced,
                                 policy::PolicyProvider policy, ExtenderMetrics& metrics)
    : filter_path_(url_prefix + "/filter"),
      prioritize_path_(url_prefix + "/prioritize"),
      state_(state),
      synced_(std::move(synced)),
      policy_(std::move(policy)),
      metrics_(metrics) {}

std::optional<server::Response> ExtenderHandler::reject_early(const server::RequestHead& head) const {
  if (head.path == filter_path_ || head.path == prioritize_path_) return server::require_json_post(head);
  if (server::ProbeRoutes::owns(head.path)) return server::ProbeRoutes::reject_early(head);
  return server::text_response(404, "not found");
}

server::Response ExtenderHandler::handle(const server::RequestHead& head, std::string body) const {
  const bool synced = synced_();
  if (head.path != filter_path_ && head.path != prioritize_path_) {
    return server::ProbeRoutes::respond(head.path, synced && !shutting_down_.load(), [&] {
      return metrics_.render({synced, state_.pod_count(), state_.node_count(), state_.unreadable_count("pods"),
                              state_.unreadable_count("nodes")});
    });
  }
  const bool is_filter = head.path == filter_path_;
  const std::string_view verb = is_filter ? "filter" : "prioritize";
  const auto started = std::chrono::steady_clock::now();
  const auto policy = policy_();
  VerbResult result = is_filter ? filter(body, state_, *policy, synced) : prioritize(body, state_, *policy, synced);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
  metrics_.count_request(is_filter ? Verb::filter : Verb::prioritize,
                         result.status != 200 ? CallResult::invalid
                         : synced             ? CallResult::ok
                                              : CallResult::not_synced,
                         took.count());
  if (result.status != 200) {
    log::info("extender request rejected", {{"verb", verb}, {"status", result.status}, {"reason", result.body}});
    return server::text_response(result.status, "invalid ExtenderArgs: " + result.body);
  }
  return server::json_response(std::move(result.body));
}

}  // namespace gpuguard::extender

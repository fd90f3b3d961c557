// NodeConditionWriter: the node report's verdict, carried to the Node object through the API server.
#include "gpuguard/deviceplugin/node_condition_writer.hpp"

#include "gpuguard/kube/request.hpp"
#include "gpuguard/log/log.hpp"

namespace gpuguard::deviceplugin {
namespace {

using namespace std::chrono_literals;

// Connecting, then the request, each within this: a plugin told to stop while a write hangs stops within
// twice it, inside the pod's grace period.
constexpr auto kRequestTimeout = 5s;

bool same(const nodereport::Condition& a, const nodereport::Condition& b) {
  return a.status == b.status && a.reason == b.reason && a.message == b.message;
}

}  // namespace

kube::Reply patch_node_status(const kube::ApiServer& server, const std::string& node, std::string body,
                              std::string user_agent, std::chrono::milliseconds timeout) {
  const kube::Request request{"PATCH",
                              "/api/v1/nodes/" + node + "/status",
                              "application/strategic-merge-patch+json",
                              std::move(body),
                              std::move(user_agent),
                              {}};
  try {
    return kube::send_request(server, request, timeout);
  } catch (const std::exception& e) {
    kube::Reply reply;
    reply.error = e.what();
    return reply;
  }
}

NodeConditionWriter::NodeConditionWriter(kube::ApiServer server, std::string node_name, NodeIsolation& metrics)
    : server_(std::move(server)), node_name_(std::move(node_name)), metrics_(metrics) {}

std::optional<std::string> NodeConditionWriter::patch(const std::string& body) {
  kube::Reply reply = patch_node_status(server_, node_name_, body, "gpuguard-device-plugin", kRequestTimeout);
  if (reply.error.empty() && reply.status / 100 == 2) {
    if (!last_error_.empty()) log::info("node condition written again", {{"node", node_name_}});
    last_error_.clear();
    return std::move(reply.body);
  }
  metrics_.count_condition_write(false);
  if (reply.error != last_error_) {
    log::warn("cannot write the node condition",
              {{"node", node_name_}, {"condition", nodereport::kConditionType}, {"reason", reply.error}});
  }
  last_error_ = std::move(reply.error);
  return std::nullopt;
}

void NodeConditionWriter::update(const nodereport::Report& report, std::chrono::system_clock::time_point now) {
  const nodereport::Condition condition = nodereport::condition_of(report);
  if (written_ && same(*written_, condition) && now - written_at_ < kConditionHeartbeat) return;
  const std::string now_text =
      nodereport::rfc3339(std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count());
  if (!learned_) {
    // An empty patch changes nothing and answers with the Node: the condition a previous run left.
    const auto node = patch("{}");
    if (!node) return;
    if (const auto seen = nodereport::seen_condition(*node)) {
      status_on_node_ = seen->status;
      transition_time_ = seen->last_transition_time;
    }
    learned_ = true;
  }
  if (condition.status != status_on_node_ || transition_time_.empty()) transition_time_ = now_text;
  if (!patch(nodereport::condition_patch(condition, now_text, transition_time_))) return;
  metrics_.count_condition_write(true);
  if (!written_ || written_->status != condition.status || written_->reason != condition.reason) {
    log::info("node condition written", {{"node", node_name_},
                                         {"condition", nodereport::kConditionType},
                                         {"status", condition.status},
                                         {"reason", condition.reason}});
  }
  status_on_node_ = condition.status;
  written_ = condition;
  written_at_ = now;
}

}  // namespace gpuguard::deviceplugin

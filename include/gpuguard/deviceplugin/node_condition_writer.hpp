#pragma once
// Keeps this node's GPUIsolation condition (nodereport/node_condition.hpp) on its Node object: written
// when the node report's verdict for the policy's value changes, and again every kConditionHeartbeat so
// that a stale condition (a plugin gone) shows in lastHeartbeatTime. It needs only `patch` on
// `nodes/status`: what is already there it learns from the answer to an empty patch.
#include <chrono>
#include <optional>
#include <string>

#include "gpuguard/deviceplugin/node_isolation.hpp"
#include "gpuguard/kube/api_server.hpp"
#include "gpuguard/kube/request.hpp"
#include "gpuguard/nodereport/node_condition.hpp"

namespace gpuguard::deviceplugin {

inline constexpr std::chrono::minutes kConditionHeartbeat{5};

// A strategic merge patch of `node`'s status (application/strategic-merge-patch+json), as `user_agent`:
// the answer, or in `error` why there is none; never throws. The writer below sends its condition with it,
// and forget-node its removal.
kube::Reply patch_node_status(const kube::ApiServer& server, const std::string& node, std::string body,
                              std::string user_agent, std::chrono::milliseconds timeout);

class NodeConditionWriter {
 public:
  NodeConditionWriter(kube::ApiServer server, std::string node_name, NodeIsolation& metrics);

  // Writes the condition the report comes to, when it is not the one last written or the heartbeat is
  // due. Blocks for at most a few seconds; a failure is logged (once per distinct reason), counted, and
  // tried again at the next call.
  void update(const nodereport::Report& report, std::chrono::system_clock::time_point now);

 private:
  // Sends a strategic merge patch of the Node's status; returns the Node as it now is.
  std::optional<std::string> patch(const std::string& body);

  kube::ApiServer server_;
  std::string node_name_;
  NodeIsolation& metrics_;
  bool learned_ = false;         // the Node's own condition has been read once
  std::string status_on_node_;   // the condition's status there: "True", "False" or ""
  std::string transition_time_;  // its lastTransitionTime
  std::optional<nodereport::Condition> written_;
  std::chrono::system_clock::time_point written_at_{};
  std::string last_error_;
};

}  // namespace gpuguard::deviceplugin

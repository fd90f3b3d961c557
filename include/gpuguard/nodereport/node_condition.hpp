#pragma once
// The node report as a Node condition, `GPUIsolation`, for admins and for `gpuguard-webhook audit
// --nodes`: True when the value the webhook injects keeps GPUs out of containers without one on this node
// (honoured, or not acted on), False when it does not. Pure: the condition, the strategic merge patch
// that sets it on the Node's status, and the reading of a Node's conditions; src/deviceplugin sends it.
#include <optional>
#include <string>
#include <string_view>

#include "gpuguard/nodereport/report.hpp"

namespace gpuguard::nodereport {

inline constexpr std::string_view kConditionType = "GPUIsolation";

struct Condition {
  std::string status;  // "True" or "False"
  std::string reason;  // CamelCase, as Kubernetes' reasons are: Honoured, NotActedOn, Leaks, BreaksPods
  std::string message;
};

Condition condition_of(const Report& report);

// `{"status":{"conditions":[...]}}`, merged by `type` into the Node's other conditions (the kubelet's
// among them). Times are RFC 3339 in UTC, as metav1.Time writes them.
std::string condition_patch(const Condition& condition, std::string_view heartbeat_time,
                            std::string_view transition_time);

// The strategic merge patch that removes the GPUIsolation condition from a Node's status and leaves the
// others (`$patch: delete` by `type`); a Node without it is left as it is. The node cleanup sends it after
// an uninstall, so that no condition goes on saying what a gone plugin last saw.
std::string condition_removal_patch();

// The GPUIsolation condition as a Node (JSON) carries it: status and lastTransitionTime.
struct SeenCondition {
  std::string status, reason, message, last_heartbeat_time, last_transition_time;
};
// nullopt when the text is not a Node's JSON or carries no such condition.
std::optional<SeenCondition> seen_condition(std::string_view node_json);

// Whether a Node's JSON says it has NVIDIA GPUs, as the chart's DaemonSets find GPU nodes: the labels of
// Node Feature Discovery (NVIDIA's PCI vendor, its CPU vendor on Tegra) or GPU Feature Discovery
// (nvidia.com/gpu.present), or an nvidia.com/ resource in its capacity. So that a GPU node without the
// GPUIsolation condition (no gpuguard plugin judges it) is told from a node without GPUs.
bool is_gpu_node(std::string_view node_json);

std::string rfc3339(long long unix_seconds);

}  // namespace gpuguard::nodereport

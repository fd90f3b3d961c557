// The GPUIsolation condition: what the node report says, in the shape of a Node condition.
#include "gpuguard/nodereport/node_condition.hpp"

#include <ctime>

#include <nlohmann/json.hpp>

namespace gpuguard::nodereport {

Condition condition_of(const Report& report) {
  Condition condition;
  condition.status = report.value_honoured() ? "True" : "False";
  switch (report.verdict) {
    case Verdict::honoured: condition.reason = "Honoured"; break;
    case Verdict::not_acted_on: condition.reason = "NotActedOn"; break;
    case Verdict::leaks: condition.reason = "Leaks"; break;
    case Verdict::breaks_pods: condition.reason = "BreaksPods"; break;
    case Verdict::cannot_judge: condition.reason = "CannotJudge"; break;
  }
  condition.message = "NVIDIA_VISIBLE_DEVICES=" + report.value + ": " + report.reason;
  if (report.verdict == Verdict::not_acted_on && !report.doors.empty()) {
    condition.message += "; the doors here:";
    for (const std::string& door : report.doors) condition.message += " " + door + ";";
    condition.message.pop_back();
  }
  condition.message += report.hardened ? "; hardened: " : "; not hardened: ";
  condition.message += report.hardening;
  return condition;
}

std::string condition_patch(const Condition& condition, std::string_view heartbeat_time,
                            std::string_view transition_time) {
  const nlohmann::json entry = {
      {"type", kConditionType},       {"status", condition.status},          {"reason", condition.reason},
      {"message", condition.message}, {"lastHeartbeatTime", heartbeat_time}, {"lastTransitionTime", transition_time}};
  // The message quotes the host's files (a version from dpkg), which need not be UTF-8.
  return nlohmann::json{{"status", {{"conditions", nlohmann::json::array({entry})}}}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string condition_removal_patch() {
  return nlohmann::json{
      {"status", {{"conditions", nlohmann::json::array({{{"type", kConditionType}, {"$patch", "delete"}}})}}}}
      .dump();
}

std::optional<SeenCondition> seen_condition(std::string_view node_json) {
  const auto node = nlohmann::json::parse(node_json, nullptr, false);
  if (!node.is_object()) return std::nullopt;
  const auto status = node.find("status");
  if (status == node.end() || !status->is_object()) return std::nullopt;
  const auto conditions = status->find("conditions");
  if (conditions == status->end() || !conditions->is_array()) return std::nullopt;
  const auto text = [](const nlohmann::json& object, const char* key) {
    const auto it = object.find(key);
    return it != object.end() && it->is_string() ? it->get<std::string>() : std::string{};
  };
  for (const nlohmann::json& condition : *conditions) {
    if (!condition.is_object() || text(condition, "type") != kConditionType) continue;
    return SeenCondition{text(condition, "status"), text(condition, "reason"), text(condition, "message"),
                         text(condition, "lastHeartbeatTime"), text(condition, "lastTransitionTime")};
  }
  return std::nullopt;
}

bool is_gpu_node(std::string_view node_json) {
  const auto node = nlohmann::json::parse(node_json, nullptr, false);
  if (!node.is_object()) return false;
  const nlohmann::json labels =
      node.value("metadata", nlohmann::json::object()).value("labels", nlohmann::json::object());
  if (labels.is_object()) {
    for (const auto& [key, value] : {std::pair{"feature.node.kubernetes.io/pci-10de.present", "true"},
                                     std::pair{"feature.node.kubernetes.io/cpu-model.vendor_id", "NVIDIA"},
                                     std::pair{"nvidia.com/gpu.present", "true"}}) {
      const auto label = labels.find(key);
      if (label != labels.end() && *label == value) return true;
    }
  }
  const nlohmann::json capacity =
      node.value("status", nlohmann::json::object()).value("capacity", nlohmann::json::object());
  if (!capacity.is_object()) return false;
  for (const auto& [resource, quantity] : capacity.items()) {
    if (resource.starts_with("nvidia.com/") && quantity.is_string() && quantity != "0") return true;
  }
  return false;
}

std::string rfc3339(long long unix_seconds) {
  const std::time_t time = static_cast<std::time_t>(unix_seconds);
  std::tm utc{};
  gmtime_r(&time, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace gpuguard::nodereport

// gpuguard-node-enforcer's /metrics page (include/gpuguard/enforcer/enforcer_metrics.hpp).
#include "gpuguard/enforcer/enforcer_metrics.hpp"

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::enforcer {
namespace {

using enforcement::Decision;

constexpr std::array<std::string_view, 3> kActions = {"allow", "adjust", "refuse"};
constexpr std::array<std::string_view, 8> kWhys = {"within", "enforced",     "audited",    "off",
                                                   "exempt", "cannot-judge", "privileged", "oversized"};

std::size_t why_index(Decision::Why why) {
  const std::string_view name = enforcement::why_name(why);
  for (std::size_t i = 0; i < kWhys.size(); ++i) {
    if (kWhys[i] == name) return i;
  }
  return 0;
}

}  // namespace

EnforcerMetrics::EnforcerMetrics(std::string version)
    : version_(std::move(version)), decisions_("action", kActions, "why", kWhys) {}

void EnforcerMetrics::count_decision(const enforcement::Decision& decision, double seconds) {
  decisions_.add(static_cast<std::size_t>(decision.action), why_index(decision.why));
  durations_.observe(seconds);
}

std::string EnforcerMetrics::render(const nri::PluginStats& connection, std::string_view mode) const {
  std::string out;
  metrics::header(out, "gpuguard_node_enforcer_mode", "gauge",
                  "1, labelled with the policy's nodeEnforcement in force.");
  out.append("gpuguard_node_enforcer_mode{mode=\"").append(mode).append("\"} 1\n");
  metrics::header(out, "gpuguard_node_enforcer_decisions_total", "counter",
                  "Containers decided at creation, by what was done (allow, adjust, refuse) and why.");
  decisions_.render(out, "gpuguard_node_enforcer_decisions_total");
  metrics::header(out, "gpuguard_node_enforcer_create_duration_seconds", "histogram",
                  "Time to answer the runtime's CreateContainer, the kubelet's pod-resources call included.");
  durations_.render(out, "gpuguard_node_enforcer_create_duration_seconds", "");
  metrics::header(out, "gpuguard_node_enforcer_registered", "gauge",
                  "1 while the enforcer is registered with the container runtime over NRI.");
  out.append("gpuguard_node_enforcer_registered ").append(connection.registered ? "1" : "0").append("\n");
  metrics::header(out, "gpuguard_node_enforcer_nri_served", "gauge",
                  "0 once the runtime has served no NRI socket for --nri-unserved-after (NRI off): containers here are "
                  "not enforced.");
  out.append("gpuguard_node_enforcer_nri_served ").append(connection.nri_served ? "1" : "0").append("\n");
  metrics::header(out, "gpuguard_node_enforcer_connections_total", "counter",
                  "NRI connections registered with the runtime, and those that ended.");
  out.append("gpuguard_node_enforcer_connections_total{event=\"registered\"} ")
      .append(std::to_string(connection.connections))
      .append("\ngpuguard_node_enforcer_connections_total{event=\"ended\"} ")
      .append(std::to_string(connection.disconnections))
      .append("\n");
  metrics::header(out, "gpuguard_node_enforcer_validating", "gauge",
                  "1 while the runtime shows the enforcer every container's final adjustment, every plugin's merged "
                  "(NRI v0.10.0 and later), so that devices other plugins add are judged too.");
  out.append("gpuguard_node_enforcer_validating ").append(connection.validating ? "1" : "0").append("\n");
  metrics::header(out, "gpuguard_node_enforcer_validations_total", "counter",
                  "Final adjustments judged, accepted or rejected (the create then fails).");
  out.append("gpuguard_node_enforcer_validations_total{result=\"accepted\"} ")
      .append(std::to_string(validations_accepted_.load(std::memory_order_relaxed)))
      .append("\ngpuguard_node_enforcer_validations_total{result=\"rejected\"} ")
      .append(std::to_string(validations_rejected_.load(std::memory_order_relaxed)))
      .append("\n");
  metrics::header(out, "gpuguard_node_enforcer_gpus", "gauge", "The GPUs the driver lists on this node.");
  out.append("gpuguard_node_enforcer_gpus ")
      .append(std::to_string(node_gpus_.load(std::memory_order_relaxed)))
      .append("\n");
  metrics::header(
      out, "gpuguard_node_enforcer_gpus_known", "gauge",
      "1 when the driver's list of GPUs was read; 0 when it was not (no driver, nothing listed, unreadable): "
      "then containers that reach a GPU cannot be judged, and are refused under nodeEnforcementUnknown: "
      "refuse.");
  out.append("gpuguard_node_enforcer_gpus_known ")
      .append(gpus_known_.load(std::memory_order_relaxed) ? "1" : "0")
      .append("\n");
  metrics::header(out, "gpuguard_node_enforcer_oversized_answers_total", "counter",
                  "Answers over ttrpc's 4 MiB, sent as an error instead (the create fails); none is expected.");
  out.append("gpuguard_node_enforcer_oversized_answers_total ")
      .append(std::to_string(connection.oversized_answers))
      .append("\n");
  metrics::header(out, "gpuguard_node_enforcer_protocol_errors_total", "counter",
                  "NRI connections dropped for bytes that are not NRI's protocol.");
  out.append("gpuguard_node_enforcer_protocol_errors_total ")
      .append(std::to_string(connection.protocol_errors))
      .append("\n");
  metrics::header(out, "gpuguard_node_enforcer_kubelet_errors_total", "counter",
                  "Calls to the kubelet's pod-resources API that failed.");
  out.append("gpuguard_node_enforcer_kubelet_errors_total ")
      .append(std::to_string(kubelet_errors_.load(std::memory_order_relaxed)))
      .append("\n");
  metrics::header(out, "gpuguard_node_enforcer_break_glass", "gauge",
                  "1 while the break-glass ConfigMap exists: every container is created as it is, nothing "
                  "enforced or refused (docs/operations.md#break-glass).");
  out.append("gpuguard_node_enforcer_break_glass ")
      .append(break_glass_.load(std::memory_order_relaxed) ? "1" : "0")
      .append("\n");
  metrics::header(out, "gpuguard_node_enforcer_running_containers", "gauge",
                  "Running containers, as the last registration judged them: those that see GPUs beyond what the "
                  "kubelet allocated them (beyond), privileged ones, which nothing at creation confines (privileged), "
                  "and those that could not be judged (unjudged); running containers cannot be changed.");
  out.append("gpuguard_node_enforcer_running_containers{state=\"beyond\"} ")
      .append(std::to_string(running_beyond_.load(std::memory_order_relaxed)))
      .append("\ngpuguard_node_enforcer_running_containers{state=\"privileged\"} ")
      .append(std::to_string(running_privileged_.load(std::memory_order_relaxed)))
      .append("\ngpuguard_node_enforcer_running_containers{state=\"unjudged\"} ")
      .append(std::to_string(running_unjudged_.load(std::memory_order_relaxed)))
      .append("\n");
  render_reloads(out, false, false);
  metrics::render_build_info(out, version_);
  return out;
}

}  // namespace gpuguard::enforcer

// gpuguard-node-enforcer's /metrics page (include/gpuguard/enforcer/enforcer_metrics.hpp).
#include "gpuguard/enforcer/enforcer_metrics.hpp"

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::enforcer {
namespace {

using enforcement::Decision;

constexpr std::array<std::string_view, 3> kActions = {"allow", "adjust", "refuse"};
constexpr std::array<std::string_view, 8> kWhys = {"within", "enforced",     "audited",    "off",
                                                   "exempt", "cannot-judge", "privileged", "oversized"};

constexpr metrics::Family kMode{"gpuguard_node_enforcer_mode", "gauge",
                                "1, labelled with the policy's nodeEnforcement in force."};
constexpr metrics::Family kDecisions{
    "gpuguard_node_enforcer_decisions_total", "counter",
    "Containers decided at creation, by what was done (allow, adjust, refuse) and why."};
constexpr metrics::Family kCreateDuration{
    "gpuguard_node_enforcer_create_duration_seconds", "histogram",
    "Time to answer the runtime's CreateContainer, the kubelet's pod-resources call included."};
constexpr metrics::Family kUnlisted{
    "gpuguard_node_enforcer_unlisted_infrastructure_total", "counter",
    "Containers whose pod carries the label of a listed GPU infrastructure exemption in a namespace the entry does "
    "not name: enforced as any pod's; the log names each."};
constexpr metrics::Family kMasks{
    "gpuguard_node_enforcer_mps_masks_total", "counter",
    "MPS roots hidden under an empty read-only tmpfs in containers that mount a directory above them (the "
    "host's / or /run), instead of refusing them."};
constexpr metrics::Family kMaskChecks{
    "gpuguard_node_enforcer_mask_checks_total", "counter",
    "Containers with masks checked at their start against where their mounts show each MPS root: masked, "
    "unmasked (the start refused), or unknown (their mounts could not be read)."};
constexpr metrics::Family kRegistered{
    "gpuguard_node_enforcer_registered", "gauge",
    "1 while the enforcer is registered with the container runtime over NRI and synchronized by it."};
constexpr metrics::Family kNriServed{
    "gpuguard_node_enforcer_nri_served", "gauge",
    "0 once the runtime has served no NRI socket for --nri-unserved-after (NRI off): containers here are "
    "not enforced."};
constexpr metrics::Family kConnections{"gpuguard_node_enforcer_connections_total", "counter",
                                       "NRI connections registered with the runtime, and those that ended."};
constexpr metrics::Family kValidating{
    "gpuguard_node_enforcer_validating", "gauge",
    "1 while the runtime shows the enforcer every container's final adjustment, every plugin's merged "
    "(NRI v0.10.0 and later), so that devices other plugins add are judged too."};
constexpr metrics::Family kValidations{"gpuguard_node_enforcer_validations_total", "counter",
                                       "Final adjustments judged, accepted or rejected (the create then fails)."};
constexpr metrics::Family kGpus{"gpuguard_node_enforcer_gpus", "gauge", "The GPUs the driver lists on this node."};
constexpr metrics::Family kGpusKnown{
    "gpuguard_node_enforcer_gpus_known", "gauge",
    "1 when the driver's list of GPUs was read; 0 when it was not (no driver, nothing listed, unreadable): "
    "then containers that reach a GPU cannot be judged, and are refused under nodeEnforcementUnknown: "
    "refuse."};
constexpr metrics::Family kOversizedAnswers{
    "gpuguard_node_enforcer_oversized_answers_total", "counter",
    "Answers over ttrpc's 4 MiB, sent as an error instead (the create fails); none is expected."};
constexpr metrics::Family kProtocolErrors{"gpuguard_node_enforcer_protocol_errors_total", "counter",
                                          "NRI connections dropped for bytes that are not NRI's protocol."};
constexpr metrics::Family kKubeletErrors{"gpuguard_node_enforcer_kubelet_errors_total", "counter",
                                         "Calls to the kubelet's pod-resources API that failed."};
constexpr metrics::Family kBreakGlass{
    "gpuguard_node_enforcer_break_glass", "gauge",
    "1 while the break-glass ConfigMap exists: every container is created as it is, nothing "
    "enforced or refused (docs/operations.md#break-glass)."};
constexpr metrics::Family kRunningContainers{
    "gpuguard_node_enforcer_running_containers", "gauge",
    "Running containers, as the last registration judged them: those that see GPUs beyond what the "
    "kubelet allocated them (beyond), privileged ones, which nothing at creation confines (privileged), "
    "and those that could not be judged (unjudged); running containers cannot be changed."};

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
  metrics::header(out, kMode);
  metrics::sample(out, kMode, metrics::labels({{"mode", mode}}), "1");
  metrics::header(out, kDecisions);
  decisions_.render(out, kDecisions);
  metrics::header(out, kCreateDuration);
  durations_.render(out, kCreateDuration, "");
  metrics::single(out, kMasks, masks_.load(std::memory_order_relaxed));
  metrics::single(out, kUnlisted, unlisted_infrastructure_.load(std::memory_order_relaxed));
  metrics::header(out, kMaskChecks);
  metrics::sample(out, kMaskChecks, "result=\"masked\"", checks_masked_.load(std::memory_order_relaxed));
  metrics::sample(out, kMaskChecks, "result=\"unmasked\"", checks_unmasked_.load(std::memory_order_relaxed));
  metrics::sample(out, kMaskChecks, "result=\"unknown\"", checks_unknown_.load(std::memory_order_relaxed));
  metrics::single(out, kRegistered, connection.registered ? "1" : "0");
  metrics::single(out, kNriServed, connection.nri_served ? "1" : "0");
  metrics::header(out, kConnections);
  metrics::sample(out, kConnections, "event=\"registered\"", connection.connections);
  metrics::sample(out, kConnections, "event=\"ended\"", connection.disconnections);
  metrics::single(out, kValidating, connection.validating ? "1" : "0");
  metrics::header(out, kValidations);
  metrics::sample(out, kValidations, "result=\"accepted\"", validations_accepted_.load(std::memory_order_relaxed));
  metrics::sample(out, kValidations, "result=\"rejected\"", validations_rejected_.load(std::memory_order_relaxed));
  metrics::single(out, kGpus, node_gpus_.load(std::memory_order_relaxed));
  metrics::single(out, kGpusKnown, gpus_known_.load(std::memory_order_relaxed) ? "1" : "0");
  metrics::single(out, kOversizedAnswers, connection.oversized_answers);
  metrics::single(out, kProtocolErrors, connection.protocol_errors);
  metrics::single(out, kKubeletErrors, kubelet_errors_.load(std::memory_order_relaxed));
  metrics::single(out, kBreakGlass, break_glass_.load(std::memory_order_relaxed) ? "1" : "0");
  metrics::header(out, kRunningContainers);
  metrics::sample(out, kRunningContainers, "state=\"beyond\"", running_beyond_.load(std::memory_order_relaxed));
  metrics::sample(out, kRunningContainers, "state=\"privileged\"", running_privileged_.load(std::memory_order_relaxed));
  metrics::sample(out, kRunningContainers, "state=\"unjudged\"", running_unjudged_.load(std::memory_order_relaxed));
  render_reloads(out, false, false);
  metrics::render_build_info(out, version_);
  return out;
}

}  // namespace gpuguard::enforcer

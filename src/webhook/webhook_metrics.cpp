#include "gpuguard/webhook/webhook_metrics.hpp"

#include "gpuguard/admission/review.hpp"
#include "gpuguard/metrics/text.hpp"

namespace gpuguard::webhook {
namespace {

constexpr std::array<std::string_view, 5> kOperations = {"CREATE", "UPDATE", "DELETE", "CONNECT", "unknown"};
constexpr std::array<std::string_view, 4> kResults = {"allowed", "patched", "denied", "invalid"};

std::size_t operation_index(std::string_view operation) {
  for (std::size_t i = 0; i + 1 < kOperations.size(); ++i) {
    if (operation == kOperations[i]) return i;
  }
  return kOperations.size() - 1;
}

}  // namespace

WebhookMetrics::WebhookMetrics(std::string version)
    : version_(std::move(version)),
      requests_("operation", kOperations, "result", kResults),
      doors_("door", admission::kDoors, "action", admission::kActions) {}

void WebhookMetrics::count_admission(std::string_view operation, AdmissionResult result, double seconds) {
  requests_.add(operation_index(operation), static_cast<std::size_t>(result));
  durations_.observe(seconds);
}

void WebhookMetrics::count_mutations(const std::array<std::size_t, 4>& by_reason) {
  for (std::size_t i = 0; i < by_reason.size(); ++i) {
    if (by_reason[i] != 0) mutations_[i].fetch_add(by_reason[i], std::memory_order_relaxed);
  }
}

void WebhookMetrics::count_doors(const admission::DoorCounts& doors) {
  for (std::size_t door = 0; door < doors.size(); ++door) {
    for (std::size_t action = 0; action < doors[door].size(); ++action) {
      if (doors[door][action] != 0) doors_.add(door, action, doors[door][action]);
    }
  }
}

std::string WebhookMetrics::render(std::optional<bool> claims_synced) const {
  std::string out;
  metrics::header(out, "gpuguard_admission_requests_total", "counter",
                  "Admission reviews answered, by operation and result.");
  requests_.render(out, "gpuguard_admission_requests_total");
  metrics::header(out, "gpuguard_admission_duration_seconds", "histogram",
                  "Time to decode, decide and encode one review.");
  durations_.render(out, "gpuguard_admission_duration_seconds", "");
  metrics::header(out, "gpuguard_containers_mutated_total", "counter", "Containers patched, by reason.");
  for (std::size_t i = 0; i < mutations_.size(); ++i) {
    out.append("gpuguard_containers_mutated_total{reason=\"")
        .append(admission::kMutationReasons[i])
        .append("\"} ")
        .append(std::to_string(mutations_[i].load(std::memory_order_relaxed)))
        .append("\n");
  }
  metrics::header(
      out, "gpuguard_doors_total", "counter",
      "Containers found at a door to devices that NVIDIA_VISIBLE_DEVICES does not close, by the policy's action.");
  doors_.render(out, "gpuguard_doors_total");
  if (claims_synced) {
    metrics::header(out, "gpuguard_resource_claims_synced", "gauge",
                    "1 once ResourceClaims and ResourceClaimTemplates have been listed.");
    out.append("gpuguard_resource_claims_synced ").append(*claims_synced ? "1" : "0").append("\n");
  }
  server_.render(out);
  render_reloads(out, true);
  metrics::render_build_info(out, version_);
  return out;
}

}  // namespace gpuguard::webhook

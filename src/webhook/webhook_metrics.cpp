#include "gpuguard/webhook/webhook_metrics.hpp"

#include "gpuguard/admission/review.hpp"
#include "gpuguard/metrics/text.hpp"

namespace gpuguard::webhook {
namespace {

constexpr std::array<std::string_view, 5> kOperations = {"CREATE", "UPDATE", "DELETE", "CONNECT", "unknown"};
constexpr std::array<std::string_view, 4> kResults = {"allowed", "patched", "denied", "invalid"};

constexpr metrics::Family kRequests{"gpuguard_admission_requests_total", "counter",
                                    "Admission reviews answered, by operation and result."};
constexpr metrics::Family kDuration{"gpuguard_admission_duration_seconds", "histogram",
                                    "Time to decode, decide and encode one review."};
constexpr metrics::Family kMutated{"gpuguard_containers_mutated_total", "counter", "Containers patched, by reason."};
constexpr metrics::Family kDoors{
    "gpuguard_doors_total", "counter",
    "Containers found at a door to devices that NVIDIA_VISIBLE_DEVICES does not close, by the policy's action."};
constexpr metrics::Family kClaimsSynced{"gpuguard_resource_claims_synced", "gauge",
                                        "1 once ResourceClaims and ResourceClaimTemplates have been listed."};

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
  metrics::header(out, kRequests);
  requests_.render(out, kRequests);
  metrics::header(out, kDuration);
  durations_.render(out, kDuration, "");
  metrics::header(out, kMutated);
  for (std::size_t i = 0; i < mutations_.size(); ++i) {
    metrics::sample(out, kMutated, metrics::labels({{"reason", admission::kMutationReasons[i]}}),
                    mutations_[i].load(std::memory_order_relaxed));
  }
  metrics::header(out, kDoors);
  doors_.render(out, kDoors);
  if (claims_synced) metrics::single(out, kClaimsSynced, *claims_synced ? "1" : "0");
  server_.render(out);
  render_reloads(out, true);
  metrics::render_build_info(out, version_);
  return out;
}

}  // namespace gpuguard::webhook

#pragma once
// The webhook's series for GET /metrics. Label values come from fixed sets, never from request content,
// so a client cannot grow the series; counting a request is a few relaxed atomic increments.
#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gpuguard/admission/review.hpp"
#include "gpuguard/metrics/counters.hpp"
#include "gpuguard/metrics/reloads.hpp"
#include "gpuguard/server/http.hpp"

namespace gpuguard::webhook {

enum class AdmissionResult { allowed, patched, denied, invalid };  // allowed: untouched; invalid: HTTP 400

class WebhookMetrics final : public metrics::ReloadMetrics {
 public:
  explicit WebhookMetrics(std::string version);

  // `operation` as the review gives it; anything but CREATE, UPDATE, DELETE and CONNECT counts as unknown.
  void count_admission(std::string_view operation, AdmissionResult result, double seconds);
  // Containers changed, by reason (admission::kMutationReasons).
  void count_mutations(const std::array<std::size_t, 4>& by_reason);
  // Containers at each door (admission::kDoors) by action (admission::kActions).
  void count_doors(const admission::DoorCounts& doors);
  // `claims_synced`: whether the DRA claims' cache has listed both kinds; absent when claims are not watched.
  std::string render(std::optional<bool> claims_synced = std::nullopt) const;
  // For ServerOptions::counters: the answers by HTTP status and the shed connections, rendered here too.
  server::ServerCounters& server_counters() { return server_; }

 private:
  std::string version_;
  metrics::LabelledCounters<5, 4> requests_;
  metrics::DurationHistogram durations_;
  std::array<std::atomic<std::uint64_t>, 4> mutations_{};
  metrics::LabelledCounters<admission::kDoors.size(), admission::kActions.size()> doors_;
  server::ServerCounters server_;
};

}  // namespace gpuguard::webhook

#pragma once
// gpuguard-node-enforcer's series for /metrics: every decision by action and why, how long answering
// CreateContainer took, the MPS roots masked, the validations of every plugin's adjustment, the NRI connection, the
// node's GPUs as the driver lists them, and the running containers that see GPUs beyond their allocation. Label values
// come from fixed sets.
#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "gpuguard/enforcement/decision.hpp"
#include "gpuguard/metrics/counters.hpp"
#include "gpuguard/metrics/reloads.hpp"
#include "gpuguard/nri/plugin.hpp"

namespace gpuguard::enforcer {

class EnforcerMetrics final : public metrics::ReloadMetrics {
 public:
  explicit EnforcerMetrics(std::string version);
  void count_decision(const enforcement::Decision& decision, double seconds);
  void count_kubelet_error() { kubelet_errors_.fetch_add(1, std::memory_order_relaxed); }
  // A container judged as any pod's whose labels are those of listed GPU infrastructure, in a namespace
  // its entry does not name (Policy::unlisted_infrastructure).
  void count_unlisted_infrastructure() { unlisted_infrastructure_.fetch_add(1, std::memory_order_relaxed); }
  // MPS roots masked in containers created (Decision::masks).
  void count_masks(std::size_t masks) { masks_.fetch_add(masks, std::memory_order_relaxed); }
  // A started container's masks checked: "masked", "unmasked" (the start refused) or "unknown".
  void count_mask_check(std::string_view result) {
    (result == "masked"     ? checks_masked_
     : result == "unmasked" ? checks_unmasked_
                            : checks_unknown_)
        .fetch_add(1, std::memory_order_relaxed);
  }
  void count_validation(bool rejected) {
    (rejected ? validations_rejected_ : validations_accepted_).fetch_add(1, std::memory_order_relaxed);
  }
  // The GPUs the driver lists, and whether that list could be read at all.
  void set_node(std::size_t gpus, bool known) {
    node_gpus_.store(gpus, std::memory_order_relaxed);
    gpus_known_.store(known, std::memory_order_relaxed);
  }
  // Whether the break glass (break_glass.hpp) lets every container be created as it is.
  void set_break_glass(bool engaged) { break_glass_.store(engaged, std::memory_order_relaxed); }
  void set_running(std::size_t beyond, std::size_t privileged, std::size_t unjudged) {
    running_beyond_.store(beyond, std::memory_order_relaxed);
    running_privileged_.store(privileged, std::memory_order_relaxed);
    running_unjudged_.store(unjudged, std::memory_order_relaxed);
  }
  // `mode`: the nodeEnforcement mode in force.
  std::string render(const nri::PluginStats& connection, std::string_view mode) const;

 private:
  std::string version_;
  metrics::LabelledCounters<3, 8> decisions_;
  metrics::DurationHistogram durations_;
  std::atomic<std::uint64_t> kubelet_errors_{0};
  std::atomic<std::uint64_t> masks_{0};
  std::atomic<std::uint64_t> unlisted_infrastructure_{0};
  std::atomic<std::uint64_t> checks_masked_{0}, checks_unmasked_{0}, checks_unknown_{0};
  std::atomic<std::uint64_t> validations_accepted_{0}, validations_rejected_{0};
  std::atomic<std::size_t> node_gpus_{0};
  std::atomic<bool> gpus_known_{false};
  std::atomic<bool> break_glass_{false};
  std::atomic<std::size_t> running_beyond_{0}, running_privileged_{0}, running_unjudged_{0};
};

}  // namespace gpuguard::enforcer

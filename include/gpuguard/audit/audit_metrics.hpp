#pragma once
// The audit loop's series. The exposure and node series come from the leader alone, so that summing them
// over the replicas never counts a pod twice; every replica says whether it leads. Labels are namespaces,
// the fixed reasons (audit::reasons), results and verdicts: never a pod's name.
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "gpuguard/kube/reflector.hpp"
#include "gpuguard/metrics/reloads.hpp"

namespace gpuguard::audit {

// What one pass found: pods by (namespace, reason, result), nodes by GPUIsolation verdict.
struct PassSummary {
  std::map<std::tuple<std::string, std::string, std::string>, std::size_t> exposed_pods;
  std::map<std::string, std::size_t> nodes;  // honoured, not-acted-on, leaks, breaks-pods, unknown, unreported
  std::size_t pods = 0;
  std::size_t reports = 0;  // namespaces with a report
};

// The verdict label of a node's GPUIsolation condition reason ("BreaksPods" -> "breaks-pods"); "unreported"
// for a node without the condition.
std::string_view verdict_label(std::optional<std::string_view> condition_reason);

enum class ReportWrite { apply, remove };

class AuditMetrics final : public metrics::ReloadMetrics {
 public:
  explicit AuditMetrics(std::string version);

  void set_leader(bool leading);
  void set_reports_available(bool available);
  void count_write(ReportWrite write, bool succeeded);
  void count_unreadable_pod();
  void count_informer(std::string_view resource, kube::ReflectorOutcome outcome);
  // A round of the Lease run to its end (read, and written where due), leading or not.
  void count_lease_round();
  // A pass that ended at `at` and took `took`.
  void set_pass(PassSummary summary, std::chrono::steady_clock::time_point at, std::chrono::nanoseconds took);

  std::string render(bool synced) const;

 private:
  const std::string version_;
  mutable std::mutex mutex_;
  bool leading_ = false;
  bool reports_available_ = false;
  std::array<std::array<std::uint64_t, 2>, 2> writes_{};  // [apply, remove][ok, error]
  std::uint64_t unreadable_pods_ = 0;
  std::uint64_t lease_rounds_ = 0;
  std::array<std::array<std::uint64_t, 5>, 3> informer_{};  // [pods, nodes, claims][outcome]
  std::optional<PassSummary> pass_;
  std::chrono::steady_clock::time_point pass_at_{};
  std::chrono::nanoseconds pass_took_{};
};

}  // namespace gpuguard::audit

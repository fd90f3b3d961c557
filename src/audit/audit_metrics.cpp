// The audit loop's series in the Prometheus text format.
#include "gpuguard/audit/audit_metrics.hpp"

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::audit {
namespace {

constexpr std::array<std::string_view, 3> kResources = {"pods", "nodes", "claims"};
constexpr std::array<std::string_view, 2> kWrites = {"apply", "delete"};

constexpr metrics::Family kLeader{"gpuguard_audit_leader", "gauge",
                                  "1 on the replica that holds the audit Lease and writes the PolicyReports."};
constexpr metrics::Family kLeaseRounds{
    "gpuguard_audit_lease_rounds_total", "counter",
    "Rounds of the audit Lease this replica ran (read, and renewed or taken where due), each retry "
    "period, whether or not the API answered: that it goes up shows the replica's loop runs."};
constexpr metrics::Family kSynced{"gpuguard_audit_synced", "gauge", "1 once pods and nodes have been listed."};
constexpr metrics::Family kReportsAvailable{
    "gpuguard_audit_policy_reports_available", "gauge",
    "1 when the leader can write PolicyReports (the wgpolicyk8s.io/v1alpha2 API is served)."};
constexpr metrics::Family kReportWrites{"gpuguard_audit_report_writes_total", "counter",
                                        "PolicyReports applied or deleted by this replica, by result."};
constexpr metrics::Family kUnreadablePods{"gpuguard_audit_unreadable_pods_total", "counter",
                                          "Pods the admission core could not read (left out of the reports, logged)."};
constexpr metrics::Family kLastPassDuration{"gpuguard_audit_last_pass_duration_seconds", "gauge",
                                            "How long this replica's last pass over every running pod took."};
constexpr metrics::Family kExposedPods{
    "gpuguard_audit_exposed_pods", "gauge",
    "Running pods with a container that can see GPUs it did not ask for, by namespace, reason and "
    "PolicyReport result (fail, warn under policy mode audit, skip when exempt)."};
constexpr metrics::Family kNodes{
    "gpuguard_audit_nodes", "gauge",
    "Nodes by the verdict of their GPUIsolation condition (unreported: a GPU node no gpuguard plugin "
    "judges; no-gpu: a node without GPUs or the condition)."};
constexpr metrics::Family kPods{"gpuguard_audit_pods", "gauge", "Running pods judged in the last pass."};
constexpr metrics::Family kLastPassAge{"gpuguard_audit_last_pass_age_seconds", "gauge",
                                       "Seconds since the last full pass over every running pod ended."};

}  // namespace

std::string_view verdict_label(std::optional<std::string_view> reason) {
  if (!reason) return "unreported";
  if (*reason == "Honoured") return "honoured";
  if (*reason == "NotActedOn") return "not-acted-on";
  if (*reason == "Leaks") return "leaks";
  if (*reason == "BreaksPods") return "breaks-pods";
  if (*reason == "CannotJudge") return "cannot-judge";
  return "unknown";
}

AuditMetrics::AuditMetrics(std::string version) : version_(std::move(version)) {}

void AuditMetrics::set_leader(bool leading) {
  const std::lock_guard lock(mutex_);
  leading_ = leading;
}

void AuditMetrics::set_reports_available(bool available) {
  const std::lock_guard lock(mutex_);
  reports_available_ = available;
}

void AuditMetrics::count_write(ReportWrite write, bool succeeded) {
  const std::lock_guard lock(mutex_);
  ++writes_[static_cast<std::size_t>(write)][succeeded ? 0 : 1];
}

void AuditMetrics::count_unreadable_pod() {
  const std::lock_guard lock(mutex_);
  ++unreadable_pods_;
}

void AuditMetrics::count_lease_round() {
  const std::lock_guard lock(mutex_);
  ++lease_rounds_;
}

void AuditMetrics::count_informer(std::string_view resource, kube::ReflectorOutcome outcome) {
  const std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < kResources.size(); ++i) {
    if (resource == kResources[i] || (i == 2 && resource.find("claim") != std::string_view::npos)) {
      ++informer_[i][static_cast<std::size_t>(outcome)];
      return;
    }
  }
}

void AuditMetrics::set_pass(PassSummary summary, std::chrono::steady_clock::time_point at,
                            std::chrono::nanoseconds took) {
  const std::lock_guard lock(mutex_);
  pass_ = std::move(summary);
  pass_at_ = at;
  pass_took_ = took;
}

std::string AuditMetrics::render(bool synced) const {
  const std::lock_guard lock(mutex_);
  std::string out;
  metrics::single(out, kLeader, leading_ ? "1" : "0");
  metrics::single(out, kLeaseRounds, lease_rounds_);
  metrics::single(out, kSynced, synced ? "1" : "0");
  metrics::single(out, kReportsAvailable, reports_available_ ? "1" : "0");
  metrics::header(out, kReportWrites);
  for (std::size_t w = 0; w < kWrites.size(); ++w) {
    for (std::size_t r = 0; r < 2; ++r) {
      metrics::sample(out, kReportWrites,
                      metrics::labels({{"operation", kWrites[w]}, {"result", r == 0 ? "success" : "failure"}}),
                      writes_[w][r]);
    }
  }
  metrics::single(out, kUnreadablePods, unreadable_pods_);
  metrics::header(out, metrics::kInformerOutcomes);
  for (std::size_t i = 0; i < kResources.size(); ++i) {
    for (std::size_t o = 0; o < informer_[i].size(); ++o) {
      metrics::sample(out, metrics::kInformerOutcomes,
                      metrics::labels({{"resource", kResources[i]}, {"outcome", kube::kReflectorOutcomes[o]}}),
                      informer_[i][o]);
    }
  }
  if (pass_) {
    metrics::single(out, kLastPassDuration, metrics::number(std::chrono::duration<double>(pass_took_).count()));
  }
  // The leader's view of the cluster: followers leave these out, so a sum over replicas is the cluster's.
  if (leading_ && pass_) {
    metrics::header(out, kExposedPods);
    for (const auto& [key, count] : pass_->exposed_pods) {
      const auto& [ns, reason, result] = key;
      metrics::sample(out, kExposedPods, metrics::labels({{"namespace", ns}, {"reason", reason}, {"result", result}}),
                      count);
    }
    metrics::header(out, kNodes);
    for (const auto& [verdict, count] : pass_->nodes) {
      metrics::sample(out, kNodes, metrics::labels({{"verdict", verdict}}), count);
    }
    metrics::single(out, kPods, pass_->pods);
    metrics::single(
        out, kLastPassAge,
        metrics::number(std::chrono::duration<double>(std::chrono::steady_clock::now() - pass_at_).count()));
  }
  render_reloads(out, false);
  metrics::render_build_info(out, version_);
  return out;
}

}  // namespace gpuguard::audit

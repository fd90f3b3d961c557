#include "gpuguard/metrics/reloads.hpp"

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::metrics {
namespace {

constexpr Family kPolicyReloads{"gpuguard_policy_reloads_total", "counter",
                                "Policy loads from --policy-dir, by result."};
constexpr Family kPolicyInfo{"gpuguard_policy_info", "gauge", "The policy mode in force."};
constexpr Family kCertificateExpiry{"gpuguard_tls_certificate_expiry_timestamp_seconds", "gauge",
                                    "notAfter of the serving certificate."};
constexpr Family kCertificateReloads{"gpuguard_tls_certificate_reloads_total", "counter",
                                     "Serving certificate loads, by result."};

}  // namespace

void ReloadMetrics::count_policy_reload(bool success) {
  std::lock_guard lock(mutex_);
  ++policy_reloads_[success ? 0 : 1];
}

void ReloadMetrics::set_policy_mode(std::string_view mode) {
  std::lock_guard lock(mutex_);
  policy_mode_ = mode;
}

void ReloadMetrics::count_certificate_reload(bool success) {
  std::lock_guard lock(mutex_);
  ++certificate_reloads_[success ? 0 : 1];
}

void ReloadMetrics::set_certificate_expiry(double unix_seconds) {
  std::lock_guard lock(mutex_);
  certificate_expiry_ = unix_seconds;
}

void ReloadMetrics::render_reloads(std::string& out, bool with_certificate, bool with_policy_mode) const {
  std::lock_guard lock(mutex_);
  two_results(out, kPolicyReloads, policy_reloads_);
  if (with_policy_mode) {
    header(out, kPolicyInfo);
    sample(out, kPolicyInfo, labels({{"mode", policy_mode_}}), "1");
  }
  if (!with_certificate) return;
  single(out, kCertificateExpiry, number(certificate_expiry_));
  two_results(out, kCertificateReloads, certificate_reloads_);
}

}  // namespace gpuguard::metrics

#include "gpuguard/metrics/registry.hpp"

#include <cstdio>

#include "gpuguard/admission/review.hpp"

namespace gpuguard::metrics {
namespace {

std::string_view known_operation(std::string_view operation) {
  for (std::string_view known : {"CREATE", "UPDATE", "DELETE", "CONNECT"}) {
    if (operation == known) return known;
  }
  return "unknown";
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void two_results(std::string& out, std::string_view name, const std::array<std::uint64_t, 2>& counts) {
  out.append(name).append("{result=\"success\"} ").append(std::to_string(counts[0])).append("\n");
  out.append(name).append("{result=\"failure\"} ").append(std::to_string(counts[1])).append("\n");
}

}  // namespace

Registry::Registry(std::string version) : version_(std::move(version)) {}

void Registry::count_admission(std::string_view operation, std::string_view result, double seconds) {
  std::lock_guard lock(mutex_);
  ++requests_[{std::string(known_operation(operation)), std::string(result)}];
  for (std::size_t i = 0; i < kDurationBuckets.size(); ++i) {
    if (seconds <= kDurationBuckets[i]) ++duration_buckets_[i];
  }
  ++duration_count_;
  duration_sum_ += seconds;
}

void Registry::count_mutations(const std::array<std::size_t, 4>& by_reason) {
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < by_reason.size(); ++i) mutations_[i] += by_reason[i];
}

void Registry::count_policy_reload(bool success) {
  std::lock_guard lock(mutex_);
  ++policy_reloads_[success ? 0 : 1];
}

void Registry::set_policy_mode(std::string_view mode) {
  std::lock_guard lock(mutex_);
  policy_mode_ = mode;
}

void Registry::count_certificate_reload(bool success) {
  std::lock_guard lock(mutex_);
  ++certificate_reloads_[success ? 0 : 1];
}

void Registry::set_certificate_expiry(double unix_seconds) {
  std::lock_guard lock(mutex_);
  certificate_expiry_ = unix_seconds;
}

std::string Registry::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  header(out, "gpuguard_admission_requests_total", "counter", "Admission reviews answered, by operation and result.");
  for (const auto& [labels, count] : requests_) {
    out.append("gpuguard_admission_requests_total{operation=\"").append(labels.first).append("\",result=\"")
        .append(labels.second).append("\"} ").append(std::to_string(count)).append("\n");
  }
  header(out, "gpuguard_admission_duration_seconds", "histogram", "Time to decode, decide and encode one review.");
  for (std::size_t i = 0; i < kDurationBuckets.size(); ++i) {
    out.append("gpuguard_admission_duration_seconds_bucket{le=\"").append(number(kDurationBuckets[i])).append("\"} ")
        .append(std::to_string(duration_buckets_[i])).append("\n");
  }
  out.append("gpuguard_admission_duration_seconds_bucket{le=\"+Inf\"} ").append(std::to_string(duration_count_)).append("\n");
  out.append("gpuguard_admission_duration_seconds_sum ").append(number(duration_sum_)).append("\n");
  out.append("gpuguard_admission_duration_seconds_count ").append(std::to_string(duration_count_)).append("\n");
  header(out, "gpuguard_containers_mutated_total", "counter", "Containers patched, by reason.");
  for (std::size_t i = 0; i < mutations_.size(); ++i) {
    out.append("gpuguard_containers_mutated_total{reason=\"").append(admission::kMutationReasons[i]).append("\"} ")
        .append(std::to_string(mutations_[i])).append("\n");
  }
  header(out, "gpuguard_policy_reloads_total", "counter", "Policy loads from --policy-dir, by result.");
  two_results(out, "gpuguard_policy_reloads_total", policy_reloads_);
  header(out, "gpuguard_policy_info", "gauge", "The policy mode in force.");
  out.append("gpuguard_policy_info{mode=\"").append(policy_mode_).append("\"} 1\n");
  header(out, "gpuguard_tls_certificate_expiry_timestamp_seconds", "gauge", "notAfter of the serving certificate.");
  out.append("gpuguard_tls_certificate_expiry_timestamp_seconds ").append(number(certificate_expiry_)).append("\n");
  header(out, "gpuguard_tls_certificate_reloads_total", "counter", "Serving certificate loads, by result.");
  two_results(out, "gpuguard_tls_certificate_reloads_total", certificate_reloads_);
  header(out, "gpuguard_build_info", "gauge", "The running version.");
  out.append("gpuguard_build_info{version=\"").append(version_).append("\"} 1\n");
  return out;
}

}  // namespace gpuguard::metrics

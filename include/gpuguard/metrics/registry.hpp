#pragma once
// The few series gpuguard exports, rendered in the Prometheus text format for GET /metrics.
// Label values come from fixed sets, never from request content, so a client cannot grow the series.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace gpuguard::metrics {

class Registry {
 public:
  explicit Registry(std::string version);

  // result: allowed (untouched), patched, denied or invalid (HTTP 400).
  void count_admission(std::string_view operation, std::string_view result, double seconds);
  void count_mutations(const std::array<std::size_t, 4>& by_reason);
  void count_policy_reload(bool success);
  void set_policy_mode(std::string_view mode);
  void count_certificate_reload(bool success);
  void set_certificate_expiry(double unix_seconds);

  std::string render() const;

  // Upper bounds of the duration histogram, 50 µs to 1 s.
  static constexpr std::array<double, 14> kDurationBuckets = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                              0.01,    0.025,  0.05,    0.1,    0.25,  0.5,   1.0};

 private:
  const std::string version_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, std::uint64_t> requests_;
  std::array<std::uint64_t, kDurationBuckets.size()> duration_buckets_{};
  std::uint64_t duration_count_ = 0;
  double duration_sum_ = 0;
  std::array<std::uint64_t, 4> mutations_{};
  std::array<std::uint64_t, 2> policy_reloads_{};  // success, failure
  std::array<std::uint64_t, 2> certificate_reloads_{};
  std::string policy_mode_ = "enforce";
  double certificate_expiry_ = 0;
};

}  // namespace gpuguard::metrics

#pragma once
// The series about files a binary re-reads on change (the policy ConfigMap, the serving certificate),
// which every gpuguard server exports the same way.
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace gpuguard::metrics {

class ReloadMetrics {
 public:
  virtual ~ReloadMetrics() = default;

  void count_policy_reload(bool success);
  void set_policy_mode(std::string_view mode);
  void count_certificate_reload(bool success);
  void set_certificate_expiry(double unix_seconds);

 protected:
  // Appends the series in the Prometheus text format. `with_certificate` is false for a server without TLS.
  // `with_policy_mode`: gpuguard_policy_info, for a program that reads the policy's mode.
  void render_reloads(std::string& out, bool with_certificate, bool with_policy_mode = true) const;

 private:
  mutable std::mutex mutex_;
  std::array<std::uint64_t, 2> policy_reloads_{};  // success, failure
  std::array<std::uint64_t, 2> certificate_reloads_{};
  std::string policy_mode_ = "enforce";
  double certificate_expiry_ = 0;
};

}  // namespace gpuguard::metrics

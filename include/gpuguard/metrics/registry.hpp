#pragma once
// The webhook's series, rendered in the Prometheus text format for GET /metrics.
// Label values come from fixed sets, never from request content, so a client cannot grow the series.
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "gpuguard/metrics/reloads.hpp"

namespace gpuguard::metrics {

class DurationHistogram;

class Registry : public ReloadMetrics {
 public:
  explicit Registry(std::string version);
  ~Registry() override;

  // result: allowed (untouched), patched, denied or invalid (HTTP 400).
  void count_admission(std::string_view operation, std::string_view result, double seconds);
  void count_mutations(const std::array<std::size_t, 4>& by_reason);

  std::string render() const;

 private:
  const std::string version_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, std::uint64_t> requests_;
  std::unique_ptr<DurationHistogram> durations_;
  std::array<std::uint64_t, 4> mutations_{};
};

// gpuguard_build_info, which every binary exports.
void render_build_info(std::string& out, std::string_view version);

}  // namespace gpuguard::metrics

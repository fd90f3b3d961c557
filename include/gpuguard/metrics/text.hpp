#pragma once
// Writing the Prometheus text exposition format, shared by every registry.
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

namespace gpuguard::metrics {

std::string number(double value);
void header(std::string& out, std::string_view name, std::string_view type, std::string_view help);
void two_results(std::string& out, std::string_view name, const std::array<std::uint64_t, 2>& counts);
// One line per entry: name{first="<key.first>",second="<key.second>"} count.
void labelled_counter(std::string& out, std::string_view name, std::string_view first, std::string_view second,
                      const std::map<std::pair<std::string, std::string>, std::uint64_t>& counts);

// Request durations, 50 µs to 1 s. Not thread-safe: the owning registry holds its lock.
class DurationHistogram {
 public:
  static constexpr std::array<double, 14> kBuckets = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,    0.025,  0.05,    0.1,    0.25,  0.5,   1.0};
  void observe(double seconds);
  // `labels` is empty or `name="value",` pairs ending in a comma, put before `le`.
  void render(std::string& out, std::string_view name, std::string_view labels) const;

 private:
  std::array<std::uint64_t, kBuckets.size()> buckets_{};
  std::uint64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace gpuguard::metrics

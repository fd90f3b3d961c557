#pragma once
// Counters and histograms that a request path updates without a lock: relaxed atomics indexed by label
// values from fixed sets (never request content, so a client cannot grow the series), rendered in the
// Prometheus text format with every combination present from the start.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::metrics {

// A counter with two labels; `Rows` values of the first, `Columns` of the second.
template <std::size_t Rows, std::size_t Columns>
class LabelledCounters {
 public:
  LabelledCounters(std::string_view first, std::array<std::string_view, Rows> rows, std::string_view second,
                   std::array<std::string_view, Columns> columns)
      : first_(first), second_(second), rows_(rows), columns_(columns) {}

  void add(std::size_t row, std::size_t column, std::uint64_t n = 1) {
    counts_[row][column].fetch_add(n, std::memory_order_relaxed);
  }
  std::uint64_t value(std::size_t row, std::size_t column) const {
    return counts_[row][column].load(std::memory_order_relaxed);
  }
  // The family's samples {first="<row>",second="<column>"} count, one line per combination (no header).
  void render(std::string& out, const Family& family) const {
    for (std::size_t r = 0; r < Rows; ++r) {
      for (std::size_t c = 0; c < Columns; ++c) {
        sample(out, family, labels({{first_, rows_[r]}, {second_, columns_[c]}}), value(r, c));
      }
    }
  }

 private:
  std::string_view first_, second_;
  std::array<std::string_view, Rows> rows_;
  std::array<std::string_view, Columns> columns_;
  std::array<std::array<std::atomic<std::uint64_t>, Columns>, Rows> counts_{};
};

// Request durations, 50 µs to 1 s.
class DurationHistogram {
 public:
  static constexpr std::array<double, 14> kBuckets = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,    0.025,  0.05,    0.1,    0.25,  0.5,    1.0};
  void observe(double seconds);
  // The family's _bucket, _sum and _count samples (no header). `labels` is empty or `name="value",` pairs
  // ending in a comma, put before `le`.
  void render(std::string& out, const Family& family, std::string_view labels) const;

 private:
  std::array<std::atomic<std::uint64_t>, kBuckets.size()> buckets_{};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

}  // namespace gpuguard::metrics

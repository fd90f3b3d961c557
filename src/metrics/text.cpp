#include "gpuguard/metrics/text.hpp"

#include <cstdio>

#include "gpuguard/metrics/counters.hpp"

namespace gpuguard::metrics {

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

void render_build_info(std::string& out, std::string_view version) {
  header(out, "gpuguard_build_info", "gauge", "The running version.");
  out.append("gpuguard_build_info{version=\"").append(version).append("\"} 1\n");
}

void DurationHistogram::observe(double seconds) {
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) buckets_[i].fetch_add(1, std::memory_order_relaxed);
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(seconds, std::memory_order_relaxed);
}

void DurationHistogram::render(std::string& out, std::string_view name, std::string_view labels) const {
  std::string_view plain_labels = labels.empty() ? labels : labels.substr(0, labels.size() - 1);
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    out.append(name)
        .append("_bucket{")
        .append(labels)
        .append("le=\"")
        .append(number(kBuckets[i]))
        .append("\"} ")
        .append(std::to_string(buckets_[i].load(std::memory_order_relaxed)))
        .append("\n");
  }
  const std::uint64_t count = count_.load(std::memory_order_relaxed);
  out.append(name).append("_bucket{").append(labels).append("le=\"+Inf\"} ").append(std::to_string(count)).append("\n");
  auto series = [&](std::string_view suffix) {
    out.append(name).append(suffix);
    if (!plain_labels.empty()) out.append("{").append(plain_labels).append("}");
    out.append(" ");
  };
  series("_sum");
  out.append(number(sum_.load(std::memory_order_relaxed))).append("\n");
  series("_count");
  out.append(std::to_string(count)).append("\n");
}

}  // namespace gpuguard::metrics

#include "gpuguard/metrics/text.hpp"

#include <cstdio>

#include "gpuguard/metrics/counters.hpp"

namespace gpuguard::metrics {

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::string labels(std::initializer_list<std::pair<std::string_view, std::string_view>> pairs) {
  std::string text;
  for (const auto& [name, value] : pairs) {
    if (!text.empty()) text += ',';
    text.append(name).append("=\"").append(value).append("\"");
  }
  return text;
}

void header(std::string& out, const Family& family) {
  out.append("# HELP ").append(family.name).append(" ").append(family.help).append("\n");
  out.append("# TYPE ").append(family.name).append(" ").append(family.type).append("\n");
}

void sample(std::string& out, const Family& family, std::string_view labels, std::string_view value) {
  out.append(family.name);
  if (!labels.empty()) out.append("{").append(labels).append("}");
  out.append(" ").append(value).append("\n");
}

void sample(std::string& out, const Family& family, std::string_view labels, std::uint64_t value) {
  sample(out, family, labels, std::to_string(value));
}

void single(std::string& out, const Family& family, std::string_view value) {
  header(out, family);
  sample(out, family, "", value);
}

void single(std::string& out, const Family& family, std::uint64_t value) { single(out, family, std::to_string(value)); }

void two_results(std::string& out, const Family& family, const std::array<std::uint64_t, 2>& counts) {
  header(out, family);
  sample(out, family, "result=\"success\"", counts[0]);
  sample(out, family, "result=\"failure\"", counts[1]);
}

void render_build_info(std::string& out, std::string_view version) {
  constexpr Family kBuildInfo{"gpuguard_build_info", "gauge", "The running version."};
  header(out, kBuildInfo);
  sample(out, kBuildInfo, labels({{"version", version}}), "1");
}

void DurationHistogram::observe(double seconds) {
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) buckets_[i].fetch_add(1, std::memory_order_relaxed);
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(seconds, std::memory_order_relaxed);
}

void DurationHistogram::render(std::string& out, const Family& family, std::string_view labels) const {
  const std::string_view name = family.name;
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

#include "gpuguard/metrics/registry.hpp"

#include "gpuguard/admission/review.hpp"
#include "gpuguard/metrics/text.hpp"

namespace gpuguard::metrics {
namespace {

std::string_view known_operation(std::string_view operation) {
  for (std::string_view known : {"CREATE", "UPDATE", "DELETE", "CONNECT"}) {
    if (operation == known) return known;
  }
  return "unknown";
}

}  // namespace

Registry::Registry(std::string version)
    : version_(std::move(version)), durations_(std::make_unique<DurationHistogram>()) {}

Registry::~Registry() = default;

void Registry::count_admission(std::string_view operation, std::string_view result, double seconds) {
  std::lock_guard lock(mutex_);
  ++requests_[{std::string(known_operation(operation)), std::string(result)}];
  durations_->observe(seconds);
}

void Registry::count_mutations(const std::array<std::size_t, 4>& by_reason) {
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < by_reason.size(); ++i) mutations_[i] += by_reason[i];
}

std::string Registry::render() const {
  std::string out;
  {
    std::lock_guard lock(mutex_);
    header(out, "gpuguard_admission_requests_total", "counter", "Admission reviews answered, by operation and result.");
    labelled_counter(out, "gpuguard_admission_requests_total", "operation", "result", requests_);
    header(out, "gpuguard_admission_duration_seconds", "histogram", "Time to decode, decide and encode one review.");
    durations_->render(out, "gpuguard_admission_duration_seconds", "");
    header(out, "gpuguard_containers_mutated_total", "counter", "Containers patched, by reason.");
    for (std::size_t i = 0; i < mutations_.size(); ++i) {
      out.append("gpuguard_containers_mutated_total{reason=\"").append(admission::kMutationReasons[i]).append("\"} ")
          .append(std::to_string(mutations_[i])).append("\n");
    }
  }
  render_reloads(out, true);
  render_build_info(out, version_);
  return out;
}

void render_build_info(std::string& out, std::string_view version) {
  header(out, "gpuguard_build_info", "gauge", "The running version.");
  out.append("gpuguard_build_info{version=\"").append(version).append("\"} 1\n");
}

}  // namespace gpuguard::metrics

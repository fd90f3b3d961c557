#include "gpuguard/metrics/extender_registry.hpp"

#include "gpuguard/metrics/registry.hpp"
#include "gpuguard/metrics/text.hpp"

namespace gpuguard::metrics {

ExtenderRegistry::ExtenderRegistry(std::string version, bool serves_tls)
    : version_(std::move(version)), serves_tls_(serves_tls) {
  for (const char* verb : {"filter", "prioritize"}) durations_.emplace(verb, std::make_unique<DurationHistogram>());
}

ExtenderRegistry::~ExtenderRegistry() = default;

void ExtenderRegistry::count_request(std::string_view verb, std::string_view result, double seconds) {
  std::lock_guard lock(mutex_);
  ++requests_[{std::string(verb), std::string(result)}];
  if (const auto found = durations_.find(verb); found != durations_.end()) found->second->observe(seconds);
}

void ExtenderRegistry::count_informer(std::string_view resource, std::string_view outcome) {
  std::lock_guard lock(mutex_);
  ++informer_[{std::string(resource), std::string(outcome)}];
}

std::string ExtenderRegistry::render(const CacheStats& cache) const {
  std::string out;
  {
    std::lock_guard lock(mutex_);
    header(out, "gpuguard_extender_requests_total", "counter", "Scheduler extender calls answered, by verb and result.");
    labelled_counter(out, "gpuguard_extender_requests_total", "verb", "result", requests_);
    header(out, "gpuguard_extender_request_duration_seconds", "histogram", "Time to decode, decide and encode one call.");
    for (const auto& [verb, histogram] : durations_) {
      histogram->render(out, "gpuguard_extender_request_duration_seconds", "verb=\"" + verb + "\",");
    }
    header(out, "gpuguard_kube_informer_outcomes_total", "counter",
           "Lists and watch ends against the Kubernetes API, by resource and outcome.");
    labelled_counter(out, "gpuguard_kube_informer_outcomes_total", "resource", "outcome", informer_);
  }
  header(out, "gpuguard_extender_synced", "gauge", "1 once pods and nodes have been listed.");
  out.append("gpuguard_extender_synced ").append(cache.synced ? "1" : "0").append("\n");
  header(out, "gpuguard_extender_cached_objects", "gauge",
         "Objects in the cache: nodes, and bound unfinished pods holding extended resources.");
  out.append("gpuguard_extender_cached_objects{resource=\"nodes\"} ").append(std::to_string(cache.nodes)).append("\n");
  out.append("gpuguard_extender_cached_objects{resource=\"pods\"} ").append(std::to_string(cache.pods)).append("\n");
  render_reloads(out, serves_tls_);
  render_build_info(out, version_);
  return out;
}

}  // namespace gpuguard::metrics

#include "gpuguard/extender/extender_metrics.hpp"

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::extender {
namespace {

constexpr std::array<std::string_view, 2> kVerbs = {"filter", "prioritize"};
constexpr std::array<std::string_view, 3> kResults = {"ok", "invalid", "not_synced"};
constexpr std::array<std::string_view, 2> kResources = {"nodes", "pods"};

constexpr metrics::Family kRequests{"gpuguard_extender_requests_total", "counter",
                                    "Scheduler extender calls answered, by verb and result."};
constexpr metrics::Family kDuration{"gpuguard_extender_request_duration_seconds", "histogram",
                                    "Time to decode, decide and encode one call."};
constexpr metrics::Family kSynced{"gpuguard_extender_synced", "gauge", "1 once pods and nodes have been listed."};
constexpr metrics::Family kCached{"gpuguard_extender_cached_objects", "gauge",
                                  "Objects in the cache: nodes, and bound unfinished pods holding extended resources."};

constexpr metrics::Family kUnreadable{
    "gpuguard_extender_unreadable_objects_total", "counter",
    "Nodes and pods holding a quantity the extender cannot count as written (not a non-negative quantity, or "
    "beyond 2^40), each logged once; such a node takes no pod asking for that resource."};

std::array<std::string_view, 5> outcomes() {
  std::array<std::string_view, 5> names{};
  for (std::size_t i = 0; i < names.size(); ++i) names[i] = kube::kReflectorOutcomes[i];
  return names;
}

}  // namespace

ExtenderMetrics::ExtenderMetrics(std::string version, bool serves_tls)
    : version_(std::move(version)),
      serves_tls_(serves_tls),
      requests_("verb", kVerbs, "result", kResults),
      informer_("resource", kResources, "outcome", outcomes()) {}

void ExtenderMetrics::count_request(Verb verb, CallResult result, double seconds) {
  requests_.add(static_cast<std::size_t>(verb), static_cast<std::size_t>(result));
  durations_[static_cast<std::size_t>(verb)].observe(seconds);
}

void ExtenderMetrics::count_informer(std::string_view resource, kube::ReflectorOutcome outcome) {
  for (std::size_t i = 0; i < kResources.size(); ++i) {
    if (resource == kResources[i]) informer_.add(i, static_cast<std::size_t>(outcome));
  }
}

std::string ExtenderMetrics::render(const CacheStats& cache) const {
  std::string out;
  metrics::header(out, kRequests);
  requests_.render(out, kRequests);
  metrics::header(out, kDuration);
  for (std::size_t i = 0; i < kVerbs.size(); ++i) {
    durations_[i].render(out, kDuration, "verb=\"" + std::string(kVerbs[i]) + "\",");
  }
  metrics::header(out, metrics::kInformerOutcomes);
  informer_.render(out, metrics::kInformerOutcomes);
  metrics::single(out, kSynced, cache.synced ? "1" : "0");
  metrics::header(out, kCached);
  metrics::sample(out, kCached, "resource=\"nodes\"", cache.nodes);
  metrics::sample(out, kCached, "resource=\"pods\"", cache.pods);
  metrics::header(out, kUnreadable);
  metrics::sample(out, kUnreadable, "resource=\"nodes\"", cache.unreadable_nodes);
  metrics::sample(out, kUnreadable, "resource=\"pods\"", cache.unreadable_pods);
  render_reloads(out, serves_tls_);
  metrics::render_build_info(out, version_);
  return out;
}

}  // namespace gpuguard::extender

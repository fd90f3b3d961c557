#pragma once
// The scheduler extender's series. Label values come from fixed sets (verbs, results, the watched
// resources and the reflectors' outcomes), never from request content.
#include <cstddef>
#include <string>
#include <string_view>

#include "gpuguard/kube/reflector.hpp"
#include "gpuguard/metrics/counters.hpp"
#include "gpuguard/metrics/reloads.hpp"

namespace gpuguard::extender {

enum class Verb { filter, prioritize };
enum class CallResult { ok, invalid, not_synced };  // invalid: HTTP 400; not_synced: answered before the first list

struct CacheStats {
  bool synced = false;
  std::size_t pods = 0;
  std::size_t nodes = 0;
  std::size_t unreadable_pods = 0;  // ClusterState::unreadable_count
  std::size_t unreadable_nodes = 0;
};

class ExtenderMetrics final : public metrics::ReloadMetrics {
 public:
  ExtenderMetrics(std::string version, bool serves_tls);

  void count_request(Verb verb, CallResult result, double seconds);
  // A reflector outcome for "pods" or "nodes" (kube::InformerObserver); other resources are not counted.
  void count_informer(std::string_view resource, kube::ReflectorOutcome outcome);
  std::string render(const CacheStats& cache) const;

 private:
  const std::string version_;
  const bool serves_tls_;
  metrics::LabelledCounters<2, 3> requests_;
  std::array<metrics::DurationHistogram, 2> durations_;
  metrics::LabelledCounters<2, 5> informer_;
};

}  // namespace gpuguard::extender

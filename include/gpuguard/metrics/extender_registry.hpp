#pragma once
// The scheduler extender's series. Label values come from fixed sets (verbs, results, the two watched
// resources and the informer outcomes), never from request content.
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

struct CacheStats {
  bool synced = false;
  std::size_t pods = 0;
  std::size_t nodes = 0;
};

class ExtenderRegistry : public ReloadMetrics {
 public:
  ExtenderRegistry(std::string version, bool serves_tls);
  ~ExtenderRegistry() override;

  // verb: filter or prioritize; result: ok, invalid (HTTP 400) or not_synced.
  void count_request(std::string_view verb, std::string_view result, double seconds);
  // An informer outcome (kube::InformerObserver): list_success, watch_gone, ...
  void count_informer(std::string_view resource, std::string_view outcome);

  std::string render(const CacheStats& cache) const;

 private:
  const std::string version_;
  const bool serves_tls_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, std::uint64_t> requests_;
  std::map<std::string, std::unique_ptr<DurationHistogram>, std::less<>> durations_;
  std::map<std::pair<std::string, std::string>, std::uint64_t> informer_;
};

}  // namespace gpuguard::metrics

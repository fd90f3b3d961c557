#pragma once
// The kubelet's answer for each pod, fetched when its sandbox is made, so that a container's creation
// does not wait on the kubelet. The kubelet allocates a pod's devices (and prepares its DRA claims) when it
// admits the pod, before the sandbox, and never changes them while the pod lives: the answer read at
// RunPodSandbox is the one every container of that sandbox is created under, restarts included. Kept by
// sandbox ID, which no later pod reuses. One thread lists for every sandbox waiting, so a burst of pods
// costs the kubelet one call, not one each (it allows 100 a second), and keeps of the list only the pods
// waiting.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "gpuguard/enforcer/ports.hpp"

namespace gpuguard::enforcer {

class AllocationCache {
 public:
  // `deadline`: each List's. Sandboxes beyond `capacity`, and answers past `bytes` kept in all, are not kept
  // (their containers ask the kubelet at creation, as without the cache).
  AllocationCache(PodResourcesSource& kubelet, std::chrono::milliseconds deadline, std::size_t capacity = 1024,
                  std::size_t bytes = std::size_t{4} << 20);
  ~AllocationCache();
  AllocationCache(const AllocationCache&) = delete;
  AllocationCache& operator=(const AllocationCache&) = delete;

  // A sandbox was made: fetch its pod's answer in the background.
  void fetch(const std::string& sandbox_id, const std::string& pod_namespace, const std::string& pod_name);
  // The pod's answer as the kubelet gave it for this sandbox, waiting for a fetch under way at most
  // `wait`; nothing when the sandbox was not fetched (made before the enforcer), the fetch failed, or it
  // did not come in time: then the caller asks the kubelet itself.
  std::optional<KubeletAnswer> answer(const std::string& sandbox_id, std::chrono::milliseconds wait);
  void forget(const std::string& sandbox_id);
  // Sandboxes known, fetched or under way.
  std::size_t size();
  // Lists made since the start.
  std::size_t lists();

 private:
  struct Entry {
    std::string pod_namespace, pod_name;
    std::optional<KubeletAnswer> answer;  // empty while the fetch is under way
    std::size_t bytes = 0;                // what the answer keeps
  };
  void run(const std::stop_token& stop);

  PodResourcesSource& kubelet_;
  std::chrono::milliseconds deadline_;
  std::size_t capacity_;
  std::size_t bytes_max_;
  std::size_t bytes_ = 0;  // kept by the answers, in all
  std::mutex mutex_;
  std::condition_variable_any changed_;
  std::map<std::string, Entry> entries_;  // by sandbox ID
  std::deque<std::string> pending_;       // sandbox IDs to fetch
  std::size_t lists_ = 0;
  std::jthread worker_;  // last: it starts on the members above
};

// The bytes a pod's answer keeps (its names and IDs, and each string's own size).
std::size_t answer_bytes(const KubeletAnswer& answer);

// One pod's answer from the kubelet, asked now within `deadline`.
KubeletAnswer pod_answer(PodResourcesSource& kubelet, const std::string& pod_namespace, const std::string& pod_name,
                         std::chrono::milliseconds deadline);

}  // namespace gpuguard::enforcer

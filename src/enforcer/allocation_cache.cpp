// The kubelet's answers fetched at sandbox creation (allocation_cache.hpp).
#include "allocation_cache.hpp"

#include "gpuguard/log/log.hpp"

namespace gpuguard::enforcer {

AllocationCache::AllocationCache(KubeletClient& kubelet, std::chrono::milliseconds deadline, std::size_t capacity)
    : kubelet_(kubelet),
      deadline_(deadline),
      capacity_(capacity),
      worker_([this](const std::stop_token& stop) { run(stop); }) {}

AllocationCache::~AllocationCache() {
  worker_.request_stop();
  changed_.notify_all();
}

void AllocationCache::fetch(const std::string& sandbox_id, const std::string& pod_namespace,
                            const std::string& pod_name) {
  {
    const std::lock_guard lock(mutex_);
    if (entries_.size() >= capacity_ || entries_.contains(sandbox_id)) return;
    entries_[sandbox_id] = Entry{pod_namespace, pod_name, std::nullopt};
    pending_.push_back(sandbox_id);
  }
  changed_.notify_all();
}

std::optional<KubeletAnswer> AllocationCache::answer(const std::string& sandbox_id, std::chrono::milliseconds wait) {
  std::unique_lock lock(mutex_);
  const auto until = std::chrono::steady_clock::now() + wait;
  for (;;) {
    const auto entry = entries_.find(sandbox_id);
    if (entry == entries_.end()) return std::nullopt;
    if (entry->second.answer) {
      if (entry->second.answer->answered) return entry->second.answer;
      entries_.erase(entry);  // failed: the caller asks the kubelet, and a later container asks again
      return std::nullopt;
    }
    if (changed_.wait_until(lock, until) == std::cv_status::timeout) return std::nullopt;
  }
}

void AllocationCache::forget(const std::string& sandbox_id) {
  const std::lock_guard lock(mutex_);
  entries_.erase(sandbox_id);
}

std::size_t AllocationCache::size() {
  const std::lock_guard lock(mutex_);
  return entries_.size();
}

void AllocationCache::run(const std::stop_token& stop) {
  std::unique_lock lock(mutex_);
  while (!stop.stop_requested()) {
    changed_.wait(lock, stop, [&] { return !pending_.empty(); });
    if (stop.stop_requested()) return;
    // Every sandbox waiting now is answered by the one List.
    std::deque<std::string> batch;
    batch.swap(pending_);
    lock.unlock();
    std::string error;
    const std::map<std::string, PodResources> listed = kubelet_.all(deadline_, error);
    if (!error.empty()) log::warn("cannot read the kubelet's allocations ahead of the containers", {{"reason", error}});
    lock.lock();
    for (const std::string& id : batch) {
      const auto entry = entries_.find(id);
      if (entry == entries_.end()) continue;  // forgotten meanwhile
      KubeletAnswer answer;
      answer.answered = error.empty();
      answer.error = error;
      if (const auto pod = listed.find(entry->second.pod_namespace + "/" + entry->second.pod_name); pod != listed.end())
        answer.pod = pod->second;
      entry->second.answer = std::move(answer);
    }
    changed_.notify_all();
  }
}

}  // namespace gpuguard::enforcer

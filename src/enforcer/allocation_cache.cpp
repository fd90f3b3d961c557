// The kubelet's answers fetched at sandbox creation (include/gpuguard/enforcer/allocation_cache.hpp).
#include "gpuguard/enforcer/allocation_cache.hpp"

#include <set>

#include "gpuguard/log/log.hpp"

namespace gpuguard::enforcer {
namespace {

std::string key(std::string_view pod_namespace, std::string_view pod_name) {
  return std::string(pod_namespace).append("/").append(pod_name);
}

}  // namespace

KubeletAnswer pod_answer(PodResourcesSource& kubelet, const std::string& pod_namespace, const std::string& pod_name,
                         std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  if (std::optional<KubeletAnswer> got = kubelet.get(pod_namespace, pod_name, deadline)) return std::move(*got);
  deadline = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  KubeletAnswer answer;
  answer.error = kubelet.list(
      deadline, [&](std::string_view ns, std::string_view name) { return ns == pod_namespace && name == pod_name; },
      [&](std::string_view, std::string_view, PodResources pod) { answer.pod = std::move(pod); });
  answer.answered = answer.error.empty();
  if (!answer.answered) answer.pod.reset();
  return answer;
}

std::size_t answer_bytes(const KubeletAnswer& answer) {
  std::size_t bytes = sizeof(KubeletAnswer) + answer.error.size();
  if (!answer.pod) return bytes;
  bytes += answer.pod->unreadable.size();
  for (const auto& container : answer.pod->containers) {
    bytes += sizeof(container) + container.name.size();
    for (const auto& devices : container.devices) {
      bytes += sizeof(devices) + devices.resource.size();
      for (const auto& id : devices.ids) bytes += sizeof(std::string) + id.size();
    }
    for (const auto& name : container.cdi_devices) bytes += sizeof(std::string) + name.size();
  }
  return bytes;
}

AllocationCache::AllocationCache(PodResourcesSource& kubelet, std::chrono::milliseconds deadline, std::size_t capacity,
                                 std::size_t bytes)
    : kubelet_(kubelet),
      deadline_(deadline),
      capacity_(capacity),
      bytes_max_(bytes),
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
      bytes_ -= entry->second.bytes;
      entries_.erase(entry);  // failed: the caller asks the kubelet, and a later container asks again
      return std::nullopt;
    }
    if (changed_.wait_until(lock, until) == std::cv_status::timeout) return std::nullopt;
  }
}

void AllocationCache::forget(const std::string& sandbox_id) {
  const std::lock_guard lock(mutex_);
  if (const auto entry = entries_.find(sandbox_id); entry != entries_.end()) {
    bytes_ -= entry->second.bytes;
    entries_.erase(entry);
  }
}

std::size_t AllocationCache::size() {
  const std::lock_guard lock(mutex_);
  return entries_.size();
}

std::size_t AllocationCache::lists() {
  const std::lock_guard lock(mutex_);
  return lists_;
}

void AllocationCache::run(const std::stop_token& stop) {
  std::unique_lock lock(mutex_);
  while (!stop.stop_requested()) {
    changed_.wait(lock, stop, [&] { return !pending_.empty(); });
    if (stop.stop_requested()) return;
    // Every sandbox waiting now is answered by the one List, which keeps only their pods.
    std::deque<std::string> batch;
    batch.swap(pending_);
    std::set<std::string> wanted;
    for (const std::string& id : batch) {
      if (const auto entry = entries_.find(id); entry != entries_.end()) {
        wanted.insert(key(entry->second.pod_namespace, entry->second.pod_name));
      }
    }
    lock.unlock();
    std::map<std::string, KubeletAnswer> answers;
    if (wanted.size() == 1) {
      // One pod: Get where the kubelet serves it, which reads that pod alone.
      const std::string& only = *wanted.begin();
      const std::size_t slash = only.find('/');
      answers[only] = pod_answer(kubelet_, only.substr(0, slash), only.substr(slash + 1), deadline_);
    } else {
      std::map<std::string, PodResources> listed;
      const std::string error = kubelet_.list(
          deadline_, [&](std::string_view ns, std::string_view name) { return wanted.contains(key(ns, name)); },
          [&](std::string_view ns, std::string_view name, PodResources pod) {
            listed[key(ns, name)] = std::move(pod);
          });
      if (!error.empty())
        log::warn("cannot read the kubelet's allocations ahead of the containers", {{"reason", error}});
      for (const std::string& pod : wanted) {
        KubeletAnswer& answer = answers[pod];
        answer.answered = error.empty();
        answer.error = error;
        if (const auto found = listed.find(pod); answer.answered && found != listed.end()) answer.pod = found->second;
      }
    }
    lock.lock();
    ++lists_;
    for (const std::string& id : batch) {
      const auto entry = entries_.find(id);
      if (entry == entries_.end()) continue;  // forgotten meanwhile
      const auto answer = answers.find(key(entry->second.pod_namespace, entry->second.pod_name));
      if (answer == answers.end()) continue;
      const std::size_t bytes = answer_bytes(answer->second);
      if (bytes_ + bytes > bytes_max_) {
        entries_.erase(entry);  // past what the cache keeps: its containers ask at their creation
        continue;
      }
      bytes_ += bytes;
      entry->second.bytes = bytes;
      entry->second.answer = answer->second;
    }
    changed_.notify_all();
  }
}

}  // namespace gpuguard::enforcer

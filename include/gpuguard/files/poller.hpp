#pragma once
// Periodic checks on a thread of their own. Polling file contents, rather than inotify, follows every way
// Kubernetes replaces mounted files: the kubelet's `..data` symlink swap for ConfigMaps and Secrets, a
// subPath mount, or an editor writing in place; a check costs a few small reads.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace gpuguard::files {

class Poller {
 public:
  // Calls `check` every `interval` until destroyed, the first time at once when `check_at_start`; the
  // destructor waits for a running check to end.
  Poller(std::chrono::milliseconds interval, std::function<void()> check, bool check_at_start = false);
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::jthread thread_;
};

}  // namespace gpuguard::files

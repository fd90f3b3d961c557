#include "gpuguard/files/poller.hpp"

namespace gpuguard::files {

Poller::Poller(std::chrono::milliseconds interval, std::function<void()> check)
    : thread_([this, interval, check = std::move(check)](const std::stop_token& stop) {
        std::unique_lock lock(mutex_);
        while (!wake_.wait_for(lock, stop, interval, [] { return false; })) {
          if (stop.stop_requested()) return;
          lock.unlock();
          check();
          lock.lock();
        }
      }) {}

Poller::~Poller() {
  thread_.request_stop();
  thread_.join();
}

}  // namespace gpuguard::files

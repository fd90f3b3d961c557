#include "gpuguard/files/poller.hpp"

namespace gpuguard::files {

Poller::Poller(std::chrono::milliseconds interval, std::function<void()> check, bool check_at_start)
    : thread_([this, interval, check = std::move(check), check_at_start](const std::stop_token& stop) {
        if (check_at_start) check();
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

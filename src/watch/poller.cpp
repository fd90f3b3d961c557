#include "gpuguard/watch/poller.hpp"

#include <fstream>
#include <sstream>

namespace gpuguard::watch {

Poller::Poller(std::chrono::milliseconds interval, std::function<void()> check)
    : thread_([this, interval, check = std::move(check)](std::stop_token stop) {
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

std::optional<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return std::move(content).str();
}

}  // namespace gpuguard::watch

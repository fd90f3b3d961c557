// Host paths looked up off the runtime's thread, within a deadline (path_worker.hpp says why).
#include "path_worker.hpp"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace gpuguard::enforcer {

// What the workers share with the enforcer, kept alive by each of them: one left in the kernel outlives
// the PathWorker that started it.
struct PathWorker::Shared {
  std::atomic<std::size_t> stuck{0};
};

// One worker's hand-over: a lookup in, its answer out.
struct PathWorker::Slot {
  std::mutex mutex;
  std::condition_variable changed;
  Lookup lookup;                                          // set: a lookup to run
  std::optional<enforcement::HostPathResolution> answer;  // set: its answer
  bool stop = false;                                      // the PathWorker is gone
  bool left = false;                                      // its caller stopped waiting: end after this one
};

PathWorker::PathWorker(std::chrono::milliseconds deadline, std::size_t stuck_max)
    : deadline_(deadline), stuck_max_(stuck_max), shared_(std::make_shared<Shared>()) {
  start();
}

PathWorker::~PathWorker() {
  const std::lock_guard lock(slot_->mutex);
  slot_->stop = true;
  slot_->changed.notify_all();
}

void PathWorker::start() {
  slot_ = std::make_shared<Slot>();
  std::thread([slot = slot_, shared = shared_] {
    std::unique_lock lock(slot->mutex);
    for (;;) {
      slot->changed.wait(lock, [&] { return slot->stop || slot->lookup; });
      if (!slot->lookup) return;  // stopped, nothing to run
      Lookup lookup = std::move(slot->lookup);
      slot->lookup = nullptr;
      lock.unlock();
      enforcement::HostPathResolution answer = lookup();
      lock.lock();
      slot->answer = std::move(answer);
      slot->changed.notify_all();
      if (slot->left) {
        --shared->stuck;  // back from the kernel at last: no longer counted
        return;
      }
    }
  }).detach();
}

std::optional<enforcement::HostPathResolution> PathWorker::run(Lookup lookup) {
  if (shared_->stuck.load() >= stuck_max_) return std::nullopt;
  std::unique_lock lock(slot_->mutex);
  slot_->answer.reset();
  slot_->lookup = std::move(lookup);
  slot_->changed.notify_all();
  if (slot_->changed.wait_for(lock, deadline_, [&] { return slot_->answer.has_value(); })) {
    return std::move(slot_->answer);
  }
  slot_->left = true;
  ++shared_->stuck;
  lock.unlock();
  start();
  return std::nullopt;
}

std::size_t PathWorker::stuck() const { return shared_->stuck.load(); }

}  // namespace gpuguard::enforcer

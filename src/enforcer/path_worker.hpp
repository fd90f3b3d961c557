#pragma once
// Host paths looked up off the runtime's thread, each within a deadline. A lookup on a network filesystem
// whose server is gone (a pod's NFS volume, a hostPath to a dead mount) blocks in the kernel, and no signal
// ends it: run on the one thread that answers NRI, it would hold every create, and NRI would drop the
// enforcer. So a lookup runs on a worker, and the caller waits at most the deadline. A worker that does not
// come back is left to the kernel and another takes its place; at most `stuck_max` are left so, past which
// every lookup is refused at once, until one returns.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "gpuguard/enforcement/decision.hpp"

namespace gpuguard::enforcer {

class PathWorker {
 public:
  using Lookup = std::function<enforcement::HostPathResolution()>;
  PathWorker(std::chrono::milliseconds deadline, std::size_t stuck_max);
  ~PathWorker();
  PathWorker(const PathWorker&) = delete;
  PathWorker& operator=(const PathWorker&) = delete;

  // `lookup`'s answer, or nullopt where it took longer than the deadline or too many workers are stuck.
  // `lookup` must own what it reads: a worker left behind runs it to its end.
  std::optional<enforcement::HostPathResolution> run(Lookup lookup);
  // Workers left in the kernel now.
  std::size_t stuck() const;

 private:
  struct Slot;
  struct Shared;
  void start();
  std::chrono::milliseconds deadline_;
  std::size_t stuck_max_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Slot> slot_;  // the worker taking lookups now
};

}  // namespace gpuguard::enforcer

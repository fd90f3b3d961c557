#pragma once
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "gpuguard/files/poller.hpp"
#include "gpuguard/metrics/reloads.hpp"
#include "gpuguard/policy/policy.hpp"

namespace gpuguard::policy {

// The policy in force, from a mounted ConfigMap directory (one file per key, see policy::parse_policy).
// A changed directory is re-read and swapped in whole; an invalid one is refused, logged and counted, and
// the last good policy stays. No directory, a missing one or an empty one means the defaults.
// A program that uses only some keys names them in `keys`: the others are not read, so a bad value of a
// key it does not use (the webhook's mode, say) neither stops it nor is refused by it.
class PolicyWatcher {
 public:
  enum class AtStart { refuse, defaults };
  // With AtStart::refuse, throws std::runtime_error naming the key when the directory holds an invalid
  // policy at start; with AtStart::defaults, logs and counts the refusal and serves the defaults until a
  // valid policy arrives. `keys` empty: every key.
  PolicyWatcher(std::optional<std::filesystem::path> dir, metrics::ReloadMetrics& metrics,
                std::set<std::string> keys = {}, AtStart invalid = AtStart::refuse);

  std::shared_ptr<const policy::Policy> current() const { return policy_.load(); }

  // Re-reads the directory every `interval` from now on (no-op without a directory).
  void watch(std::chrono::milliseconds interval);

  // One check, as the poller does it; returns true when a new policy was swapped in.
  bool reload();

 private:
  std::optional<std::map<std::string, std::string>> read() const;

  std::optional<std::filesystem::path> dir_;
  metrics::ReloadMetrics& metrics_;
  std::set<std::string> keys_;
  std::atomic<std::shared_ptr<const policy::Policy>> policy_;
  std::optional<std::map<std::string, std::string>> last_seen_;
  std::unique_ptr<files::Poller> poller_;
};

}  // namespace gpuguard::policy

#pragma once
// What the node enforcer knows of its node (decision.hpp's NodeView), read from the host's files under the
// host root: the GPUs the driver lists (and their MIG devices, from NVML where it loads, else from the CDI
// specs that name them), how the NVIDIA toolkit reads a container (the node report's facts: mode, version,
// CDI kind, annotation prefixes), and the CDI devices the node's specs define. The GPUs and the toolkit are
// read again every minute and at each registration; the CDI specs whenever a spec directory changes, which
// a stat per directory tells at each create (a DRA driver writes a claim's spec just before its container).
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpuguard/enforcer/decision.hpp"

namespace gpuguard::enforcer {

class NodeReader {
 public:
  NodeReader(std::filesystem::path host_root, std::vector<std::string> mps_roots);

  // The node as last read, its CDI devices read again first where a spec directory changed.
  std::shared_ptr<const NodeView> current();
  // Reads everything again.
  void refresh();

 private:
  std::shared_ptr<NodeView> read_all() const;
  // The spec directories' modification times, to tell when to read the specs again.
  std::vector<std::filesystem::file_time_type> spec_times(const NodeView& node) const;
  void read_specs(NodeView& node) const;

  const std::filesystem::path host_root_;
  const std::vector<std::string> mps_roots_;
  std::mutex mutex_;  // one reader at a time
  std::vector<std::filesystem::file_time_type> times_;
  std::atomic<std::shared_ptr<const NodeView>> node_;
};

}  // namespace gpuguard::enforcer

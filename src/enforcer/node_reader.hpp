#pragma once
// What the node enforcer knows of its node (decision.hpp's NodeView), read from the host's files under the
// host root: the node's state port (ports.hpp). The GPUs the driver lists (and their MIG devices, from NVML
// where it loads, else from the CDI specs that name them); how the NVIDIA toolkit the container runtime runs
// reads a container (the node report's facts: its mode as configured, the version of the runtime binary the
// runtime's configuration names); the CDI devices the node's specs define; and where a host path leads.
//
// Read again when what it was read from changes, not on a timer: each create stats the files the facts came
// from (the runtime's and the toolkit's configuration, the runtime binary, the CDI spec directories, whether
// the driver's /proc/driver/nvidia is there), and reads again what changed. The program's minute poll reads
// the GPUs again besides, for what procfs does not stamp.
#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpuguard/enforcer/ports.hpp"
#include "path_worker.hpp"

namespace gpuguard::enforcer {

class NodeReader final : public NodeState {
 public:
  // `kubelet_root`: where the kubelet keeps pods' volumes (/var/lib/kubelet), whose contents their
  // containers write, as they write their own root filesystems (container_writable in node_reader.cpp).
  NodeReader(std::filesystem::path host_root, std::vector<std::string> mps_roots,
             const std::filesystem::path& kubelet_root = "/var/lib/kubelet");

  std::shared_ptr<const NodeView> current() override;
  void refresh() override;
  HostPathResolution resolve(std::string_view host_path, std::size_t& steps_left) override;
  std::optional<std::string> mountinfo(std::uint32_t pid, std::string& why) override;

 private:
  // A file's identity and stamp, or that it is not there.
  struct Stamp {
    bool exists = false;
    std::filesystem::file_time_type modified;
    std::uintmax_t size = 0, inode = 0;
    bool operator==(const Stamp&) const = default;
  };
  struct Watched {
    std::vector<std::string> toolkit_paths;  // the configuration and binaries the toolkit facts came from
    std::vector<std::string> spec_dirs;
    std::vector<Stamp> toolkit, specs;
    Stamp driver;            // /proc/driver/nvidia
    std::vector<Stamp> mps;  // the MPS roots, whether they can be masked
  };

  Stamp stamp(const std::string& host_path) const;
  std::vector<Stamp> stamps(const std::vector<std::string>& host_paths) const;
  void read_gpus(NodeView& node) const;
  void read_toolkit(NodeView& node, Watched& watched) const;
  void read_specs(NodeView& node) const;
  void read_mps_roots(NodeView& node, Watched& watched) const;

  const std::filesystem::path host_root_;
  const std::vector<std::string> mps_roots_;
  const std::string kubelet_pods_;  // <kubelet root>/pods, on the host
  // The same where a link leads elsewhere (the kubelet's directory moved to another disk, linked back).
  std::atomic<std::shared_ptr<const std::string>> kubelet_pods_followed_;
  // Host paths are looked up here, each within 250 ms; two left in the kernel at most.
  PathWorker lookups_{std::chrono::milliseconds(250), 2};
  std::mutex mutex_;  // one reader at a time
  Watched watched_;
  std::atomic<std::shared_ptr<const NodeView>> node_;
};

}  // namespace gpuguard::enforcer

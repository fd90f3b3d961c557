#pragma once
// A node's GPU and its MIG devices as discovery finds them (discovery.hpp): the one type the device plugin
// serves from and the node enforcer decides by (enforcement::NodeView). Plain data, no I/O, so that the
// enforcer's pure decision can hold it without linking discovery.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::discovery {

// A MIG device: a compute instance (ci) of a GPU instance (gi) of a GPU in MIG mode.
struct MigDevice {
  std::string uuid;         // "MIG-…", as NVML names it: what the kubelet and the toolkit see
  unsigned gi = 0, ci = 0;  // NVML's; 0 where only a CDI spec names the device
  std::string profile;      // NVIDIA's name: "1g.10gb", "1g.10gb+me", "1c.3g.40gb"; "" where only a CDI spec names it
  // Its /dev/nvidia-caps/nvidia-cap<minor> nodes: the GPU instance's and the compute instance's, from procfs;
  // or as many as a CDI spec lists. Empty where unknown.
  std::vector<unsigned> cap_minors{};
};

// Members past the first few are initialised here, so that a GPU may be written as {uuid, minor, pci_address}.
struct Gpu {
  std::string uuid;         // "GPU-…", the device ID the kubelet sees
  unsigned minor = 0;       // /dev/nvidia<minor>
  std::string pci_address;  // "0000:3b:00.0", the directory name under /proc/driver/nvidia/gpus
  std::string model{};
  std::optional<std::int64_t> numa_node{};
  std::optional<std::uint64_t> memory_bytes{};  // NVML's total; procfs does not say
  // NVML: MIG mode is on. procfs: the driver lists MIG instances under capabilities/gpu<minor>/mig.
  bool mig_enabled = false;
  // Only NVML lists MIG devices (procfs knows neither their UUIDs nor their profiles): mig_listed says
  // whether mig_devices is the whole list.
  bool mig_listed = false;
  std::vector<MigDevice> mig_devices{};
};

// The GPU's MIG device of that UUID, or nullptr.
inline const MigDevice* find_mig(const Gpu& gpu, std::string_view uuid) {
  const auto found = std::find_if(gpu.mig_devices.begin(), gpu.mig_devices.end(),
                                  [&](const MigDevice& mig) { return mig.uuid == uuid; });
  return found == gpu.mig_devices.end() ? nullptr : &*found;
}

}  // namespace gpuguard::discovery

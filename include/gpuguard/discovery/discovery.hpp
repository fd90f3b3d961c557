#pragma once
// Finding NVIDIA GPUs without CUDA: the driver's procfs files, or NVML loaded with dlopen. Every path is
// read under the host root, so the plugin can run in a container with the host's /proc/driver/nvidia,
// /dev and /sys mounted, and tests can point it at a tree of their own.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/discovery/gpu.hpp"

namespace gpuguard::discovery {

// A path as the host sees it ("/dev/nvidia0"), resolved under the host root, its links followed inside
// that root (files::in_root).
std::filesystem::path host_path(const std::filesystem::path& host_root, std::string_view absolute);

// The MIG instances procfs shows for one GPU: /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<N>/access
// and gi<N>/ci<M>/access, each holding "DeviceFileMinor: <minor>" of its /dev/nvidia-caps node.
struct MigCapability {
  unsigned gi = 0, ci = 0;
  unsigned gi_cap_minor = 0, ci_cap_minor = 0;
};
std::vector<MigCapability> mig_capabilities(const std::filesystem::path& host_root, unsigned gpu_minor);

// `Key: value` lines of /proc/driver/nvidia/gpus/<pci>/information, split at the first ':' and trimmed.
std::map<std::string, std::string> parse_information(std::string_view text);

// Every GPU the driver lists and does not mark excluded, ordered by minor number.
std::vector<Gpu> discover_procfs(const std::filesystem::path& host_root);

// /sys/bus/pci/devices/<pci>/numa_node, when it names a node (-1 means unknown).
std::optional<std::int64_t> numa_node_of(const std::filesystem::path& host_root, const std::string& pci_address);

// First line of /proc/driver/nvidia/version, for the log; empty without a driver.
std::string driver_version(const std::filesystem::path& host_root);

// The device nodes a GPU container needs besides /dev/nvidia<minor>, those that exist under the host root.
std::vector<std::string> control_device_nodes(const std::filesystem::path& host_root);

// NVML, as far as the plugin uses it. The real one is dlopen'ed (load_nvml); tests use a double.
class Nvml {
 public:
  struct Device {
    std::string uuid;
    unsigned minor = 0;
    bool mig_enabled = false;
    std::vector<MigDevice> mig_devices;  // uuid, gi, ci and profile; cap minors come from procfs
    std::optional<std::uint64_t> memory_bytes;
  };
  struct XidEvent {
    std::string uuid;
    unsigned long long xid = 0;
  };
  struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  // What the driver says must happen before a GPU is usable again (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).
  enum class RecoveryAction { none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, other };

  virtual ~Nvml() = default;
  virtual std::vector<Device> devices() = 0;  // throws Error; MIG devices of MIG-enabled GPUs included
  // The next critical XID event on any GPU, or nullopt when `timeout` passes without one.
  virtual std::optional<XidEvent> wait_for_xid(std::chrono::milliseconds timeout) = 0;
  // Whether NVML still answers for this GPU (the re-probe that lets a GPU recover).
  virtual bool responds(const std::string& uuid) = 0;
  // The driver's recovery action for this GPU; nullopt where the driver does not report one.
  virtual std::optional<RecoveryAction> recovery_action(const std::string& uuid) = 0;
};

// NVIDIA's MIG profile names (go-nvlib's): "<G>g.<GB>gb" when the compute instance spans its GPU
// instance, else "<C>c.<G>g.<GB>gb", then the suffix of the GPU instance profile. GB is the instance's
// share of the GPU's memory, rounded up to an eighth, times the GPU's memory in whole GiB.
std::string mig_profile_name(unsigned gpu_slices, unsigned compute_slices, unsigned long long memory_mib,
                             unsigned long long gpu_memory_bytes, std::string_view suffix);
// "+me" (REV1), "+gfx", "-me", "+me.all" or "", by NVML_GPU_INSTANCE_PROFILE_* index.
std::string mig_profile_suffix(unsigned gpu_instance_profile_index);

// dlopen("libnvidia-ml.so.1") and nvmlInit; nullptr with `why_not` set when either fails.
std::unique_ptr<Nvml> load_nvml(std::string& why_not);

// GPUs as NVML lists them, with their MIG devices; PCI address, model, NUMA node and the MIG devices'
// capability minors come from procfs/sysfs by minor number.
std::vector<Gpu> discover_nvml(Nvml& nvml, const std::filesystem::path& host_root);

// --discovery: automatic is NVML when it loads, else procfs; none serves no GPUs (a host-device-only plugin).
enum class DiscoveryMode { automatic, nvml, procfs, none };
std::optional<DiscoveryMode> parse_discovery_mode(std::string_view name);

struct Discovery {
  std::unique_ptr<Nvml> nvml;  // set when the GPUs came from NVML: its events then drive health
  std::vector<Gpu> gpus;
  std::string source;            // "nvml", "procfs" or "none"
  std::string nvml_unavailable;  // why NVML was not used, when automatic fell back to procfs
};

// Throws std::runtime_error when NVML was asked for and cannot be used.
Discovery discover(DiscoveryMode mode, const std::filesystem::path& host_root);

}  // namespace gpuguard::discovery

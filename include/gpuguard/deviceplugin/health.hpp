#pragma once
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gpuguard/deviceplugin/discovery.hpp"
#include "gpuguard/deviceplugin/resource.hpp"

namespace gpuguard::deviceplugin {

// A device is healthy while every one of its paths exists under the host root: /dev/nvidia<minor> and the
// GPU's procfs information file in procfs mode, PATH for a host device.
struct PresenceCheck {
  DeviceSet* devices;
  std::string id;
  std::vector<std::filesystem::path> paths;
};
std::vector<PresenceCheck> presence_checks(const std::filesystem::path& host_root, GpuResource& resource,
                                           const std::vector<Gpu>& gpus);
std::vector<PresenceCheck> presence_checks(const std::filesystem::path& host_root, HostDeviceResource& resource);
void run_presence_checks(const std::vector<PresenceCheck>& checks);  // one pass; logs each change

// NVML health: a critical XID makes a GPU unhealthy, except the XIDs that an application causes. Unlike
// NVIDIA's plugin, a GPU recovers: every `reprobe_interval` an unhealthy GPU that NVML answers for, and
// that had no new XID since the last probe, is healthy again.
class NvmlHealth {
 public:
  static const std::set<unsigned long long> kApplicationXids;  // 13, 31, 43, 45, 68, 109

  NvmlHealth(Nvml& nvml, DeviceSet& devices, std::chrono::milliseconds reprobe_interval);
  // Waits up to `wait` for an XID, then re-probes if one is due. A thread calls it in a loop.
  void step(std::chrono::milliseconds wait);

 private:
  Nvml& nvml_;
  DeviceSet& devices_;
  std::chrono::milliseconds reprobe_interval_;
  std::chrono::steady_clock::time_point next_probe_;
  std::set<std::string> xid_since_probe_;
};

}  // namespace gpuguard::deviceplugin

#pragma once
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gpuguard/deviceplugin/resource.hpp"
#include "gpuguard/discovery/discovery.hpp"

namespace gpuguard::deviceplugin {

// Without NVML, a GPU is healthy while /dev/nvidia<minor> and its procfs information file exist under the
// host root. One check per GPU and device set; it sets the health of every device of that GPU.
struct PresenceCheck {
  DeviceSet* devices;
  std::string health_key;
  std::vector<std::filesystem::path> paths;
};
std::vector<PresenceCheck> presence_checks(const std::filesystem::path& host_root, const std::vector<DeviceSet*>& sets,
                                           const std::vector<discovery::Gpu>& gpus);
void run_presence_checks(const std::vector<PresenceCheck>& checks);  // one pass; logs each change

// "48,79, 94" -> {48, 79, 94}; empty text is an empty list. nullopt, with `error` naming the item, for
// anything but comma-separated numbers.
std::optional<std::set<unsigned long long>> parse_xid_list(std::string_view text, std::string& error);

struct NvmlHealthOptions {
  // XIDs an application causes: logged, the GPU stays healthy (NVIDIA's plugin ignores the same ones).
  std::set<unsigned long long> ignored_xids = {13, 31, 43, 45, 68, 109};
  // XIDs after which NVIDIA requires a GPU reset or a reboot: the GPU is not returned to service until
  // NVML shows that it was reset.
  std::set<unsigned long long> reset_xids = {48, 62, 64, 74, 79, 94, 95, 110, 119, 120, 136, 140, 143, 155, 156, 158};
  std::chrono::milliseconds probe_interval{30'000};
};

// NVML health, per physical GPU: what happens to a GPU happens to every device of it in every set (its
// replicas, its MIG devices; an XID on a MIG device arrives as the GPU's). A critical XID makes a GPU
// unhealthy, except the ignored ones. Every `probe_interval` each
// GPU is probed: one NVML no longer answers for turns unhealthy, XID or not. An unhealthy GPU is healthy
// again once NVML answers for it and it had no XID since the previous probe, with one exception: after a
// reset XID it needs evidence of the reset first, either NVML losing and finding the GPU again, or the
// driver's recovery action going from a reset (or reboot) back to none. Without either it stays unhealthy
// until the plugin restarts (as after a reboot). NVIDIA's own plugin never returns a GPU to service.
class NvmlHealth {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  NvmlHealth(
      discovery::Nvml& nvml, std::vector<DeviceSet*> sets, NvmlHealthOptions options,
      Clock clock = [] { return std::chrono::steady_clock::now(); });
  // Waits up to `wait` for an XID, then probes if a probe is due. A thread calls it in a loop.
  void step(std::chrono::milliseconds wait);

 private:
  struct ResetEvidence {
    bool lost = false;            // NVML stopped answering for it since the XID
    bool action_pending = false;  // the driver asked for a reset or reboot since the XID
  };
  void on_xid(const std::string& uuid, unsigned long long xid);
  void probe();
  bool set_health(const std::string& uuid, bool healthy);  // in every set; true when anything changed
  std::map<std::string, bool> gpus() const;                // each GPU's UUID, and whether all of it is healthy

  discovery::Nvml& nvml_;
  std::vector<DeviceSet*> sets_;
  NvmlHealthOptions options_;
  Clock clock_;
  std::chrono::steady_clock::time_point next_probe_;
  std::set<std::string> xid_since_probe_;
  std::map<std::string, ResetEvidence> awaiting_reset_;
};

}  // namespace gpuguard::deviceplugin

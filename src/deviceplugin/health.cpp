#include "gpuguard/deviceplugin/health.hpp"

#include <system_error>

#include "gpuguard/log/log.hpp"

namespace gpuguard::deviceplugin {
namespace {

namespace fs = std::filesystem;

void report(const std::string& id, bool healthy, const std::string& why) {
  if (healthy) log::info("device healthy again", {{"device", id}, {"reason", why}});
  else log::warn("device unhealthy", {{"device", id}, {"reason", why}});
}

}  // namespace

const std::set<unsigned long long> NvmlHealth::kApplicationXids = {13, 31, 43, 45, 68, 109};

std::vector<PresenceCheck> presence_checks(const fs::path& host_root, GpuResource& resource, const std::vector<Gpu>& gpus) {
  std::vector<PresenceCheck> checks;
  for (const Gpu& gpu : gpus) {
    checks.push_back({&resource.devices(), gpu.uuid,
                      {host_path(host_root, "/dev/nvidia" + std::to_string(gpu.minor)),
                       host_path(host_root, "/proc/driver/nvidia/gpus/" + gpu.pci_address + "/information")}});
  }
  return checks;
}

std::vector<PresenceCheck> presence_checks(const fs::path& host_root, HostDeviceResource& resource) {
  std::vector<PresenceCheck> checks;
  for (const Device& device : resource.devices().snapshot()) {
    checks.push_back({&resource.devices(), device.id, {host_path(host_root, resource.path())}});
  }
  return checks;
}

void run_presence_checks(const std::vector<PresenceCheck>& checks) {
  for (const PresenceCheck& check : checks) {
    std::string missing;
    for (const fs::path& path : check.paths) {
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        missing = path.string();
        break;
      }
    }
    if (check.devices->set_health(check.id, missing.empty())) {
      report(check.id, missing.empty(), missing.empty() ? "device files present" : missing + " is missing");
    }
  }
}

NvmlHealth::NvmlHealth(Nvml& nvml, DeviceSet& devices, std::chrono::milliseconds reprobe_interval)
    : nvml_(nvml),
      devices_(devices),
      reprobe_interval_(reprobe_interval),
      next_probe_(std::chrono::steady_clock::now() + reprobe_interval) {}

void NvmlHealth::step(std::chrono::milliseconds wait) {
  if (const auto event = nvml_.wait_for_xid(wait)) {
    if (kApplicationXids.count(event->xid) != 0) {
      log::info("application XID ignored", {{"device", event->uuid}, {"xid", event->xid}});
    } else if (event->uuid.empty()) {
      // An event NVML could not attribute: every GPU is suspect until the next probe.
      for (const Device& device : devices_.snapshot()) {
        xid_since_probe_.insert(device.id);
        if (devices_.set_health(device.id, false)) report(device.id, false, "XID " + std::to_string(event->xid));
      }
    } else {
      xid_since_probe_.insert(event->uuid);
      if (devices_.set_health(event->uuid, false)) report(event->uuid, false, "XID " + std::to_string(event->xid));
    }
  }
  const auto now = std::chrono::steady_clock::now();
  if (now < next_probe_) return;
  next_probe_ = now + reprobe_interval_;
  for (const Device& device : devices_.snapshot()) {
    if (device.healthy || xid_since_probe_.count(device.id) != 0) continue;
    if (nvml_.responds(device.id) && devices_.set_health(device.id, true)) {
      report(device.id, true, "NVML answers and no XID since the last probe");
    }
  }
  xid_since_probe_.clear();
}

}  // namespace gpuguard::deviceplugin

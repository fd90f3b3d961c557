#include "gpuguard/deviceplugin/health.hpp"

#include <charconv>
#include <system_error>

#include "gpuguard/log/log.hpp"

namespace gpuguard::deviceplugin {

using discovery::Gpu;
using discovery::host_path;
using discovery::Nvml;
namespace {

namespace fs = std::filesystem;

void report(const std::string& id, bool healthy, const std::string& why) {
  if (healthy)
    log::info("device healthy again", {{"device", id}, {"reason", why}});
  else
    log::warn("device unhealthy", {{"device", id}, {"reason", why}});
}

}  // namespace

std::vector<PresenceCheck> presence_checks(const fs::path& host_root, const std::vector<DeviceSet*>& sets,
                                           const std::vector<Gpu>& gpus) {
  std::vector<PresenceCheck> checks;
  for (DeviceSet* set : sets) {
    for (const Gpu& gpu : gpus) {
      checks.push_back({set,
                        gpu.uuid,
                        {host_path(host_root, "/dev/nvidia" + std::to_string(gpu.minor)),
                         host_path(host_root, "/proc/driver/nvidia/gpus/" + gpu.pci_address + "/information")}});
    }
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
    if (check.devices->set_health(check.health_key, missing.empty())) {
      report(check.health_key, missing.empty(), missing.empty() ? "device files present" : missing + " is missing");
    }
  }
}

std::optional<std::set<unsigned long long>> parse_xid_list(std::string_view text, std::string& error) {
  std::set<unsigned long long> xids;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    unsigned long long xid = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), xid);
    if (item.empty() || ec != std::errc{} || end != item.data() + item.size()) {
      error = std::string("\"").append(item).append("\" is not an XID number");
      return std::nullopt;
    }
    xids.insert(xid);
  }
  return xids;
}

NvmlHealth::NvmlHealth(Nvml& nvml, std::vector<DeviceSet*> sets, NvmlHealthOptions options, Clock clock)
    : nvml_(nvml),
      sets_(std::move(sets)),
      options_(std::move(options)),
      clock_(std::move(clock)),
      next_probe_(clock_() + options_.probe_interval) {}

void NvmlHealth::on_xid(const std::string& uuid, unsigned long long xid) {
  xid_since_probe_.insert(uuid);
  std::string why = "XID " + std::to_string(xid);
  if (options_.reset_xids.count(xid) != 0) {
    awaiting_reset_[uuid] = {};
    why += ", which needs a GPU reset before it is used again";
  }
  if (set_health(uuid, false)) report(uuid, false, why);
}

bool NvmlHealth::set_health(const std::string& uuid, bool healthy) {
  bool changed = false;
  for (DeviceSet* set : sets_) changed = set->set_health(uuid, healthy) || changed;
  return changed;
}

std::map<std::string, bool> NvmlHealth::gpus() const {
  std::map<std::string, bool> healthy;
  for (const DeviceSet* set : sets_) {
    for (const Device& device : set->snapshot()) {
      const auto [it, added] = healthy.try_emplace(device.health_key, device.healthy);
      if (!added) it->second = it->second && device.healthy;
    }
  }
  return healthy;
}

void NvmlHealth::step(std::chrono::milliseconds wait) {
  if (const auto event = nvml_.wait_for_xid(wait)) {
    if (options_.ignored_xids.count(event->xid) != 0) {
      log::info("application XID ignored", {{"device", event->uuid}, {"xid", event->xid}});
    } else if (event->uuid.empty()) {
      // An event NVML could not attribute: every GPU is suspect.
      for (const auto& [uuid, healthy] : gpus()) on_xid(uuid, event->xid);
    } else {
      on_xid(event->uuid, event->xid);
    }
  }
  const auto now = clock_();
  if (now < next_probe_) return;
  next_probe_ = now + options_.probe_interval;
  probe();
}

void NvmlHealth::probe() {
  using Action = Nvml::RecoveryAction;
  for (const auto& [uuid, healthy] : gpus()) {
    const bool answers = nvml_.responds(uuid);
    if (const auto awaiting = awaiting_reset_.find(uuid); awaiting != awaiting_reset_.end()) {
      ResetEvidence& evidence = awaiting->second;
      const auto action = answers ? nvml_.recovery_action(uuid) : std::nullopt;
      evidence.lost = evidence.lost || !answers;
      if (action && *action != Action::none) evidence.action_pending = true;
      const bool reset = answers && (evidence.lost || (evidence.action_pending && action == Action::none));
      if (!reset) continue;
      const char* seen = evidence.lost ? "NVML lost and found it again" : "recovery action back to none";
      awaiting_reset_.erase(awaiting);
      log::info("GPU reset seen", {{"device", uuid}, {"evidence", seen}});
    }
    if (!answers) {
      if (set_health(uuid, false)) report(uuid, false, "NVML no longer answers for it");
    } else if (!healthy && xid_since_probe_.count(uuid) == 0 && set_health(uuid, true)) {
      report(uuid, true, "NVML answers and no XID since the last probe");
    }
  }
  xid_since_probe_.clear();
}

}  // namespace gpuguard::deviceplugin

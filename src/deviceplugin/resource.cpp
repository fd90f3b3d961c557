#include "gpuguard/deviceplugin/resource.hpp"

#include <algorithm>
#include <set>

namespace gpuguard::deviceplugin {

DeviceSet::DeviceSet(std::vector<Device> devices) : devices_(std::move(devices)) {}

Device DeviceSet::as_served(Device device) const {
  if (withheld_.contains(device.health_key)) device.healthy = false;
  return device;
}

std::vector<Device> DeviceSet::snapshot(std::uint64_t* version) const {
  std::lock_guard lock(mutex_);
  if (version != nullptr) *version = version_;
  if (withheld_.empty()) return devices_;
  std::vector<Device> devices;
  devices.reserve(devices_.size());
  for (const Device& device : devices_) devices.push_back(as_served(device));
  return devices;
}

std::optional<Device> DeviceSet::find(const std::string& id) const {
  std::lock_guard lock(mutex_);
  const auto it = std::find_if(devices_.begin(), devices_.end(), [&](const Device& d) { return d.id == id; });
  if (it == devices_.end()) return std::nullopt;
  return as_served(*it);
}

bool DeviceSet::withhold(const std::string& health_key, Hold why, bool withheld) {
  std::lock_guard lock(mutex_);
  const auto bit = static_cast<unsigned>(why);
  const auto held = withheld_.find(health_key);
  const unsigned before = held == withheld_.end() ? 0U : held->second;
  const unsigned after = withheld ? before | bit : before & ~bit;
  if (after == 0) {
    withheld_.erase(health_key);
  } else {
    withheld_[health_key] = after;
  }
  // Served as before while any hold stays: only a key's first hold and its last release change the list.
  const bool changed = (before == 0) != (after == 0);
  if (changed) {
    ++version_;
    changed_.notify_all();
  }
  return changed;
}

bool DeviceSet::set_health(const std::string& health_key, bool healthy) {
  std::lock_guard lock(mutex_);
  bool changed = false;
  for (Device& device : devices_) {
    if (device.health_key != health_key || device.healthy == healthy) continue;
    device.healthy = healthy;
    changed = true;
  }
  if (changed) {
    ++version_;
    changed_.notify_all();
  }
  return changed;
}

bool DeviceSet::replace(std::vector<Device> devices) {
  std::lock_guard lock(mutex_);
  const auto same = [](const Device& a, const Device& b) {
    return a.id == b.id && a.health_key == b.health_key && a.healthy == b.healthy && a.numa_node == b.numa_node &&
           a.order == b.order;
  };
  if (std::equal(devices.begin(), devices.end(), devices_.begin(), devices_.end(), same)) return false;
  devices_ = std::move(devices);
  ++version_;
  changed_.notify_all();
  return true;
}

void DeviceSet::wait_for_change(std::uint64_t seen, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return version_ != seen; });
}

std::optional<std::string> Resource::allocate(const std::vector<std::string>& ids, Allocation& allocation) const {
  std::vector<Device> allocated;
  for (const std::string& id : ids) {
    const auto device = devices_.find(id);
    if (!device) return "unknown device ID \"" + id + "\" for resource " + name_;
    if (!device->healthy) return "device \"" + id + "\" of resource " + name_ + " is unhealthy";
    allocated.push_back(*device);
  }
  if (allocated.empty()) return "no device IDs in the request for resource " + name_;
  if (auto reason = refuse(allocated)) return "invalid request for resource " + name_ + ": " + *reason;
  fill(allocated, allocation);
  return std::nullopt;
}

std::vector<std::string> Resource::preferred(const std::vector<std::string>& available,
                                             const std::vector<std::string>& must_include, std::size_t size) const {
  std::vector<std::string> chosen = must_include;
  if (chosen.size() >= size) return chosen;
  const std::size_t needed = size - chosen.size();

  std::set<std::int64_t> must_nodes;
  bool must_numa_unknown = false;
  for (const std::string& id : must_include) {
    const auto device = devices_.find(id);
    if (device && device->numa_node)
      must_nodes.insert(*device->numa_node);
    else
      must_numa_unknown = true;
  }
  std::vector<Device> candidates;
  for (const std::string& id : available) {
    if (std::find(must_include.begin(), must_include.end(), id) != must_include.end()) continue;
    if (auto device = devices_.find(id); device && device->healthy) candidates.push_back(*device);
  }
  std::sort(candidates.begin(), candidates.end(), [](const Device& a, const Device& b) { return a.order < b.order; });

  auto take = [&](const std::optional<std::int64_t>& node) {
    std::vector<std::string> picked;
    for (const Device& d : candidates) {
      if (picked.size() == needed) break;
      if (!node || d.numa_node == node) picked.push_back(d.id);
    }
    return picked;
  };
  std::vector<std::optional<std::int64_t>> nodes;  // nodes to try, in order of their lowest device
  if (must_nodes.size() == 1 && !must_numa_unknown) {
    nodes.emplace_back(*must_nodes.begin());
  } else if (must_include.empty()) {
    for (const Device& d : candidates) {
      if (d.numa_node && std::find(nodes.begin(), nodes.end(), d.numa_node) == nodes.end())
        nodes.push_back(d.numa_node);
    }
  }
  std::vector<std::string> picked;
  for (const auto& node : nodes) {
    picked = take(node);
    if (picked.size() == needed) break;
  }
  if (picked.size() != needed) picked = take(std::nullopt);  // no single node has room: lowest first
  chosen.insert(chosen.end(), picked.begin(), picked.end());
  return chosen;
}

std::string socket_name(std::string_view resource) {
  std::string name = "gpuguard-";
  for (char c : resource) name += (c == '/' || c == '.') ? '-' : c;
  return name + ".sock";
}

bool is_resource_name(std::string_view name) {
  const std::size_t slash = name.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == name.size() ||
      name.find('/', slash + 1) != std::string_view::npos) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == '_' || c == '/';
  });
}

}  // namespace gpuguard::deviceplugin

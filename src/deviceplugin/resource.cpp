#include "gpuguard/deviceplugin/resource.hpp"

#include <algorithm>
#include <charconv>
#include <set>

namespace gpuguard::deviceplugin {
namespace {

constexpr const char* kVisibleDevices = "NVIDIA_VISIBLE_DEVICES";
constexpr const char* kVolumeMountsRoot = "/var/run/nvidia-container-devices";

void add_device_spec(Allocation& allocation, const std::string& path) {
  allocation.devices.push_back({path, path, "rw"});
}

bool is_resource_name(std::string_view name) {
  const std::size_t slash = name.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == name.size()) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == '_' || c == '/';
  });
}

}  // namespace

DeviceSet::DeviceSet(std::vector<Device> devices) : devices_(std::move(devices)) {}

std::vector<Device> DeviceSet::snapshot(std::uint64_t* version) const {
  std::lock_guard lock(mutex_);
  if (version != nullptr) *version = version_;
  return devices_;
}

std::optional<Device> DeviceSet::find(const std::string& id) const {
  std::lock_guard lock(mutex_);
  const auto it = std::find_if(devices_.begin(), devices_.end(), [&](const Device& d) { return d.id == id; });
  if (it == devices_.end()) return std::nullopt;
  return *it;
}

bool DeviceSet::set_health(const std::string& id, bool healthy) {
  std::lock_guard lock(mutex_);
  const auto it = std::find_if(devices_.begin(), devices_.end(), [&](const Device& d) { return d.id == id; });
  if (it == devices_.end() || it->healthy == healthy) return false;
  it->healthy = healthy;
  ++version_;
  changed_.notify_all();
  return true;
}

void DeviceSet::wait_for_change(std::uint64_t seen, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return version_ != seen; });
}

std::optional<Strategy> parse_strategy(std::string_view name) {
  if (name == "envvar") return Strategy::envvar;
  if (name == "volume-mounts") return Strategy::volume_mounts;
  if (name == "cdi") return Strategy::cdi;
  return std::nullopt;
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

GpuResource::GpuResource(std::string name, const std::vector<Gpu>& gpus, GpuOptions options)
    : Resource(std::move(name),
               [&] {
                 std::vector<Device> devices;
                 devices.reserve(gpus.size());
                 for (const Gpu& gpu : gpus) devices.push_back({gpu.uuid, true, gpu.numa_node, gpu.minor});
                 return devices;
               }()),
      options_(std::move(options)) {}

void GpuResource::fill(const std::vector<Device>& allocated, Allocation& allocation) const {
  std::string uuids;
  for (const Device& d : allocated) uuids += (uuids.empty() ? "" : ",") + d.id;
  switch (options_.strategy) {
    case Strategy::envvar: allocation.envs[kVisibleDevices] = uuids; break;
    case Strategy::volume_mounts:
      allocation.envs[kVisibleDevices] = kVolumeMountsRoot;
      for (const Device& d : allocated) {
        allocation.mounts.push_back({std::string(kVolumeMountsRoot) + "/" + d.id, "/dev/null", true});
      }
      break;
    case Strategy::cdi:
      for (const Device& d : allocated) allocation.cdi_devices.push_back("nvidia.com/gpu=" + d.id);
      break;
  }
  if (options_.pass_device_specs) {
    for (const Device& d : allocated) add_device_spec(allocation, "/dev/nvidia" + std::to_string(d.order));
    for (const std::string& node : options_.control_nodes) add_device_spec(allocation, node);
  }
}

std::optional<HostDevice> parse_host_device(std::string_view flag, std::string& error) {
  const std::size_t equals = flag.find('=');
  if (equals == std::string_view::npos) {
    error = "--host-device \"" + std::string(flag) + "\" is not RESOURCE=PATH[:SLOTS]";
    return std::nullopt;
  }
  HostDevice device;
  device.resource = std::string(flag.substr(0, equals));
  std::string_view rest = flag.substr(equals + 1);
  if (const std::size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    const std::string_view slots = rest.substr(colon + 1);
    const auto [end, ec] = std::from_chars(slots.data(), slots.data() + slots.size(), device.slots);
    if (ec != std::errc{} || end != slots.data() + slots.size() || device.slots < 1 || device.slots > 1000) {
      error = "--host-device \"" + std::string(flag) + "\": SLOTS must be a number from 1 to 1000";
      return std::nullopt;
    }
    rest = rest.substr(0, colon);
  }
  device.path = std::string(rest);
  if (!is_resource_name(device.resource)) {
    error = "--host-device \"" + std::string(flag) + "\": RESOURCE must look like example.com/name";
    return std::nullopt;
  }
  if (device.path.size() < 2 || device.path.front() != '/') {
    error = "--host-device \"" + std::string(flag) + "\": PATH must be an absolute path such as /dev/fuse";
    return std::nullopt;
  }
  return device;
}

HostDeviceResource::HostDeviceResource(const HostDevice& device)
    : Resource(device.resource,
               [&] {
                 const std::string base = std::filesystem::path(device.path).filename().string();
                 std::vector<Device> devices;
                 for (unsigned slot = 0; slot < device.slots; ++slot) {
                   devices.push_back({base + "-" + std::to_string(slot), true, std::nullopt, slot});
                 }
                 return devices;
               }()),
      path_(device.path) {}

void HostDeviceResource::fill(const std::vector<Device>&, Allocation& allocation) const {
  add_device_spec(allocation, path_);  // however many slots: the container needs the node once
}

std::string socket_name(std::string_view resource) {
  std::string name = "gpuguard-";
  for (char c : resource) name += (c == '/' || c == '.') ? '-' : c;
  return name + ".sock";
}

}  // namespace gpuguard::deviceplugin

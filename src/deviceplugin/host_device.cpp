#include "gpuguard/deviceplugin/host_device.hpp"

#include <glob.h>

#include <algorithm>
#include <charconv>

#include "gpuguard/log/log.hpp"

namespace gpuguard::deviceplugin {
namespace {

namespace fs = std::filesystem;

bool has_wildcard(std::string_view pattern) { return pattern.find_first_of("*?[") != std::string_view::npos; }

// A device's ID from its path: /dev/ttyUSB0 -> ttyUSB0, /dev/dri/renderD128 -> dri_renderD128.
std::string id_for(std::string_view path) {
  if (path.starts_with("/dev/")) path.remove_prefix(5);
  std::string id(path);
  std::replace(id.begin(), id.end(), '/', '_');
  return id;
}

}  // namespace

std::optional<std::string> check_host_device(const HostDevice& device) {
  if (!is_resource_name(device.resource)) return "RESOURCE must look like example.com/name";
  if (device.patterns.empty()) return "at least one path is needed";
  for (const std::string& pattern : device.patterns) {
    if (pattern.size() < 2 || pattern.front() != '/') {
      return "\"" + pattern + "\" is not an absolute path such as /dev/fuse or /dev/ttyUSB*";
    }
    if (pattern.find("/../") != std::string::npos || pattern.ends_with("/..")) {
      return "\"" + pattern + "\" must not contain \"..\"";
    }
  }
  if (device.slots < 1 || device.slots > 1000) return "SLOTS must be a number from 1 to 1000";
  return std::nullopt;
}

std::optional<HostDevice> parse_host_device(std::string_view flag, std::string& error) {
  const std::string quoted = "--host-device \"" + std::string(flag) + "\"";
  const std::size_t equals = flag.find('=');
  if (equals == std::string_view::npos) {
    error = quoted + " is not RESOURCE=PATH[,PATH...][:SLOTS]";
    return std::nullopt;
  }
  HostDevice device;
  device.resource = std::string(flag.substr(0, equals));
  std::string_view rest = flag.substr(equals + 1);
  if (const std::size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    const std::string_view slots = rest.substr(colon + 1);
    const auto [end, ec] = std::from_chars(slots.data(), slots.data() + slots.size(), device.slots);
    if (ec != std::errc{} || end != slots.data() + slots.size()) device.slots = 0;
    rest = rest.substr(0, colon);
  }
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    device.patterns.emplace_back(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  if (auto reason = check_host_device(device)) {
    error = quoted + ": " + *reason;
    return std::nullopt;
  }
  return device;
}

std::vector<std::string> match_host_paths(const fs::path& host_root, const std::string& pattern) {
  const std::string root = host_root.lexically_normal().string();
  const std::string prefix = root.ends_with('/') ? root.substr(0, root.size() - 1) : root;
  glob_t found{};
  std::vector<std::string> paths;
  if (::glob((prefix + pattern).c_str(), GLOB_NOSORT, nullptr, &found) == 0) {
    for (std::size_t i = 0; i < found.gl_pathc; ++i) paths.emplace_back(found.gl_pathv[i] + prefix.size());
  }
  ::globfree(&found);
  std::sort(paths.begin(), paths.end());
  return paths;
}

HostDeviceResource::HostDeviceResource(HostDevice device, fs::path host_root)
    : Resource(device.resource, {}),
      device_(std::move(device)),
      host_root_(std::move(host_root)),
      one_per_match_(device_.patterns.size() == 1 && has_wildcard(device_.patterns.front())) {
  if (one_per_match_) {
    devices().replace(devices_for(match_host_paths(host_root_, device_.patterns.front())));
  } else {
    devices().replace(devices_for({}));
  }
}

std::vector<Device> HostDeviceResource::devices_for(const std::vector<std::string>& matches) const {
  std::vector<Device> devices;
  const auto add_slots = [&](const std::string& base, const std::string& health_key, unsigned first_order) {
    for (unsigned slot = 0; slot < device_.slots; ++slot) {
      const std::string id = one_per_match_ && device_.slots == 1 ? base : base + "-" + std::to_string(slot);
      devices.push_back({id, health_key, true, std::nullopt, first_order + slot});
    }
  };
  if (one_per_match_) {
    for (std::size_t i = 0; i < matches.size(); ++i) {
      add_slots(id_for(matches[i]), matches[i], static_cast<unsigned>(i * device_.slots));
    }
  } else {
    add_slots(device_.resource.substr(device_.resource.find('/') + 1), device_.resource, 0);
  }
  return devices;
}

void HostDeviceResource::rescan() {
  if (one_per_match_) {
    const auto matches = match_host_paths(host_root_, device_.patterns.front());
    if (devices().replace(devices_for(matches))) {
      log::info("host devices changed", {{"resource", name()}, {"paths", matches}});
    }
    return;
  }
  std::string missing;
  for (const std::string& pattern : device_.patterns) {
    if (match_host_paths(host_root_, pattern).empty()) {
      missing = pattern;
      break;
    }
  }
  if (devices().set_health(device_.resource, missing.empty())) {
    if (missing.empty()) {
      log::info("device healthy again", {{"resource", name()}, {"reason", "device files present"}});
    } else {
      log::warn("device unhealthy", {{"resource", name()}, {"reason", missing + " matches nothing"}});
    }
  }
}

void HostDeviceResource::fill(const std::vector<Device>& allocated, Allocation& allocation) const {
  std::vector<std::string> paths;
  if (one_per_match_) {
    for (const Device& device : allocated) {
      if (std::find(paths.begin(), paths.end(), device.health_key) == paths.end()) paths.push_back(device.health_key);
    }
  } else {
    for (const std::string& pattern : device_.patterns) {  // however many slots: each path once
      for (std::string& path : match_host_paths(host_root_, pattern)) paths.push_back(std::move(path));
    }
  }
  for (const std::string& path : paths) allocation.devices.push_back({path, path, "rw"});
}

}  // namespace gpuguard::deviceplugin

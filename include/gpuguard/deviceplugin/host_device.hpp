#pragma once
// Host devices such as /dev/fuse or /dev/ttyUSB*, served as countable resources so that pods need not be
// privileged to use them.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/deviceplugin/resource.hpp"

namespace gpuguard::deviceplugin {

// --host-device RESOURCE=PATTERN[,PATTERN...][:SLOTS]. One pattern with a wildcard (* ? [) is one device
// per path it matches; otherwise the patterns are a group: one device of every path they match. Either
// way each device has SLOTS interchangeable slots (containers that share it).
struct HostDevice {
  std::string resource;
  std::vector<std::string> patterns;
  unsigned slots = 1;
};
// Returns the reason when the resource name, a pattern (absolute, no "..") or the slots (1..1000) are bad.
std::optional<std::string> check_host_device(const HostDevice& device);
std::optional<HostDevice> parse_host_device(std::string_view flag, std::string& error);

// The host paths a pattern matches under the host root, sorted; a pattern without wildcards matches
// itself when it exists.
std::vector<std::string> match_host_paths(const std::filesystem::path& host_root, const std::string& pattern);

class HostDeviceResource final : public Resource {
 public:
  HostDeviceResource(HostDevice device, std::filesystem::path host_root);
  // One device per match: the list follows the paths as they come and go. A group: healthy while every
  // pattern matches. Logs each change.
  void rescan();
  bool one_per_match() const { return one_per_match_; }

 private:
  void fill(const std::vector<Device>& allocated, Allocation& allocation) const override;
  std::vector<Device> devices_for(const std::vector<std::string>& matches) const;

  HostDevice device_;
  std::filesystem::path host_root_;
  bool one_per_match_;
};

}  // namespace gpuguard::deviceplugin

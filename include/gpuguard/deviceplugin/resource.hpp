#pragma once
// What the plugin serves for each extended resource: its devices with their health, and how a container
// gets the devices it was allocated. Free of gRPC servers and threads, so it is tested directly.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <map>

#include "gpuguard/deviceplugin/discovery.hpp"

namespace gpuguard::deviceplugin {

struct Device {
  std::string id;
  bool healthy = true;
  std::optional<std::int64_t> numa_node;
  unsigned order = 0;  // minor number, or slot index: lower is preferred
};

// The device list of one resource. ListAndWatch streams wait on it for changes.
class DeviceSet {
 public:
  explicit DeviceSet(std::vector<Device> devices);
  std::vector<Device> snapshot(std::uint64_t* version = nullptr) const;
  std::optional<Device> find(const std::string& id) const;
  bool set_health(const std::string& id, bool healthy);  // true when it changed
  // Returns when the list changed since `seen`, or after `timeout`.
  void wait_for_change(std::uint64_t seen, std::chrono::milliseconds timeout) const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::vector<Device> devices_;
  std::uint64_t version_ = 1;
};

// What a container is given for its devices: the fields of the kubelet's ContainerAllocateResponse,
// without the generated protobuf type (the gRPC layer, plugin_server.cpp, translates).
struct Allocation {
  struct Mount {
    std::string container_path, host_path;
    bool read_only = false;
  };
  struct DeviceSpec {
    std::string container_path, host_path, permissions;
  };
  std::map<std::string, std::string> envs;
  std::vector<Mount> mounts;
  std::vector<DeviceSpec> devices;
  std::vector<std::string> cdi_devices;  // fully qualified CDI names, e.g. nvidia.com/gpu=GPU-…
};

enum class Strategy { envvar, volume_mounts, cdi };
std::optional<Strategy> parse_strategy(std::string_view name);

class Resource {
 public:
  Resource(std::string name, std::vector<Device> devices) : name_(std::move(name)), devices_(std::move(devices)) {}
  virtual ~Resource() = default;

  const std::string& name() const { return name_; }
  DeviceSet& devices() { return devices_; }
  const DeviceSet& devices() const { return devices_; }

  // The response for one container. An unknown or unhealthy ID is refused with a message naming it.
  std::optional<std::string> allocate(const std::vector<std::string>& ids, Allocation& allocation) const;

  // must_include first, then devices on one NUMA node when possible, then lowest order.
  std::vector<std::string> preferred(const std::vector<std::string>& available,
                                     const std::vector<std::string>& must_include, std::size_t size) const;

 private:
  virtual void fill(const std::vector<Device>& allocated, Allocation& allocation) const = 0;

  std::string name_;
  DeviceSet devices_;
};

struct GpuOptions {
  Strategy strategy = Strategy::envvar;
  bool pass_device_specs = false;
  std::vector<std::string> control_nodes;  // host paths of /dev/nvidiactl etc. that exist
};

class GpuResource final : public Resource {
 public:
  GpuResource(std::string name, const std::vector<Gpu>& gpus, GpuOptions options);

 private:
  void fill(const std::vector<Device>& allocated, Allocation& allocation) const override;
  GpuOptions options_;
};

// --host-device RESOURCE=PATH[:SLOTS]: SLOTS interchangeable devices that all pass PATH to the container.
struct HostDevice {
  std::string resource;
  std::string path;
  unsigned slots = 1;
};
// Returns the reason when `flag` is not RESOURCE=PATH[:SLOTS] with an absolute PATH and 1..1000 slots.
std::optional<HostDevice> parse_host_device(std::string_view flag, std::string& error);

class HostDeviceResource final : public Resource {
 public:
  explicit HostDeviceResource(const HostDevice& device);
  const std::string& path() const { return path_; }

 private:
  void fill(const std::vector<Device>& allocated, Allocation& allocation) const override;
  std::string path_;
};

// The kubelet's endpoint name for a resource: a socket file in the plugin directory.
std::string socket_name(std::string_view resource);

}  // namespace gpuguard::deviceplugin

#pragma once
// What the plugin serves for each extended resource: its devices with their health, and how a container
// gets the devices it was allocated. Free of gRPC servers and threads, so it is tested directly. The GPU
// resources are in gpu_resource.hpp, host devices in host_device.hpp.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::deviceplugin {

struct Device {
  std::string id;  // as the kubelet sees it: a UUID, "<uuid>::<n>" for a time-sliced replica, a host device
  // Devices with one key share their health: a GPU's UUID for the GPU, its replicas and its MIG devices;
  // a host path for the devices it backs.
  std::string health_key;
  bool healthy = true;
  std::optional<std::int64_t> numa_node;
  unsigned order = 0;  // lower is preferred
};

// Why a GPU's devices are withheld, besides their own health; each hold is set and released on its own.
enum class Hold : unsigned {
  mps_daemon = 1,        // an MPS replica, until its GPU's daemon is ready
  unchecked = 2,         // until the kubelet has said which GPUs other plugins serve (served_elsewhere.hpp)
  served_elsewhere = 4,  // another plugin serves the GPU: for the life of the process
};

// The device list of one resource. ListAndWatch streams wait on it for changes.
class DeviceSet {
 public:
  explicit DeviceSet(std::vector<Device> devices);
  std::vector<Device> snapshot(std::uint64_t* version = nullptr) const;
  std::optional<Device> find(const std::string& id) const;
  // Sets the health of every device with this key; true when any changed.
  bool set_health(const std::string& health_key, bool healthy);
  // Withholds every device with this key, healthy or not, for one reason: served as Unhealthy until every
  // hold on it is released. For what a device needs besides its own health (an MPS replica, its GPU's
  // daemon; a GPU no other plugin serves), kept apart so that no check undoes another. True when what is
  // served changed (a key's first hold, or its last release).
  bool withhold(const std::string& health_key, Hold why, bool withheld);
  // A new list, for devices that come and go; true when it differs from the current one.
  bool replace(std::vector<Device> devices);
  // Returns when the list changed since `seen`, or after `timeout`.
  void wait_for_change(std::uint64_t seen, std::chrono::milliseconds timeout) const;

 private:
  Device as_served(Device device) const;  // unhealthy while withheld

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::vector<Device> devices_;
  std::map<std::string, unsigned> withheld_;  // health key: its holds (Hold's bits), never 0
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
  std::map<std::string, std::string> annotations;  // the cdi-annotations strategy's
  std::vector<std::string> cdi_devices;            // fully qualified CDI names, e.g. k8s.gpuguard.io/gpu=GPU-…
};

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
  virtual std::vector<std::string> preferred(const std::vector<std::string>& available,
                                             const std::vector<std::string>& must_include, std::size_t size) const;

 private:
  // A reason to refuse a request whose devices all exist and are healthy; none by default.
  virtual std::optional<std::string> refuse(const std::vector<Device>& /*allocated*/) const { return std::nullopt; }
  virtual void fill(const std::vector<Device>& allocated, Allocation& allocation) const = 0;

  std::string name_;
  DeviceSet devices_;
};

// The kubelet's endpoint name for a resource: a socket file in the plugin directory.
std::string socket_name(std::string_view resource);

// example.com/name: a domain, a slash and a name of letters, digits, '.', '-' and '_'.
bool is_resource_name(std::string_view name);

}  // namespace gpuguard::deviceplugin

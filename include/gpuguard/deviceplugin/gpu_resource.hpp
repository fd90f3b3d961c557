#pragma once
// The GPU resources a node advertises: the discovered GPUs cut by the MIG strategy into whole GPUs and
// MIG devices, multiplied into replicas by time-slicing or MPS, and what a container gets for the ones it was
// given. NVIDIA's k8s-device-plugin defines the strategies and the config this follows
// (docs/device-plugin.md says where gpuguard differs).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/deviceplugin/resource.hpp"
#include "gpuguard/discovery/discovery.hpp"

namespace gpuguard::deviceplugin {

// none: whole GPUs, MIG or not. single: every MIG device as the GPU resource (every GPU in MIG mode, all
// devices of one profile). mixed: whole GPUs, and each MIG profile as a resource of its own.
enum class MigStrategy { none, single, mixed };
std::optional<MigStrategy> parse_mig_strategy(std::string_view name);
std::string_view mig_strategy_name(MigStrategy strategy);

// Which devices of a resource a sharing entry shares (NVIDIA's `devices`): all of them, the first `count`
// in index order, or those the references name: a GPU index ("0"), a MIG device's index on its GPU
// ("0:1"), or a GPU-/MIG- UUID. NVIDIA's plugin parses this and then shares every device anyway.
struct SharedDevices {
  enum class Kind { all, count, list };
  Kind kind = Kind::all;
  unsigned count = 0;
  std::vector<std::string> refs;
};

// NVIDIA's sharing.timeSlicing or sharing.mps (a file sets one of them): each chosen device of a resource
// advertised `replicas` times as <id>::<n>. Under MPS a GPU's replicas are the clients of one MPS control
// daemon, started for that GPU alone by `gpuguard-device-plugin mps-control`.
enum class SharingStrategy { time_slicing, mps };
struct Sharing {
  struct Resource {
    std::string name;    // the resource to share: nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...
    std::string rename;  // the name to advertise the replicas under; empty: see rename_by_default
    unsigned replicas = 2;
    SharedDevices devices{};
    std::string key{};  // where the config file set it ("sharing.timeSlicing.resources[0]"), for messages
  };
  SharingStrategy strategy = SharingStrategy::time_slicing;
  bool rename_by_default = false;  // a resource without a rename is advertised as <name>.shared
  bool fail_requests_greater_than_one = false;
  std::vector<Resource> resources;
};
// "sharing.timeSlicing" or "sharing.mps": the config file's key, for messages.
std::string_view sharing_key(SharingStrategy strategy);
// MPS serves at most 48 clients per GPU (16 before Volta); a GPU's replicas are its clients.
inline constexpr unsigned kMpsMaxClients = 48;

// What a container can be given: a whole GPU, or one MIG device.
struct GpuUnit {
  std::string uuid;      // GPU-… or MIG-…: what NVIDIA_VISIBLE_DEVICES and the CDI spec name
  std::string gpu_uuid;  // the physical GPU, whose health it shares
  std::optional<std::int64_t> numa_node;
  std::vector<std::string> device_nodes;      // /dev/nvidia<minor>; a MIG device adds its two nvidia-cap nodes
  std::optional<std::uint64_t> memory_bytes;  // the GPU's memory, where NVML says (MPS's memory limits)
};

struct GpuResourcePlan {
  std::string name;
  std::vector<GpuUnit> units;
  unsigned replicas = 1;
  bool fail_requests_greater_than_one = false;
  bool mps = false;  // the replicas are MPS clients
};

struct GpuPlan {
  std::vector<GpuResourcePlan> resources;
  // The labels NVIDIA's GPU feature discovery gives the node for them, keyed as GFD keys them, by each
  // resource's name before a rename: <name>.replicas (1 unshared), <name>.sharing-strategy (time-slicing,
  // mps or none) and <name>.product (the model, "-MIG-<profile>" for MIG devices, "-SHARED" where replicas
  // keep the resource's own name), characters GFD drops dropped.
  std::map<std::string, std::string> labels;
  std::vector<std::string> warnings;  // logged at start
  std::optional<std::string> error;   // the GPUs do not fit the strategy: the plugin does not start
  // The error is the sharing config's (a device it names is not on this node): the plugin stops even
  // without --fail-on-init-error, since serving the GPUs unshared is not what the file asks for.
  bool sharing_error = false;
};

// `resource_name` names whole GPUs, and every MIG device under single; under mixed each MIG profile is
// <domain of resource_name>/mig-<profile>, '+' written '.' (nvidia.com/mig-1g.10gb.me). A time-slicing
// entry (time-slicing or MPS) that shares only some devices of a resource must rename them: the others keep the
// resource's name, so whole devices and replicas never stand under one name. A GPU's index is its place in `gpus` (the
// discovery's order, by minor number); a MIG device's, its place in its GPU's list.
GpuPlan plan_gpu_resources(const std::vector<discovery::Gpu>& gpus, MigStrategy strategy,
                           const std::string& resource_name, const Sharing& sharing);

// How Allocate names the devices (NVIDIA's deviceListStrategy). envvar and volume-mounts are read by the
// NVIDIA container toolkit; the CDI ones by a CDI-enabled runtime, from the spec the plugin writes.
enum class Strategy { envvar, volume_mounts, cdi_cri, cdi_annotations };

// The container annotation every GPU allocation carries, the allocated GPUs' UUIDs comma-separated, for
// gpuguard-node-enforcer (its src/enforcement/allocation.cpp reads the same key).
inline constexpr const char* kAllocatedGpusAnnotation = "gpuguard.io/allocated-gpus";
// "envvar", "volume-mounts", "cdi-cri" (also "cdi"), "cdi-annotations"
std::optional<Strategy> parse_strategy(std::string_view name);
std::string_view strategy_name(Strategy strategy);
// A list as a whole: not empty, no repeats, and not both envvar and volume-mounts (each sets
// NVIDIA_VISIBLE_DEVICES). Returns the reason.
std::optional<std::string> check_strategies(const std::vector<Strategy>& strategies);

// Which replicas GetPreferredAllocation offers (NVIDIA's sharedDevicesAllocationPolicy): those of the
// least used GPUs (distributed), or of the most used ones that still have room (packed).
enum class SharedAllocation { distributed, packed };
std::optional<SharedAllocation> parse_shared_allocation(std::string_view name);

struct GpuOptions {
  std::vector<Strategy> strategies = {Strategy::envvar};
  bool pass_device_specs = false;
  std::vector<std::string> control_nodes;  // host paths of /dev/nvidiactl etc. that exist
  std::string cdi_kind = "k8s.gpuguard.io/gpu";
  std::string cdi_annotation_prefix = "cdi.k8s.io/";
  SharedAllocation shared_allocation = SharedAllocation::distributed;
  // On the host: each MPS GPU's directory, <mps_root>/<uuid>/, holds its daemon's pipe, log and shm
  // directories and its readiness file (mps.hpp).
  std::string mps_root = "/run/gpuguard/mps";
};

class GpuResource final : public Resource {
 public:
  GpuResource(const GpuResourcePlan& plan, GpuOptions options);
  const std::vector<GpuUnit>& units() const { return units_; }
  unsigned replicas() const { return replicas_; }
  bool mps() const { return mps_; }

  // Replicas: spread over the GPUs or packed (GpuOptions::shared_allocation); whole devices: by NUMA node.
  std::vector<std::string> preferred(const std::vector<std::string>& available,
                                     const std::vector<std::string>& must_include, std::size_t size) const override;

 private:
  std::optional<std::string> refuse(const std::vector<Device>& allocated) const override;
  void fill(const std::vector<Device>& allocated, Allocation& allocation) const override;
  void fill_mps(const std::vector<Device>& allocated, const GpuUnit& unit, Allocation& allocation) const;
  const GpuUnit& unit_of(const std::string& id) const;

  std::vector<GpuUnit> units_;
  unsigned replicas_;
  bool fail_requests_greater_than_one_;
  bool mps_;
  GpuOptions options_;
};

// The device ID of replica `n` of a unit, and the unit's UUID back from any device ID.
std::string replica_id(std::string_view uuid, unsigned n);
std::string_view unit_uuid(std::string_view device_id);

// A CDI device name for a UUID: CDI allows letters, digits and "_-.:"; anything else becomes '_'.
std::string cdi_device_name(std::string_view uuid);

}  // namespace gpuguard::deviceplugin

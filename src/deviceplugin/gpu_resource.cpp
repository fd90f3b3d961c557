#include "gpuguard/deviceplugin/gpu_resource.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <set>

#include "gpuguard/deviceplugin/mps.hpp"

namespace gpuguard::deviceplugin {

using discovery::Gpu;
using discovery::MigDevice;
namespace {

constexpr const char* kVisibleDevices = "NVIDIA_VISIBLE_DEVICES";
constexpr const char* kVolumeMountsRoot = "/var/run/nvidia-container-devices";
constexpr std::string_view kReplicaSeparator = "::";

GpuUnit whole(const Gpu& gpu) {
  return {gpu.uuid, gpu.uuid, gpu.numa_node, {"/dev/nvidia" + std::to_string(gpu.minor)}, gpu.memory_bytes};
}

GpuUnit part(const Gpu& gpu, const MigDevice& mig) {
  GpuUnit unit{mig.uuid, gpu.uuid, gpu.numa_node, {"/dev/nvidia" + std::to_string(gpu.minor)}, {}};
  for (const unsigned minor : mig.cap_minors) {
    unit.device_nodes.push_back("/dev/nvidia-caps/nvidia-cap" + std::to_string(minor));
  }
  return unit;
}

// nvidia.com/gpu -> nvidia.com/mig-1g.10gb.me
std::string mig_resource_name(const std::string& resource_name, const std::string& profile) {
  std::string name = resource_name.substr(0, resource_name.find('/')) + "/mig-" + profile;
  std::replace(name.begin(), name.end(), '+', '.');
  return name;
}

std::optional<std::string> plan_mig(const std::vector<Gpu>& gpus, MigStrategy strategy,
                                    const std::string& resource_name, GpuPlan& plan) {
  const auto in_mig_mode = [](const Gpu& gpu) { return gpu.mig_enabled; };
  GpuResourcePlan whole_gpus{resource_name, {}, 1, false};
  if (strategy == MigStrategy::none || std::none_of(gpus.begin(), gpus.end(), in_mig_mode)) {
    for (const Gpu& gpu : gpus) {
      whole_gpus.units.push_back(whole(gpu));
      if (gpu.mig_enabled) {
        plan.warnings.push_back("GPU " + gpu.uuid +
                                " is in MIG mode: --mig-strategy none advertises it whole, as NVIDIA's plugin does; "
                                "single or mixed advertise its MIG devices");
      }
    }
    plan.resources.push_back(std::move(whole_gpus));
    return std::nullopt;
  }
  const std::string flag = strategy == MigStrategy::single ? "--mig-strategy single" : "--mig-strategy mixed";
  for (const Gpu& gpu : gpus) {
    if (gpu.mig_enabled && !gpu.mig_listed) {
      return flag + " needs NVML to list MIG devices: procfs shows MIG instances on GPU " + gpu.uuid +
             " but neither their UUIDs nor their profiles";
    }
  }
  if (strategy == MigStrategy::single) {
    const auto other = std::find_if_not(gpus.begin(), gpus.end(), in_mig_mode);
    const auto mig = std::find_if(gpus.begin(), gpus.end(), in_mig_mode);
    if (other != gpus.end()) {
      return flag + ": GPU " + mig->uuid + " is in MIG mode and GPU " + other->uuid +
             " is not; every GPU must be, or use mixed";
    }
    std::set<std::string> profiles;
    GpuResourcePlan migs{resource_name, {}, 1, false};
    for (const Gpu& gpu : gpus) {
      if (gpu.mig_devices.empty()) return flag + ": GPU " + gpu.uuid + " is in MIG mode with no MIG devices";
      for (const MigDevice& device : gpu.mig_devices) {
        profiles.insert(device.profile);
        migs.units.push_back(part(gpu, device));
      }
    }
    if (profiles.size() > 1) {
      std::string list;
      for (const std::string& profile : profiles) list += (list.empty() ? "" : ", ") + profile;
      return flag + ": MIG devices of more than one profile (" + list +
             "); every MIG device must have the same profile, or use mixed";
    }
    plan.resources.push_back(std::move(migs));
    return std::nullopt;
  }
  std::map<std::string, GpuResourcePlan> by_profile;
  for (const Gpu& gpu : gpus) {
    if (!gpu.mig_enabled) {
      whole_gpus.units.push_back(whole(gpu));
      continue;
    }
    if (gpu.mig_devices.empty()) {
      plan.warnings.push_back("GPU " + gpu.uuid + " is in MIG mode with no MIG devices: nothing of it is advertised");
    }
    for (const MigDevice& device : gpu.mig_devices) {
      const std::string name = mig_resource_name(resource_name, device.profile);
      auto& resource = by_profile.try_emplace(name, GpuResourcePlan{name, {}, 1, false}).first->second;
      resource.units.push_back(part(gpu, device));
    }
  }
  if (!whole_gpus.units.empty()) plan.resources.push_back(std::move(whole_gpus));
  for (auto& [name, resource] : by_profile) plan.resources.push_back(std::move(resource));
  return std::nullopt;
}

// GPU feature discovery's product label: what is not a letter, digit, '-', '_', '.' or space dropped,
// blanks joined by '-'; cut to a label value's 63 characters (room left for "-SHARED") ending alphanumeric.
std::string product_label(const std::string& product) {
  std::string words;
  for (const char c : product) {
    if (std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_' || c == '.' || c == ' ') words += c;
  }
  std::string label;
  std::size_t start = 0;
  while (start < words.size()) {
    const std::size_t end = std::min(words.find(' ', start), words.size());
    if (end > start) label.append(label.empty() ? "" : "-").append(words, start, end - start);
    start = end + 1;
  }
  constexpr std::size_t kRoom = 63 - std::string_view("-SHARED").size();
  if (label.size() > kRoom) label.resize(kRoom);
  while (!label.empty() && std::isalnum(static_cast<unsigned char>(label.back())) == 0) label.pop_back();
  return label;
}

// The labels of each resource as planned before sharing: one replica, no strategy, the product of its first
// device (a MIG resource's devices share a profile, and GFD too labels by one device).
void label_unshared(const std::vector<Gpu>& gpus, GpuPlan& plan) {
  for (const GpuResourcePlan& resource : plan.resources) {
    if (resource.units.empty()) continue;
    const GpuUnit& unit = resource.units.front();
    std::string product;
    for (const Gpu& gpu : gpus) {
      if (gpu.uuid != unit.gpu_uuid) continue;
      product = gpu.model;
      for (const MigDevice& mig : gpu.mig_devices) {
        if (mig.uuid == unit.uuid) product.append("-MIG-").append(mig.profile);
      }
    }
    plan.labels[resource.name + ".replicas"] = "1";
    plan.labels[resource.name + ".sharing-strategy"] = "none";
    plan.labels[resource.name + ".product"] = product_label(product);
  }
}

// A whole number and nothing else (from_chars takes no sign for an unsigned type).
std::optional<std::size_t> index_of(std::string_view digits) {
  std::size_t index = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return index;
}

// Where the config file set a sharing entry, for messages; a Sharing made in code has no key.
std::string key_of(const Sharing& sharing, const Sharing::Resource& shared) {
  return shared.key.empty() ? std::string(sharing_key(sharing.strategy)) : shared.key;
}

// The UUID a device reference names on this node: itself for a UUID, the GPU at an index, the MIG device
// at "g:m"; nullopt when this node has no such index.
std::optional<std::string> referenced_uuid(const std::string& ref, const std::vector<Gpu>& gpus) {
  if (ref.starts_with("GPU-") || ref.starts_with("MIG-")) return ref;
  const std::size_t colon = ref.find(':');
  const auto gpu = index_of(std::string_view(ref).substr(0, colon));
  if (!gpu || *gpu >= gpus.size()) return std::nullopt;
  if (colon == std::string::npos) return gpus[*gpu].uuid;
  const auto mig = index_of(std::string_view(ref).substr(colon + 1));
  if (!mig || *mig >= gpus[*gpu].mig_devices.size()) return std::nullopt;
  return gpus[*gpu].mig_devices[*mig].uuid;
}

// The units of `resource` that `devices` chooses, in the resource's order, or why it cannot.
std::vector<GpuUnit> chosen_units(const Sharing& sharing, const Sharing::Resource& shared,
                                  const GpuResourcePlan& resource, const std::vector<Gpu>& gpus, std::string& error) {
  const SharedDevices& devices = shared.devices;
  const std::string at = key_of(sharing, shared);
  if (devices.kind == SharedDevices::Kind::all) return resource.units;
  if (devices.kind == SharedDevices::Kind::count) {
    if (devices.count > resource.units.size()) {
      error = at + ".devices: shares " + std::to_string(devices.count) + " devices of " + resource.name +
              ", but this node has " + std::to_string(resource.units.size());
      return {};
    }
    return {resource.units.begin(), resource.units.begin() + devices.count};
  }
  std::set<std::string> named;
  for (std::size_t i = 0; i < devices.refs.size(); ++i) {
    const std::string& ref = devices.refs[i];
    const std::string field = at + ".devices[" + std::to_string(i) + "]";
    const auto uuid = referenced_uuid(ref, gpus);
    const bool listed = uuid && std::any_of(resource.units.begin(), resource.units.end(),
                                            [&](const GpuUnit& unit) { return unit.uuid == *uuid; });
    if (!listed) {
      error = field;
      error.append(": ").append(resource.name).append(" has no device \"").append(ref).append("\" on this node");
      return {};
    }
    if (!named.insert(*uuid).second) {
      error = field;
      error.append(": \"").append(ref).append("\" names ").append(*uuid).append(", which an earlier entry names too");
      return {};
    }
  }
  std::vector<GpuUnit> chosen;
  for (const GpuUnit& unit : resource.units) {
    if (named.contains(unit.uuid)) chosen.push_back(unit);
  }
  return chosen;
}

std::optional<std::string> share(const Sharing& sharing, const std::vector<Gpu>& gpus, GpuPlan& plan) {
  const std::string_view section = sharing_key(sharing.strategy);
  const bool mps = sharing.strategy == SharingStrategy::mps;
  for (const Sharing::Resource& shared : sharing.resources) {
    const auto resource = std::find_if(plan.resources.begin(), plan.resources.end(),
                                       [&](const GpuResourcePlan& r) { return r.name == shared.name; });
    if (resource == plan.resources.end()) {
      plan.warnings.push_back(std::string(section) + ": this node has no " + shared.name + " to share");
      continue;
    }
    std::string error;
    std::vector<GpuUnit> chosen = chosen_units(sharing, shared, *resource, gpus, error);
    if (!error.empty()) return error;
    if (mps) {
      // One MPS daemon serves a whole GPU; NVIDIA's MPS does not run on MIG devices.
      const auto mig =
          std::find_if(chosen.begin(), chosen.end(), [](const GpuUnit& unit) { return unit.uuid != unit.gpu_uuid; });
      if (mig != chosen.end()) {
        return key_of(sharing, shared) + ": MPS does not share MIG devices, and " + shared.name + " has " + mig->uuid;
      }
    }
    std::string name = shared.name;
    if (!shared.rename.empty()) {
      name = shared.rename;
    } else if (sharing.rename_by_default) {
      name += ".shared";
    }
    const bool some = chosen.size() < resource->units.size();
    if (some && name == shared.name) {
      return key_of(sharing, shared) + ": shares " + std::to_string(chosen.size()) + " of the " +
             std::to_string(resource->units.size()) + " devices of " + shared.name +
             ", so it needs a rename (or renameByDefault): whole devices and replicas never stand under one name";
    }
    // GFD's labels stay under the name the resource had; "-SHARED" only where its replicas keep that name.
    plan.labels[shared.name + ".replicas"] = std::to_string(shared.replicas);
    plan.labels[shared.name + ".sharing-strategy"] = mps ? "mps" : "time-slicing";
    if (name == shared.name) plan.labels[shared.name + ".product"].append("-SHARED");
    GpuResourcePlan replicas{name, std::move(chosen), shared.replicas, sharing.fail_requests_greater_than_one, mps};
    if (some) {
      std::erase_if(resource->units, [&](const GpuUnit& unit) {
        return std::any_of(replicas.units.begin(), replicas.units.end(),
                           [&](const GpuUnit& c) { return c.uuid == unit.uuid; });
      });
      plan.resources.push_back(std::move(replicas));
    } else {
      *resource = std::move(replicas);
    }
  }
  std::set<std::string> names;
  for (const GpuResourcePlan& resource : plan.resources) {
    if (!names.insert(resource.name).second) {
      return std::string(section) + ": " + resource.name + " would name two resources on this node";
    }
  }
  return std::nullopt;
}

}  // namespace

std::string_view sharing_key(SharingStrategy strategy) {
  return strategy == SharingStrategy::mps ? "sharing.mps" : "sharing.timeSlicing";
}

std::optional<MigStrategy> parse_mig_strategy(std::string_view name) {
  if (name == "none") return MigStrategy::none;
  if (name == "single") return MigStrategy::single;
  if (name == "mixed") return MigStrategy::mixed;
  return std::nullopt;
}

std::string_view mig_strategy_name(MigStrategy strategy) {
  switch (strategy) {
    case MigStrategy::none: return "none";
    case MigStrategy::single: return "single";
    case MigStrategy::mixed: break;
  }
  return "mixed";
}

GpuPlan plan_gpu_resources(const std::vector<Gpu>& gpus, MigStrategy strategy, const std::string& resource_name,
                           const Sharing& sharing) {
  GpuPlan plan;
  if (gpus.empty()) return plan;
  plan.error = plan_mig(gpus, strategy, resource_name, plan);
  if (!plan.error) {
    label_unshared(gpus, plan);
    plan.error = share(sharing, gpus, plan);
    plan.sharing_error = plan.error.has_value();
  }
  if (plan.error) {
    plan.resources.clear();
    plan.labels.clear();
  }
  return plan;
}

std::optional<Strategy> parse_strategy(std::string_view name) {
  if (name == "envvar") return Strategy::envvar;
  if (name == "volume-mounts") return Strategy::volume_mounts;
  if (name == "cdi-cri" || name == "cdi") return Strategy::cdi_cri;
  if (name == "cdi-annotations") return Strategy::cdi_annotations;
  return std::nullopt;
}

std::string_view strategy_name(Strategy strategy) {
  switch (strategy) {
    case Strategy::envvar: return "envvar";
    case Strategy::volume_mounts: return "volume-mounts";
    case Strategy::cdi_cri: return "cdi-cri";
    case Strategy::cdi_annotations: break;
  }
  return "cdi-annotations";
}

std::optional<std::string> check_strategies(const std::vector<Strategy>& strategies) {
  if (strategies.empty()) return "at least one device list strategy is needed";
  std::set<Strategy> seen;
  for (Strategy strategy : strategies) {
    if (!seen.insert(strategy).second) return std::string(strategy_name(strategy)) + " is named twice";
  }
  if (seen.count(Strategy::envvar) != 0 && seen.count(Strategy::volume_mounts) != 0) {
    return "envvar and volume-mounts cannot be combined: each sets NVIDIA_VISIBLE_DEVICES";
  }
  return std::nullopt;
}

std::optional<SharedAllocation> parse_shared_allocation(std::string_view name) {
  if (name == "distributed") return SharedAllocation::distributed;
  if (name == "packed") return SharedAllocation::packed;
  return std::nullopt;
}

std::string replica_id(std::string_view uuid, unsigned n) {
  return std::string(uuid).append(kReplicaSeparator).append(std::to_string(n));
}

std::string_view unit_uuid(std::string_view device_id) {
  return device_id.substr(0, device_id.find(kReplicaSeparator));
}

std::string cdi_device_name(std::string_view uuid) {
  std::string name(uuid);
  for (char& c : name) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                         c == '-' || c == '.' || c == ':';
    if (!allowed) c = '_';
  }
  return name;
}

GpuResource::GpuResource(const GpuResourcePlan& plan, GpuOptions options)
    : Resource(plan.name,
               [&] {
                 std::vector<Device> devices;
                 for (std::size_t i = 0; i < plan.units.size(); ++i) {
                   const GpuUnit& unit = plan.units[i];
                   for (unsigned n = 0; n < plan.replicas; ++n) {
                     devices.push_back({plan.replicas > 1 ? replica_id(unit.uuid, n) : unit.uuid, unit.gpu_uuid, true,
                                        unit.numa_node, static_cast<unsigned>(i * plan.replicas + n)});
                   }
                 }
                 return devices;
               }()),
      units_(plan.units),
      replicas_(plan.replicas),
      fail_requests_greater_than_one_(plan.fail_requests_greater_than_one),
      mps_(plan.mps && plan.replicas > 1),
      options_(std::move(options)) {}

const GpuUnit& GpuResource::unit_of(const std::string& id) const {
  const std::string_view uuid = unit_uuid(id);
  return *std::find_if(units_.begin(), units_.end(), [&](const GpuUnit& unit) { return unit.uuid == uuid; });
}

std::vector<std::string> GpuResource::preferred(const std::vector<std::string>& available,
                                                const std::vector<std::string>& must_include, std::size_t size) const {
  if (replicas_ <= 1) return Resource::preferred(available, must_include, size);
  std::vector<std::string> chosen = must_include;
  struct Candidates {
    std::vector<Device> free;  // this unit's replicas that may still be picked, lowest first
    std::size_t picked = 0;    // in this request
  };
  std::vector<Candidates> by_unit(units_.size());
  for (const std::string& id : available) {
    if (std::find(must_include.begin(), must_include.end(), id) != must_include.end()) continue;
    const auto device = devices().find(id);
    if (device && device->healthy) by_unit[device->order / replicas_].free.push_back(*device);
  }
  for (Candidates& unit : by_unit) {
    std::sort(unit.free.begin(), unit.free.end(), [](const Device& a, const Device& b) { return a.order < b.order; });
  }
  const bool spread = options_.shared_allocation == SharedAllocation::distributed;
  if (mps_ && chosen.size() < size) {
    // The whole request from one GPU, since an MPS client reaches one daemon: the one must_include holds,
    // or the least (distributed) or most (packed) used GPU with room for all of it.
    const std::size_t needed = size - chosen.size();
    std::optional<std::size_t> held;
    if (!must_include.empty()) {
      if (const auto device = devices().find(must_include.front())) held = device->order / replicas_;
    }
    Candidates* best = nullptr;
    for (std::size_t u = 0; u < by_unit.size(); ++u) {
      Candidates& unit = by_unit[u];
      if (unit.free.size() < needed || (held && u != *held)) continue;
      const std::size_t used = replicas_ - unit.free.size();
      if (best == nullptr || (spread ? used < replicas_ - best->free.size() : used > replicas_ - best->free.size())) {
        best = &unit;
      }
    }
    if (best != nullptr) {
      for (std::size_t i = 0; i < needed; ++i) chosen.push_back(best->free[i].id);
      return chosen;
    }
  }
  while (chosen.size() < size) {
    Candidates* best = nullptr;
    for (Candidates& unit : by_unit) {
      if (unit.free.empty()) continue;
      if (best == nullptr) {
        best = &unit;
        continue;
      }
      // A unit's replicas in use are those the kubelet no longer offers, plus those picked here.
      const std::size_t used = replicas_ - unit.free.size(), best_used = replicas_ - best->free.size();
      if (used != best_used ? (spread ? used < best_used : used > best_used) : unit.picked < best->picked) best = &unit;
    }
    if (best == nullptr) break;
    chosen.push_back(best->free.front().id);
    best->free.erase(best->free.begin());
    ++best->picked;
  }
  return chosen;
}

std::optional<std::string> GpuResource::refuse(const std::vector<Device>& allocated) const {
  if (replicas_ <= 1 || allocated.size() <= 1) return std::nullopt;
  if (fail_requests_greater_than_one_) {
    return "maximum request size for shared resources is 1; found " + std::to_string(allocated.size()) + " (" +
           std::string(sharing_key(mps_ ? SharingStrategy::mps : SharingStrategy::time_slicing)) +
           ".failRequestsGreaterThanOne)";
  }
  if (mps_) {
    // A client connects to one daemon, through the one pipe directory its container is given.
    const auto other = std::find_if(allocated.begin(), allocated.end(),
                                    [&](const Device& d) { return d.health_key != allocated.front().health_key; });
    if (other != allocated.end()) {
      return "MPS replicas of one container must be of one GPU: " + allocated.front().id + " and " + other->id +
             " are of two, and a client reaches one GPU's MPS daemon";
    }
  }
  return std::nullopt;
}

void GpuResource::fill(const std::vector<Device>& allocated, Allocation& allocation) const {
  std::vector<const GpuUnit*> units;  // each once: replicas of one GPU name it once
  for (const Device& device : allocated) {
    const GpuUnit* unit = &unit_of(device.id);
    if (std::find(units.begin(), units.end(), unit) == units.end()) units.push_back(unit);
  }
  std::string uuids, cdi_names;
  for (const GpuUnit* unit : units) {
    uuids += (uuids.empty() ? "" : ",") + unit->uuid;
    cdi_names += (cdi_names.empty() ? "" : ",") + options_.cdi_kind + "=" + cdi_device_name(unit->uuid);
  }
  bool visible_devices_set = false;
  for (Strategy strategy : options_.strategies) {
    switch (strategy) {
      case Strategy::envvar:
        allocation.envs[kVisibleDevices] = uuids;
        visible_devices_set = true;
        break;
      case Strategy::volume_mounts:
        allocation.envs[kVisibleDevices] = kVolumeMountsRoot;
        for (const GpuUnit* unit : units) {
          allocation.mounts.push_back({std::string(kVolumeMountsRoot) + "/" + unit->uuid, "/dev/null", true});
        }
        visible_devices_set = true;
        break;
      case Strategy::cdi_cri:
        for (const GpuUnit* unit : units) {
          allocation.cdi_devices.push_back(options_.cdi_kind + "=" + cdi_device_name(unit->uuid));
        }
        break;
      case Strategy::cdi_annotations: {
        std::string key = options_.cdi_annotation_prefix + "gpuguard_" + name();
        std::replace(key.begin() + static_cast<std::ptrdiff_t>(options_.cdi_annotation_prefix.size()), key.end(), '/',
                     '_');
        allocation.annotations[key] = cdi_names;
        break;
      }
    }
  }
  // With CDI alone, an image's NVIDIA_VISIBLE_DEVICES=all would still reach the toolkit's legacy hook
  // and widen the container to every GPU: "void" makes the hook add none.
  if (!visible_devices_set) allocation.envs[kVisibleDevices] = "void";
  if (mps_) fill_mps(allocated, *units.front(), allocation);
  // What gpuguard-node-enforcer reads where the kubelet's pod-resources API does not list the container
  // (an init container): the kubelet puts it on the container, never the pod.
  allocation.annotations[kAllocatedGpusAnnotation] = uuids;
  if (options_.pass_device_specs) {
    std::set<std::string> passed;
    for (const GpuUnit* unit : units) {
      for (const std::string& node : unit->device_nodes) {
        if (passed.insert(node).second) allocation.devices.push_back({node, node, "rw"});
      }
    }
    for (const std::string& node : options_.control_nodes) allocation.devices.push_back({node, node, "rw"});
  }
}

// The container reaches its GPU's daemon through that GPU's pipe directory and shm alone, and carries
// its limits for the replicas it holds in its environment, which every process it starts inherits.
void GpuResource::fill_mps(const std::vector<Device>& allocated, const GpuUnit& unit, Allocation& allocation) const {
  const MpsPaths paths = mps_paths(options_.mps_root, unit.gpu_uuid);
  const auto held = static_cast<unsigned>(allocated.size());
  allocation.mounts.push_back({kMpsClientPipe, paths.pipe.string(), false});
  allocation.mounts.push_back({"/dev/shm", paths.shm.string(), false});
  allocation.envs["CUDA_MPS_PIPE_DIRECTORY"] = kMpsClientPipe;
  allocation.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = std::to_string(mps_thread_percentage(held, replicas_));
  if (const auto mib = mps_memory_limit_mib(unit.memory_bytes, held, replicas_)) {
    allocation.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=" + std::to_string(*mib) + "M";
  }
}

}  // namespace gpuguard::deviceplugin

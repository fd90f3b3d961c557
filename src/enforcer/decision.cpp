// gpuguard-node-enforcer's decision (include/gpuguard/enforcer/decision.hpp).
#include "gpuguard/enforcer/decision.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <sstream>

#include "gpuguard/k8s/host_path.hpp"

namespace gpuguard::enforcer {
namespace {

constexpr std::string_view kVisibleDevices = "NVIDIA_VISIBLE_DEVICES";
constexpr std::int64_t kNvidiaMajor = 195;  // the driver's character devices; minor 255 is nvidiactl
constexpr std::int64_t kControlMinor = 255;
// Where NVIDIA's device plugin (volume-mounts strategy) and gpuguard's mount the GPUs a container gets,
// one empty file per device id, which the toolkit reads instead of the environment.
constexpr std::string_view kDeviceListDirs[] = {"/var/run/nvidia-container-devices", "/run/nvidia-container-devices"};
// gpuguard's MPS directories live under here (the chart's devicePlugin.mps.root, docs/device-plugin.md#mps):
// <root>/<uuid>/pipe and shm reach that GPU's MPS server, whatever the container's devices and environment.
constexpr std::string_view kMpsHomes[] = {"/run/gpuguard", "/var/run/gpuguard"};
// CDI vendors whose devices are NVIDIA GPUs: NVIDIA's (nvidia-ctk, the DRA driver) and gpuguard's plugin's.
constexpr std::string_view kGpuCdiVendors[] = {"nvidia.com/", "k8s.gpu.nvidia.com/", "k8s.gpuguard.io/"};

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

std::string without_replica(std::string id) {
  const std::size_t replica = id.find("::");
  if (replica != std::string::npos) id.erase(replica);
  return id;
}

std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(separator, start), text.size());
    std::string_view part = text.substr(start, end - start);
    while (!part.empty() && std::isspace(static_cast<unsigned char>(part.front()))) part.remove_prefix(1);
    while (!part.empty() && std::isspace(static_cast<unsigned char>(part.back()))) part.remove_suffix(1);
    if (!part.empty()) parts.emplace_back(part);
    start = end + 1;
  }
  return parts;
}

// What the node's GPUs are, by UUID, minor and index, and what the allocation lets the container have.
class Scope {
 public:
  Scope(const std::vector<NodeGpu>& gpus, const Allocation& allocation) : gpus_(gpus), allocation_(allocation) {
    std::sort(gpus_.begin(), gpus_.end(),
              [](const NodeGpu& a, const NodeGpu& b) { return a.pci_address < b.pci_address; });
    for (const NodeGpu& gpu : gpus_) {
      if (allocation.gpus.contains(gpu.uuid)) allowed_minors_.insert(gpu.minor);
      for (const auto& [mig, caps] : gpu.mig_cap_minors) {
        if (!allocation.gpus.contains(mig)) continue;
        allowed_minors_.insert(gpu.minor);  // a MIG device's container opens its parent GPU's node too
        allowed_caps_.insert(caps.begin(), caps.end());
      }
    }
    // A MIG device the node's list does not know (no NVML to read MIG devices from): which parent and caps
    // it needs is not known, so those nodes are not held against it.
    for (const std::string& id : allocation.gpus) {
      if (id.starts_with("MIG-") && std::none_of(gpus_.begin(), gpus_.end(),
                                                 [&](const NodeGpu& gpu) { return gpu.mig_cap_minors.contains(id); })) {
        unmapped_mig_ = true;
      }
    }
  }

  // The GPUs an entry of NVIDIA_VISIBLE_DEVICES, a device list file or a CDI device names: UUIDs as they
  // are, indices by PCI order, all; an index of a MIG device ("1:0") as its parent GPU.
  std::set<std::string> named_by(std::string_view id) const {
    std::set<std::string> named;
    if (id == "all") {
      for (const NodeGpu& gpu : gpus_) named.insert(gpu.uuid);
    } else if (id == "none" || id == "void" || id.empty() || id.front() == '/') {
      // A path (the volume-mounts strategy's /var/run/nvidia-container-devices): the mounts name the GPUs.
    } else if (all_digits(id) || (id.find(':') != std::string_view::npos && all_digits(id.substr(0, id.find(':'))))) {
      // An index past any integer names no GPU of this node (the runtime fails on it), never a crash.
      const std::string_view digits = id.substr(0, id.find(':'));
      std::size_t index = 0;
      const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      if (error == std::errc() && index < gpus_.size()) named.insert(gpus_[index].uuid);
    } else {
      named.insert(without_replica(std::string(id)));
    }
    return named;
  }

  // Whether the container may have what `id` names: every GPU of it allocated, or a MIG device of it.
  bool allowed(const std::string& uuid) const {
    if (allocation_.gpus.contains(uuid)) return true;
    // A GPU named by index whose MIG device is allocated ("1:0" resolves to the parent).
    const auto gpu = std::find_if(gpus_.begin(), gpus_.end(), [&](const NodeGpu& g) { return g.uuid == uuid; });
    return gpu != gpus_.end() && std::any_of(gpu->mig_cap_minors.begin(), gpu->mig_cap_minors.end(),
                                             [&](const auto& mig) { return allocation_.gpus.contains(mig.first); });
  }

  std::string describe_minor(unsigned minor) const {
    for (const NodeGpu& gpu : gpus_) {
      if (gpu.minor == minor) return gpu.uuid;
    }
    return "a GPU the driver does not list";
  }

  bool minor_allowed(unsigned minor) const { return unmapped_mig_ || allowed_minors_.contains(minor); }
  bool cap_allowed(unsigned minor) const { return unmapped_mig_ || allowed_caps_.contains(minor); }

 private:
  std::vector<NodeGpu> gpus_;
  const Allocation& allocation_;
  std::set<unsigned> allowed_minors_;
  std::set<unsigned> allowed_caps_;
  bool unmapped_mig_ = false;
};

std::optional<unsigned> gpu_minor(const Device& device) {
  constexpr std::string_view kPrefix = "/dev/nvidia";
  if (device.major == kNvidiaMajor && device.minor >= 0 && device.minor < kControlMinor) {
    return static_cast<unsigned>(device.minor);
  }
  if (device.path.starts_with(kPrefix) && all_digits(std::string_view(device.path).substr(kPrefix.size())) &&
      device.path.size() - kPrefix.size() <= 4) {
    return static_cast<unsigned>(std::stoul(device.path.substr(kPrefix.size())));
  }
  return std::nullopt;
}

std::optional<unsigned> cap_minor(std::string_view path) {
  constexpr std::string_view kCaps = "/dev/nvidia-caps/nvidia-cap";
  if (!path.starts_with(kCaps)) return std::nullopt;
  const std::string_view number = path.substr(kCaps.size());
  if (!all_digits(number) || number.size() > 6) return 0xffffffffU;  // under nvidia-caps, not a cap we know
  return static_cast<unsigned>(std::stoul(std::string(number)));
}

bool is_bind(const Mount& mount) {
  return mount.type == "bind" || std::any_of(mount.options.begin(), mount.options.end(),
                                             [](const std::string& o) { return o == "bind" || o == "rbind"; });
}

// What a bind mount from under gpuguard's MPS home reaches: the MPS server of the GPU whose UUID the path
// names, or, for the home or the root itself, every shared GPU's.
void mps_beyond(const Mount& mount, const Scope& scope, std::vector<std::string>& beyond) {
  const std::string source = k8s::lexical_path(mount.source);
  for (const std::string_view home : kMpsHomes) {
    if (!k8s::is_or_under(source, home)) continue;
    for (const std::string& part : split(std::string_view(source).substr(home.size()), '/')) {
      if (!part.starts_with("GPU-") && !part.starts_with("MIG-")) continue;
      if (!scope.allowed(part)) {
        beyond.push_back(std::string("the host's ")
                             .append(source)
                             .append(" (the MPS server of ")
                             .append(part)
                             .append(") mounted at ")
                             .append(mount.destination));
      }
      return;
    }
    beyond.push_back("the host's " + source + " (the MPS directories of every shared GPU) mounted at " +
                     mount.destination);
    return;
  }
}

std::string join(const std::set<std::string>& items, std::string_view separator) {
  std::string out;
  for (const std::string& item : items) out.append(out.empty() ? "" : separator).append(item);
  return out;
}

// Everything the container would see of the node's GPUs beyond its allocation, but its environment.
void devices_beyond(const ContainerView& container, const Allocation& allocation, const Scope& scope,
                    std::vector<std::string>& beyond) {
  for (const Device& device : container.devices) {
    if (allocation.device_paths.contains(device.path)) continue;
    if (const auto minor = gpu_minor(device)) {
      if (!scope.minor_allowed(*minor)) beyond.push_back(device.path + " (" + scope.describe_minor(*minor) + ")");
    } else if (const auto cap = cap_minor(device.path)) {
      if (!scope.cap_allowed(*cap)) beyond.push_back(device.path + " (a MIG capability)");
    }
  }
  for (const Mount& mount : container.mounts) {
    for (const std::string_view dir : kDeviceListDirs) {
      if (!mount.destination.starts_with(dir)) continue;
      const std::string_view rest = std::string_view(mount.destination).substr(dir.size());
      if (rest.empty() || rest == "/") {
        beyond.push_back("a directory mounted at " + mount.destination + ", which NVIDIA's runtime reads GPUs from");
        continue;
      }
      if (rest.front() != '/') continue;
      for (const std::string& uuid : scope.named_by(rest.substr(1))) {
        if (!scope.allowed(uuid)) beyond.push_back(mount.destination + " (" + uuid + ")");
      }
    }
    if (!is_bind(mount)) continue;
    mps_beyond(mount, scope, beyond);
    if (mount.source == "/dev" || mount.source == "/dev/") {
      beyond.push_back("the host's /dev mounted at " + mount.destination);
    } else if (mount.source == "/dev/nvidia-caps" || mount.source.starts_with("/dev/nvidia-caps/")) {
      const auto cap = cap_minor(mount.source);
      if (!cap || !scope.cap_allowed(*cap))
        beyond.push_back("the host's " + mount.source + " mounted at " + mount.destination);
    } else if (const auto minor = gpu_minor(Device{mount.source, "", 0, 0})) {
      if (!scope.minor_allowed(*minor) && !allocation.device_paths.contains(mount.source)) {
        beyond.push_back("the host's " + mount.source + " (" + scope.describe_minor(*minor) + ") mounted at " +
                         mount.destination);
      }
    }
  }
  for (const std::string& name : container.cdi_devices) {
    if (allocation.cdi_devices.contains(name)) continue;
    if (std::none_of(std::begin(kGpuCdiVendors), std::end(kGpuCdiVendors),
                     [&](std::string_view vendor) { return name.starts_with(vendor); })) {
      continue;
    }
    const std::size_t equals = name.find('=');
    const std::set<std::string> named = equals == std::string::npos
                                            ? std::set<std::string>{name}
                                            : scope.named_by(std::string_view(name).substr(equals + 1));
    if (std::any_of(named.begin(), named.end(), [&](const std::string& uuid) { return !scope.allowed(uuid); })) {
      beyond.push_back("CDI device " + name);
    }
  }
}

// What becomes of a container that would see `decision.beyond`: under audit, said; under enforce, an
// environment alone beyond its allocation (`narrowed_from`, the value it had) narrowed, anything else refused.
Decision conclude(Decision decision, const ContainerView& container, const Allocation& allocation,
                  const policy::Policy& policy, const std::optional<std::string>& narrowed_from) {
  const std::string allocated =
      allocation.gpus.empty() && allocation.cdi_devices.empty()
          ? "none"
          : join(allocation.gpus, ", ") + (allocation.cdi_devices.empty() ? ""
                                                                          : (allocation.gpus.empty() ? "" : ", ") +
                                                                                join(allocation.cdi_devices, ", "));
  if (policy.node_enforcement == policy::NodeEnforcement::audit) {
    decision.why = Decision::Why::audited;
    decision.message = "would be changed under nodeEnforcement: enforce; allocated " + allocated;
    return decision;
  }
  decision.why = Decision::Why::enforced;
  if (narrowed_from) {
    decision.action = Decision::Action::adjust;
    decision.visible_devices = allocation.gpus.empty() ? "void" : join(allocation.gpus, ",");
    decision.message = "NVIDIA_VISIBLE_DEVICES set to " + *decision.visible_devices + " (was " + *narrowed_from + ")";
    return decision;
  }
  decision.action = Decision::Action::refuse;
  std::ostringstream message;
  message << "gpuguard: container \"" << container.container << "\" of pod " << container.pod_namespace << "/"
          << container.pod_name << " would get GPUs the kubelet did not allocate it: ";
  for (std::size_t i = 0; i < decision.beyond.size(); ++i) message << (i == 0 ? "" : "; ") << decision.beyond[i];
  message << ". It was allocated " << allocated << " (" << allocation.detail
          << "); request the GPUs it needs, or ask the cluster admin (gpuguard's nodeEnforcement policy)";
  decision.message = message.str();
  return decision;
}

}  // namespace

std::string_view why_name(Decision::Why why) {
  switch (why) {
    case Decision::Why::enforced: return "enforced";
    case Decision::Why::audited: return "audited";
    case Decision::Why::off: return "off";
    case Decision::Why::exempt: return "exempt";
    case Decision::Why::privileged: return "privileged";
    case Decision::Why::allocation_unknown: return "allocation-unknown";
    case Decision::Why::within: break;
  }
  return "within";
}

Decision decide(const ContainerView& container, const Allocation& allocation, const std::vector<NodeGpu>& node_gpus,
                const policy::Policy& policy) {
  Decision decision;
  if (policy.node_enforcement == policy::NodeEnforcement::off) {
    decision.why = Decision::Why::off;
    return decision;
  }
  if (policy.is_node_enforcement_exempt(container.pod_namespace, container.service_account, &container.pod_labels)) {
    decision.why = Decision::Why::exempt;
    return decision;
  }
  if (container.all_devices_allowed) {
    // It can make and open any device node, whatever it is given now: counted and reported, not confined.
    // A GPU's MPS server, though, it reaches only through that GPU's directory: a bind mount of another
    // GPU's, or of the MPS root, is held against it as against any container (a look-alike of gpuguard's
    // own MPS daemons, which are exempt).
    std::vector<std::string> mps;
    if (allocation.source != Allocation::Source::unknown) {
      const Scope scope(node_gpus, allocation);
      for (const Mount& mount : container.mounts) {
        if (is_bind(mount)) mps_beyond(mount, scope, mps);
      }
    }
    const std::string every = "every device (its device cgroup allows all: privileged)";
    if (mps.empty()) {
      decision.why = Decision::Why::privileged;
      decision.beyond.push_back(every);
      return decision;
    }
    decision.beyond = std::move(mps);
    decision.beyond.push_back(every);
    return conclude(std::move(decision), container, allocation, policy, std::nullopt);
  }
  if (allocation.source == Allocation::Source::unknown) {
    decision.why = Decision::Why::allocation_unknown;
    decision.message = "the kubelet's allocation could not be read: " + allocation.detail;
    return decision;
  }
  const Scope scope(node_gpus, allocation);
  devices_beyond(container, allocation, scope, decision.beyond);

  // The environment, as NVIDIA's runtime reads it: the last NVIDIA_VISIBLE_DEVICES.
  std::optional<std::string> visible;
  std::size_t entries = 0;
  for (const std::string& entry : container.env) {
    if (entry.starts_with(kVisibleDevices) &&
        (entry.size() == kVisibleDevices.size() || entry[kVisibleDevices.size()] == '=')) {
      visible = entry.size() > kVisibleDevices.size() ? entry.substr(kVisibleDevices.size() + 1) : std::string();
      if (entry.size() > kVisibleDevices.size()) ++entries;  // NRI drops a bare name when it adjusts
    }
  }
  std::set<std::string> excess;
  if (visible) {
    for (const std::string& id : split(*visible, ',')) {
      for (const std::string& uuid : scope.named_by(id)) {
        if (!scope.allowed(uuid)) excess.insert(uuid);
      }
    }
  }
  // NRI changes a variable where it first appears and then copies the later entries over it (containerd
  // lists the image's, the device plugin's and the pod's values one after the other), so a variable set
  // more than once cannot be narrowed: such a container is refused instead.
  const bool adjustable = entries == 1;
  if (!excess.empty()) {
    decision.beyond.push_back(std::string(kVisibleDevices) + "=" + *visible + " names " + join(excess, ", ") +
                              (adjustable ? ""
                                          : " (set " + std::to_string(entries) +
                                                " times, which NRI cannot override: remove the container's own " +
                                                std::string(kVisibleDevices) + ")"));
  }

  if (decision.beyond.empty()) return decision;
  const bool only_environment = !excess.empty() && decision.beyond.size() == 1 && adjustable;
  return conclude(std::move(decision), container, allocation, policy, only_environment ? visible : std::nullopt);
}

}  // namespace gpuguard::enforcer

// gpuguard-node-enforcer's decision (include/gpuguard/enforcer/decision.hpp). Each door below is read as
// NVIDIA's container toolkit reads it; the rules and their sources are in docs/node-enforcer.md ("How
// NVIDIA's runtime reads a container"), and tests/enforcer/toolkit_model.cpp is an implementation of the
// same rules written apart from this one, mode by mode, against which a property test holds this file.
#include "gpuguard/enforcer/decision.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "gpuguard/k8s/host_path.hpp"

namespace gpuguard::enforcer {
namespace {

constexpr std::int64_t kNvidiaMajor = 195;  // the driver's character devices; 254 is nvidia-modeset, 255 nvidiactl
constexpr std::int64_t kFirstControlMinor = 254;
constexpr std::string_view kGpuNode = "/dev/nvidia";
constexpr std::string_view kCapNode = "/dev/nvidia-caps/nvidia-cap";
constexpr std::string_view kImexNode = "/dev/nvidia-caps-imex-channels/channel";
// Where device lists are mounted, one entry per device: NVIDIA's runtime takes the part of a mount's cleaned
// destination after /var/run/nvidia-container-devices, by string prefix, as a device's name
// (internal/config/image/cuda_image.go). /run/nvidia-container-devices is not read, and is held all the same.
constexpr std::string_view kDeviceListRoots[] = {"/var/run/nvidia-container-devices", "/run/nvidia-container-devices"};
// CDI vendors whose devices are NVIDIA GPUs: NVIDIA's (nvidia-ctk, the DRA driver) and gpuguard's plugin's.
constexpr std::string_view kGpuCdiVendors[] = {"nvidia.com/", "k8s.gpu.nvidia.com/", "k8s.gpuguard.io/"};
// NVIDIA's runtime makes these CDI kinds itself, from NVML, whatever the node's specs say
// (internal/modifier/cdi.go; pkg/nvcdi/management.go).
constexpr std::string_view kJitKind = "runtime.nvidia.com/gpu";
constexpr std::string_view kManagementKind = "management.nvidia.com/gpu";
constexpr std::string_view kCudaVersion = "CUDA_VERSION";
constexpr std::string_view kRequireCuda = "NVIDIA_REQUIRE_CUDA";
constexpr std::string_view kEveryImexChannel = "every IMEX channel";
constexpr std::size_t kPathMax = 4096;
constexpr unsigned kUnknownCap = 0xffffffffU;  // under /dev/nvidia-caps, and not nvidia-cap<minor>

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

std::string without_replica(std::string_view id) { return std::string(id.substr(0, id.find("::"))); }

// Whether a PCI bus id names this address ("0000:3b:00.0"): its parts compared as numbers, the domain
// optional, as libnvidia-container reads one ("%x:%02x:%02x.0").
bool same_bus(std::string_view id, std::string_view address) {
  const auto numbers = [](std::string_view text) {
    std::vector<unsigned long> parts;
    std::size_t at = 0;
    while (at <= text.size()) {
      const std::size_t end = std::min(text.find_first_of(":.", at), text.size());
      unsigned long value = 0;
      const auto [last, error] = std::from_chars(text.data() + at, text.data() + end, value, 16);
      if (error != std::errc() || last != text.data() + end) return std::vector<unsigned long>{};
      parts.push_back(value);
      at = end + 1;
    }
    return parts;
  };
  std::vector<unsigned long> a = numbers(id), b = numbers(address);
  if (a.size() == 3) a.insert(a.begin(), 0);
  if (b.size() == 3) b.insert(b.begin(), 0);
  return a.size() == 4 && a == b;
}

// Comma-separated, each part trimmed, empty parts dropped: how the toolkit splits a device variable
// (cuda_image.go, NewVisibleDevices).
std::vector<std::string> tokens(std::string_view text) {
  std::vector<std::string> parts;
  while (true) {
    const std::size_t comma = text.find(',');
    std::string_view part = text.substr(0, comma);
    while (!part.empty() && std::isspace(static_cast<unsigned char>(part.front()))) part.remove_prefix(1);
    while (!part.empty() && std::isspace(static_cast<unsigned char>(part.back()))) part.remove_suffix(1);
    if (!part.empty()) parts.emplace_back(part);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return parts;
}

// A CDI device's fully qualified name: "vendor/class=name", the vendor with a dot or not (CDI's
// parser.IsQualifiedName, loosely: whatever holds '/' before '=').
bool is_qualified(std::string_view name) {
  const std::size_t equals = name.find('=');
  return equals != std::string_view::npos && name.substr(0, equals).find('/') != std::string_view::npos;
}

template <typename Set>
std::string join(const Set& items, std::string_view separator) {
  std::string out;
  for (const auto& item : items) out.append(out.empty() ? "" : separator).append(item);
  return out;
}

std::string cut(std::string text, std::size_t max) {
  if (text.size() <= max) return text;
  std::size_t at = max - 3;
  while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;  // a UTF-8 continuation
  text.resize(at);
  return text + "...";
}

// What one door gives the container.
struct Reach {
  std::string door;                   // what it is, for the report: "/dev/nvidia1", "NVIDIA_VISIBLE_DEVICES=all"
  std::set<std::string> names;        // the GPU and MIG UUIDs it names, and "IMEX channel N"
  std::string unknown;                // not empty: it reaches what cannot be named, and why
  std::string fix;                    // the variable whose new value takes it away, where one does
  std::string_view verb = "reaches";  // how the report joins the two: a request "names" what it asks for
  bool none_meant = false;            // NVIDIA_VISIBLE_DEVICES=none: no GPU was asked for, whatever the node reads
};

// The node's GPUs by UUID, minor and index, what CDI names bring, and what the allocation allows.
class Scope {
 public:
  Scope(const NodeView& node, const Allocation& allocation) : node_(node), allocation_(allocation) {
    gpus_ = node.gpus;
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
    for (const std::string& id : allocation.gpus) {
      if (id.starts_with("MIG-") && std::none_of(gpus_.begin(), gpus_.end(),
                                                 [&](const NodeGpu& gpu) { return gpu.mig_cap_minors.contains(id); })) {
        unmapped_mig_ = id;
      }
    }
    for (const std::string& path : allocation.device_paths) {
      if (path.starts_with(kImexNode)) allowed_imex_.insert("IMEX channel " + path.substr(kImexNode.size()));
      // A claim's own nodes, as its CDI spec names them.
      if (const auto minor = gpu_minor(Device{path, "c", 0, 0})) allowed_minors_.insert(*minor);
      if (const auto cap = cap_minor(path); cap && *cap != kUnknownCap) allowed_caps_.insert(*cap);
    }
  }

  const NodeView& node() const { return node_; }
  const Allocation& allocation() const { return allocation_; }

  // The GPUs a device id names: a UUID as it is, an index by PCI order, "i:j" as GPU i's, all. An id that
  // is none of these is kept as it is: it names no GPU of this node the enforcer knows, and is beyond.
  void named_by(std::string_view id, Reach& reach) const {
    if (id == "all") {
      every_gpu(reach);
      return;
    }
    // A path (the volume-mounts strategy points the variable at its directory): no device of that name
    // exists in any mode, and the runtime fails on it.
    if (id.starts_with('/')) return;
    // A PCI bus id (libnvidia-container selects by it): its GPU, whatever case or leading zeros it has.
    if (std::count(id.begin(), id.end(), ':') > 1 || id.find('.') != std::string_view::npos) {
      for (const NodeGpu& gpu : gpus_) {
        if (same_bus(id, gpu.pci_address)) reach.names.insert(gpu.uuid);
      }
      if (reach.names.empty()) reach.names.insert(std::string(id));
      return;
    }
    const std::size_t colon = id.find(':');
    const std::string_view index = id.substr(0, colon);
    if (all_digits(index)) {
      std::size_t number = 0;
      const auto [end, error] = std::from_chars(index.data(), index.data() + index.size(), number);
      if (colon != std::string_view::npos) {
        // "i:j", MIG device j of GPU i by NVML's numbering, which the enforcer does not have: never its own.
        reach.names.insert("MIG device " + std::string(id.substr(colon + 1)) + " of GPU " + std::string(index));
      } else if (error == std::errc() && number < gpus_.size()) {
        reach.names.insert(gpus_[number].uuid);
        for (const auto& [mig, caps] : gpus_[number].mig_cap_minors) {
          // Whether the legacy CLI gives a GPU in MIG mode its MIG devices too is not relied on: they count.
          if (!allocation_.gpus.contains(mig)) reach.names.insert(mig);
        }
      } else if (!node_.gpus_unknown.empty()) {
        reach.unknown = "GPU " + std::string(index) + " cannot be named: " + node_.gpus_unknown;
      }
      return;  // an index past the node's GPUs names none (the runtime fails on it)
    }
    reach.names.insert(without_replica(id));
  }

  // Every GPU, and every MIG device of a GPU in MIG mode (all selects them too).
  void every_gpu(Reach& reach) const {
    for (const NodeGpu& gpu : gpus_) {
      reach.names.insert(gpu.uuid);
      for (const auto& [mig, caps] : gpu.mig_cap_minors) reach.names.insert(mig);
      if (gpu.mig_enabled && !gpu.mig_listed) {
        reach.unknown = "the MIG devices of " + gpu.uuid + " cannot be named (no NVML, no CDI spec naming them)";
      }
    }
    if (!node_.gpus_unknown.empty()) reach.unknown = "the node's GPUs cannot be named: " + node_.gpus_unknown;
  }

  // What a fully qualified CDI name brings: the device nodes of its spec on the node, read as device nodes
  // are (GPUs, MIG capabilities, IMEX channels); for NVIDIA's kinds, also what its name names.
  void cdi(std::string_view name, Reach& reach) const {
    const std::size_t equals = name.find('=');
    const std::string_view kind = name.substr(0, equals);
    const std::string_view device = equals == std::string_view::npos ? std::string_view{} : name.substr(equals + 1);
    if (kind == kManagementKind) {
      every_gpu(reach);
      reach.names.insert(std::string(kEveryImexChannel));
      return;
    }
    if (kind == kJitKind) {
      if (device != "none") named_by(device, reach);
      return;
    }
    if (const auto spec = node_.cdi_devices.find(std::string(name)); spec != node_.cdi_devices.end()) {
      for (const std::string& path : spec->second) node_path(path, reach);
    }
    if (std::any_of(std::begin(kGpuCdiVendors), std::end(kGpuCdiVendors),
                    [&](std::string_view vendor) { return name.starts_with(vendor); }) &&
        device != "none") {
      named_by(device, reach);
    }
  }

  // What a device node at `path` (as the container gets it, or a CDI spec names it) reaches.
  void node_path(std::string_view path, Reach& reach) const {
    if (path.starts_with(kImexNode)) {
      reach.names.insert("IMEX channel " + std::string(path.substr(kImexNode.size())));
    } else if (const auto cap = cap_minor(path)) {
      cap_reach(*cap, reach);
    } else if (const auto minor = gpu_minor(Device{std::string(path), "c", 0, 0})) {
      minor_reach(*minor, reach);
    }
  }

  void minor_reach(unsigned minor, Reach& reach) const {
    if (allowed_minors_.contains(minor)) return;  // its own GPU, or the parent of its MIG device
    for (const NodeGpu& gpu : gpus_) {
      if (gpu.minor != minor) continue;
      if (unmapped_mig_.empty()) {
        reach.names.insert(gpu.uuid);
      } else {
        reach.unknown = gpu.uuid + " may be the parent of " + unmapped_mig_ + ", which cannot be mapped to its GPU";
      }
      return;
    }
    if (node_.gpus_unknown.empty() && unmapped_mig_.empty()) {
      reach.names.insert("GPU minor " + std::to_string(minor) + ", which the driver does not list");
      return;
    }
    reach.unknown = "GPU minor " + std::to_string(minor) + " cannot be named" +
                    (node_.gpus_unknown.empty() ? "" : ": " + node_.gpus_unknown) +
                    (unmapped_mig_.empty() ? "" : "; " + unmapped_mig_ + " cannot be mapped to its GPU");
  }

  void cap_reach(unsigned cap, Reach& reach) const {
    if (allowed_caps_.contains(cap)) return;
    if (cap == kUnknownCap) {
      reach.names.insert("a capability the enforcer does not know");
      return;
    }
    for (const NodeGpu& gpu : gpus_) {
      for (const auto& [mig, caps] : gpu.mig_cap_minors) {
        if (std::find(caps.begin(), caps.end(), cap) != caps.end()) reach.names.insert(mig);
      }
    }
    if (!reach.names.empty()) return;
    if (node_.gpus_unknown.empty() && unmapped_mig_.empty()) {
      reach.names.insert("MIG capability " + std::to_string(cap) + ", of no MIG device the node lists");
      return;
    }
    reach.unknown = "MIG capability " + std::to_string(cap) + " cannot be named" +
                    (node_.gpus_unknown.empty() ? "" : ": " + node_.gpus_unknown) +
                    (unmapped_mig_.empty() ? "" : "; " + unmapped_mig_ + " cannot be mapped to its capabilities");
  }

  // Whether the container may have what a name names: its GPU or MIG device, a MIG device's parent GPU
  // named by index, an IMEX channel its claims bring.
  bool allowed(const std::string& name) const {
    if (allocation_.gpus.contains(name) || allowed_imex_.contains(name)) return true;
    const auto gpu = std::find_if(gpus_.begin(), gpus_.end(), [&](const NodeGpu& g) { return g.uuid == name; });
    return gpu != gpus_.end() && std::any_of(gpu->mig_cap_minors.begin(), gpu->mig_cap_minors.end(),
                                             [&](const auto& mig) { return allocation_.gpus.contains(mig.first); });
  }

  std::string allowed_imex() const {
    std::string channels;
    for (const std::string& name : allowed_imex_) {
      channels.append(channels.empty() ? "" : ",").append(name.substr(std::string_view("IMEX channel ").size()));
    }
    return channels.empty() ? "void" : channels;
  }

  static std::optional<unsigned> gpu_minor(const Device& device) {
    if (device.major == kNvidiaMajor && device.minor >= 0 && device.minor < kFirstControlMinor) {
      return static_cast<unsigned>(device.minor);
    }
    const std::string_view path = device.path;
    if (path.starts_with(kGpuNode) && all_digits(path.substr(kGpuNode.size())) && path.size() - kGpuNode.size() <= 4) {
      const auto minor = static_cast<unsigned>(std::stoul(std::string(path.substr(kGpuNode.size()))));
      if (minor < kFirstControlMinor) return minor;
    }
    return std::nullopt;
  }

  static std::optional<unsigned> cap_minor(std::string_view path) {
    if (!path.starts_with(kCapNode)) {
      // Anything else under /dev/nvidia-caps is a capability the enforcer does not know.
      return path.starts_with("/dev/nvidia-caps/") ? std::optional<unsigned>(kUnknownCap) : std::nullopt;
    }
    const std::string_view number = path.substr(kCapNode.size());
    if (!all_digits(number) || number.size() > 6) return kUnknownCap;
    return static_cast<unsigned>(std::stoul(std::string(number)));
  }

 private:
  const NodeView& node_;
  const Allocation& allocation_;
  std::vector<NodeGpu> gpus_;
  std::set<unsigned> allowed_minors_;
  std::set<unsigned> allowed_caps_;
  std::set<std::string> allowed_imex_;
  std::string unmapped_mig_;  // an allocated MIG device whose capabilities and parent the node does not say
};

const EnvVariable* variable(const ContainerView& container, std::string_view name) {
  const auto found = container.env.find(name);
  return found == container.env.end() || found->second.entries == 0 ? nullptr : &found->second;
}

// Reads a device variable's value as NVIDIA's runtime does (internal/config/image/devices.go): no token, or
// a void anywhere, is nothing; otherwise the first of all and none decides; otherwise each id.
void device_request(std::string_view value, const Scope& scope, Reach& reach) {
  const std::vector<std::string> ids = tokens(value);
  if (ids.empty() || std::find(ids.begin(), ids.end(), "void") != ids.end()) return;
  const auto special =
      std::find_if(ids.begin(), ids.end(), [](const std::string& id) { return id == "all" || id == "none"; });
  const Toolkit& toolkit = scope.node().toolkit;
  if (special != ids.end() && *special == "all") {
    scope.every_gpu(reach);
    return;
  }
  if (special != ids.end()) {
    // none: no GPU in legacy mode, and in jit-cdi from 1.18.2; the CDI device <default-kind>=none in cdi
    // mode; every GPU in jit-cdi on 1.18.0 and 1.18.1 (NVIDIA/nvidia-container-toolkit#1555) and in csv
    // mode. Where the node does not say which, every GPU.
    const auto& mode = toolkit.mode;
    if (mode == "legacy" || (mode == "jit-cdi" && toolkit.version >= ToolkitVersion{1, 18, 2})) return;
    if (mode == "cdi") {
      scope.cdi(toolkit.default_kind + "=none", reach);
      return;
    }
    scope.every_gpu(reach);
    return;
  }
  for (const std::string& id : ids) {
    if (is_qualified(id)) {
      scope.cdi(id, reach);  // a fully qualified name is used as it is, in every CDI mode
    } else {
      scope.named_by(id, reach);                          // legacy and jit-cdi: an index, UUID or i:j
      scope.cdi(toolkit.default_kind + "=" + id, reach);  // cdi: the default kind's device of that name
    }
  }
}

// NVIDIA_VISIBLE_DEVICES, or the swarm-resource variables where the node's toolkit reads them instead; with
// neither, a legacy CUDA image's default of all (cuda_image.go, VisibleDevicesFromEnvVar).
void environment_door(const ContainerView& container, const Scope& scope, std::vector<Reach>& reaches) {
  const Toolkit& toolkit = scope.node().toolkit;
  for (const std::string& swarm : toolkit.swarm_variables) {
    if (const EnvVariable* value = variable(container, swarm)) {
      Reach reach{swarm + "=" + cut(value->last, kBeyondLineMax / 2), {}, {}, {}, "names"};
      device_request(value->last, scope, reach);
      reaches.push_back(std::move(reach));
    }
  }
  const EnvVariable* visible = variable(container, kVisibleDevices);
  if (visible == nullptr) {
    const EnvVariable* cuda = variable(container, kCudaVersion);
    const EnvVariable* require = variable(container, kRequireCuda);
    if (cuda != nullptr && !cuda->last.empty() && (require == nullptr || require->last.empty())) {
      Reach reach{
          "no NVIDIA_VISIBLE_DEVICES in a legacy CUDA image (CUDA_VERSION without NVIDIA_REQUIRE_CUDA), "
          "which NVIDIA's runtime reads as all",
          {},
          {},
          std::string(kVisibleDevices),
          "names"};
      scope.every_gpu(reach);
      reaches.push_back(std::move(reach));
    }
    return;
  }
  Reach reach{std::string(kVisibleDevices) + "=" + cut(visible->last, kBeyondLineMax / 2),
              {},
              {},
              std::string(kVisibleDevices),
              "names"};
  if (visible->entries > 1) {
    reach.door += " (set " + std::to_string(visible->entries) +
                  " times, which NRI cannot override: remove the container's own " + std::string(kVisibleDevices) + ")";
  }
  if (visible->last_cut) {
    reach.unknown = "a value longer than the enforcer reads";
  } else {
    device_request(visible->last, scope, reach);
    const std::vector<std::string> ids = tokens(visible->last);
    const auto special =
        std::find_if(ids.begin(), ids.end(), [](const std::string& id) { return id == "all" || id == "none"; });
    reach.none_meant = special != ids.end() && *special == "none";
  }
  reaches.push_back(std::move(reach));
}

// NVIDIA_IMEX_CHANNELS, read like NVIDIA_VISIBLE_DEVICES; all and none as every channel (none is every
// channel on the jit-cdi path, cuda_image.go ImexChannelsFromEnvVar and pkg/nvcdi/lib-imex.go).
void imex_door(const ContainerView& container, std::vector<Reach>& reaches) {
  const EnvVariable* channels = variable(container, kImexChannels);
  if (channels == nullptr) return;
  Reach reach{std::string(kImexChannels) + "=" + cut(channels->last, kBeyondLineMax / 2),
              {},
              {},
              std::string(kImexChannels),
              "names"};
  const std::vector<std::string> ids = tokens(channels->last);
  if (channels->last_cut) {
    reach.unknown = "a value longer than the enforcer reads";
  } else if (!ids.empty() && std::find(ids.begin(), ids.end(), "void") == ids.end()) {
    for (const std::string& id : ids) {
      if (id == "all" || id == "none") {
        reach.names.insert(std::string(kEveryImexChannel));
      } else {
        reach.names.insert("IMEX channel " +
                           std::string(std::string_view(id).substr(id.starts_with("channel") ? 7 : 0)));
      }
    }
  }
  reaches.push_back(std::move(reach));
}

// A mount under the device-list root: a device request named by its destination (cuda_image.go,
// requestsFromMounts), "imex/<id>" an IMEX channel's, "cdi/<vendor>/<class>/<name>" a CDI name's.
void device_list_door(const Mount& mount, const Scope& scope, std::vector<Reach>& reaches) {
  const std::string destination = k8s::lexical_path(mount.destination);
  for (const std::string_view root : kDeviceListRoots) {
    if (!destination.starts_with(root)) continue;
    std::string_view name = std::string_view(destination).substr(root.size());
    while (name.starts_with('/')) name.remove_prefix(1);
    Reach reach{"a device list entry mounted at " + cut(mount.destination, kBeyondLineMax / 2), {}, {}, {}, "names"};
    if (name.empty()) {
      reach.door = "a directory mounted at " + cut(mount.destination, kBeyondLineMax / 2) +
                   ", where NVIDIA's runtime reads device lists";
      scope.every_gpu(reach);
    } else if (name.starts_with("imex/")) {
      for (const std::string& id : tokens(name.substr(5))) {
        reach.names.insert(id == "all" || id == "none" ? std::string(kEveryImexChannel) : "IMEX channel " + id);
      }
    } else if (name.starts_with("cdi/")) {
      std::string qualified(name.substr(4));
      if (!is_qualified(qualified)) {
        const std::size_t last = qualified.rfind('/');
        if (last != std::string::npos) qualified[last] = '=';
      }
      scope.cdi(qualified, reach);
    } else {
      // The runtime takes the name as one id (a qualified CDI name as it is); the legacy hook hands the ids
      // to the CLI joined by commas, which splits them again: both readings count.
      device_request(name, scope, reach);
      const std::string id(name);
      if (is_qualified(id)) {
        scope.cdi(id, reach);
      } else if (id != "none" && id != "void") {
        scope.named_by(id, reach);
        scope.cdi(scope.node().toolkit.default_kind + "=" + id, reach);
      }
    }
    reaches.push_back(std::move(reach));
    return;
  }
}

// The toolkit's CDI annotations, which it reads in cdi mode (and which push auto to cdi): comma-separated
// names, each qualified with the default kind where it is not, an empty one as none (cuda_image.go,
// internal/modifier/cdi.go).
void annotation_door(const ContainerView& container, const Scope& scope, std::vector<Reach>& reaches) {
  const Toolkit& toolkit = scope.node().toolkit;
  for (const auto& [key, value] : container.annotations) {
    if (!judged_annotation(key, toolkit) || key == "gpuguard.io/allocated-gpus" ||
        key == "io.kubernetes.cri-o.Annotations") {
      continue;
    }
    Reach reach{
        "the annotation " + cut(std::string(key).append("=").append(value), kBeyondLineMax / 2), {}, {}, {}, "names"};
    std::string_view rest = value;
    while (true) {
      const std::size_t comma = rest.find(',');
      const std::string_view name = rest.substr(0, comma);
      const std::string request = name.empty() ? "none" : std::string(name);
      scope.cdi(is_qualified(request) ? request : toolkit.default_kind + "=" + request, reach);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    reaches.push_back(std::move(reach));
  }
}

bool is_bind(const Mount& mount) {
  return mount.type == "bind" || std::any_of(mount.options.begin(), mount.options.end(),
                                             [](const std::string& o) { return o == "bind" || o == "rbind"; });
}

// The host's /var/run is /run: a path under one is under the other.
std::string host_path(std::string_view source) {
  std::string path = k8s::lexical_path(source);
  if (k8s::is_or_under(path, "/var/run")) path.replace(0, std::string_view("/var/run").size(), "/run");
  return path;
}

// What a bind mount reaches of the MPS servers: a GPU's directory under an MPS root reaches that GPU's; the
// root itself, or a directory above it, every shared GPU's.
void mps_door(const Mount& mount, const Scope& scope, std::vector<Reach>& reaches) {
  if (!is_bind(mount)) return;
  const std::string source = host_path(mount.source);
  for (const std::string& configured : scope.node().mps_roots) {
    const std::string root = host_path(configured);
    Reach reach{"the host's " + cut(k8s::lexical_path(mount.source), kBeyondLineMax / 4) + " mounted at " +
                    cut(mount.destination, kBeyondLineMax / 4),
                {},
                {},
                {}};
    if (k8s::is_or_under(root, source) && root != source) {
      reach.names.insert("every shared GPU's MPS server (" + root + " lies under it)");
    } else if (k8s::is_or_under(source, root)) {
      std::string_view rest = std::string_view(source).substr(root.size());
      std::string gpu;
      while (!rest.empty() && gpu.empty()) {
        while (rest.starts_with('/')) rest.remove_prefix(1);
        const std::string_view part = rest.substr(0, rest.find('/'));
        if (part.starts_with("GPU-") || part.starts_with("MIG-")) gpu = std::string(part);
        rest.remove_prefix(part.size());
      }
      // A GPU's directory reaches that GPU's server; the root, every shared GPU's.
      reach.names.insert(gpu.empty() ? "every shared GPU's MPS server" : gpu);
      if (!gpu.empty()) reach.verb = "reaches the MPS server of";
    } else {
      continue;
    }
    reaches.push_back(std::move(reach));
    return;
  }
}

// Device nodes, and bind mounts of them, of /dev or of /dev/nvidia-caps.
void device_doors(const ContainerView& container, const Scope& scope, std::vector<Reach>& reaches) {
  const Allocation& allocation = scope.allocation();
  for (const Device& device : container.devices) {
    if (allocation.device_paths.contains(device.path)) continue;
    Reach reach{cut(device.path, kBeyondLineMax / 2), {}, {}, {}};
    if (const auto minor = Scope::gpu_minor(device)) {
      scope.minor_reach(*minor, reach);
    } else {
      scope.node_path(device.path, reach);
    }
    if (!reach.names.empty() || !reach.unknown.empty()) reaches.push_back(std::move(reach));
  }
  for (const Mount& mount : container.mounts) {
    device_list_door(mount, scope, reaches);
    mps_door(mount, scope, reaches);
    if (!is_bind(mount)) continue;
    const std::string source = k8s::lexical_path(mount.source);
    if (allocation.device_paths.contains(source)) continue;
    Reach reach{
        "the host's " + cut(source, kBeyondLineMax / 4) + " mounted at " + cut(mount.destination, kBeyondLineMax / 4),
        {},
        {},
        {}};
    if (source == "/dev") {
      scope.every_gpu(reach);
      reach.names.insert(std::string(kEveryImexChannel));
    } else if (source == "/dev/nvidia-caps" || source == "/dev/nvidia-caps-imex-channels") {
      reach.names.insert(source == "/dev/nvidia-caps" ? "every MIG capability" : std::string(kEveryImexChannel));
    } else {
      scope.node_path(source, reach);
    }
    if (!reach.names.empty() || !reach.unknown.empty()) reaches.push_back(std::move(reach));
  }
  for (const DeviceRule& rule : container.device_rules) {
    Reach reach{"its device cgroup, which allows c " + (rule.major ? std::to_string(*rule.major) : std::string("*")) +
                    ":" + (rule.minor ? std::to_string(*rule.minor) : std::string("*")) + " (a node it may make)",
                {},
                {},
                {}};
    if (!rule.minor) {
      scope.every_gpu(reach);
    } else if (*rule.minor >= 0 && *rule.minor < kFirstControlMinor) {
      scope.minor_reach(static_cast<unsigned>(*rule.minor), reach);
    }
    if (!reach.names.empty() || !reach.unknown.empty()) reaches.push_back(std::move(reach));
  }
  for (const std::string& name : container.cdi_devices) {
    if (allocation.cdi_devices.contains(name)) continue;
    Reach reach{"CDI device " + cut(name, kBeyondLineMax / 2), {}, {}, {}, "names"};
    scope.cdi(name, reach);
    if (!reach.names.empty() || !reach.unknown.empty()) reaches.push_back(std::move(reach));
  }
}

std::vector<Reach> reaches_of(const ContainerView& container, const Scope& scope) {
  std::vector<Reach> reaches;
  environment_door(container, scope, reaches);
  imex_door(container, reaches);
  annotation_door(container, scope, reaches);
  device_doors(container, scope, reaches);
  if (container.unkept > 0) {
    reaches.push_back({"more device nodes, mounts, CDI devices or annotations than the enforcer reads (" +
                           std::to_string(container.unkept) + " not read)",
                       {},
                       "they are not read",
                       {}});
  }
  return reaches;
}

// What of a reach is beyond the allocation: its names not allowed, then what cannot be named.
std::string beyond_of(const Reach& reach, const Scope& scope) {
  std::set<std::string> excess;
  for (const std::string& name : reach.names) {
    if (!scope.allowed(name)) excess.insert(name);
  }
  std::string line;
  if (!excess.empty()) line = reach.door + " " + std::string(reach.verb) + " " + join(excess, ", ");
  if (!reach.unknown.empty()) line += (line.empty() ? reach.door + ": " : "; ") + reach.unknown;
  return cut(line, kBeyondLineMax);
}

bool names_beyond(const Reach& reach, const Scope& scope) {
  return std::any_of(reach.names.begin(), reach.names.end(), [&](const std::string& n) { return !scope.allowed(n); });
}

std::string allocated_text(const Allocation& allocation) {
  if (allocation.gpus.empty() && allocation.cdi_devices.empty()) return "none";
  std::string text = join(allocation.gpus, ", ");
  if (!allocation.cdi_devices.empty()) text.append(text.empty() ? "" : ", ").append(join(allocation.cdi_devices, ", "));
  return cut(text, kBeyondLineMax);
}

void keep_beyond(Decision& decision, std::string line) {
  ++decision.beyond_count;
  if (decision.beyond.size() < kBeyondKept) decision.beyond.push_back(std::move(line));
}

std::string refusal(const ContainerView& container, const Decision& decision, std::string_view what,
                    std::string_view after) {
  std::string message = "gpuguard: container \"" + cut(container.container, 128) + "\" of pod " +
                        cut(container.pod_namespace, 64) + "/" + cut(container.pod_name, 256) + " " +
                        std::string(what) + ": ";
  for (std::size_t i = 0; i < decision.beyond.size(); ++i)
    message.append(i == 0 ? "" : "; ").append(decision.beyond[i]);
  if (decision.beyond_count > decision.beyond.size()) {
    message.append("; and " + std::to_string(decision.beyond_count - decision.beyond.size()) + " more");
  }
  message.append(". ").append(after);
  return cut(message, kMessageMax);
}

}  // namespace

void add_mig_devices_from_cdi(NodeView& node) {
  for (const auto& [name, paths] : node.cdi_devices) {
    const std::size_t equals = name.find('=');
    if (equals == std::string::npos || name.compare(equals + 1, 4, "MIG-") != 0) continue;
    const std::string uuid = name.substr(equals + 1);
    std::optional<unsigned> parent;
    std::vector<unsigned> caps;
    for (const std::string& path : paths) {
      if (const auto cap = Scope::cap_minor(path); cap && *cap != kUnknownCap) {
        caps.push_back(*cap);
      } else if (const auto minor = Scope::gpu_minor(Device{path, "c", 0, 0})) {
        parent = *minor;
      }
    }
    if (!parent) continue;
    for (NodeGpu& gpu : node.gpus) {
      if (gpu.minor == *parent && !gpu.mig_cap_minors.contains(uuid)) gpu.mig_cap_minors[uuid] = caps;
    }
  }
}

bool judged_variable(std::string_view name, const Toolkit& toolkit) {
  return name == kVisibleDevices || name == kImexChannels || name == kCudaVersion || name == kRequireCuda ||
         std::find(toolkit.swarm_variables.begin(), toolkit.swarm_variables.end(), name) !=
             toolkit.swarm_variables.end();
}

bool judged_annotation(std::string_view key, const Toolkit& toolkit) {
  return key == "gpuguard.io/allocated-gpus" || key == "io.kubernetes.cri-o.Annotations" ||
         std::any_of(toolkit.annotation_prefixes.begin(), toolkit.annotation_prefixes.end(),
                     [&](const std::string& prefix) { return key.starts_with(prefix); });
}

bool judged_device(const Device& device) { return device.major == kNvidiaMajor || device.path.starts_with(kGpuNode); }

bool judged_rule(bool allow, std::string_view type, const DeviceRule& rule) {
  return allow && (type.empty() || type == "a" || type == "c") && (!rule.major || *rule.major == kNvidiaMajor) &&
         (rule.major || rule.minor || type == "c");  // no major and no minor, type a: every device, said apart
}

bool judged_mount(const Mount& mount, const NodeView& node) {
  if (mount.destination.size() > kPathMax || mount.source.size() > kPathMax) return true;  // counted unread
  const std::string destination = k8s::lexical_path(mount.destination);
  for (const std::string_view root : kDeviceListRoots) {
    if (destination.starts_with(root)) return true;
  }
  if (!is_bind(mount)) return false;
  const std::string source = host_path(mount.source);
  if (source == "/dev" || source.starts_with(kGpuNode)) return true;
  return std::any_of(node.mps_roots.begin(), node.mps_roots.end(), [&](const std::string& root) {
    const std::string home = host_path(root);
    return k8s::is_or_under(source, home) || k8s::is_or_under(home, source);
  });
}

ContainerView with_env_set(ContainerView container, const std::map<std::string, std::string>& set_env) {
  if (set_env.empty()) return container;
  for (auto& [name, variable] : container.env) variable.bare = false;  // the generator drops such entries
  for (const auto& [name, value] : set_env) {
    EnvVariable& variable = container.env[name];
    // The first entry is replaced, a missing one appended; a later entry stays, and stays the last.
    if (variable.entries <= 1) {
      variable.last = value;
      variable.last_cut = false;
    }
    variable.entries = std::max<std::size_t>(variable.entries, 1);
  }
  return container;
}

std::string_view why_name(Decision::Why why) {
  switch (why) {
    case Decision::Why::enforced: return "enforced";
    case Decision::Why::audited: return "audited";
    case Decision::Why::off: return "off";
    case Decision::Why::exempt: return "exempt";
    case Decision::Why::privileged: return "privileged";
    case Decision::Why::cannot_judge: return "cannot-judge";
    case Decision::Why::within: break;
  }
  return "within";
}

Decision decide(const ContainerView& container, const Allocation& allocation, const NodeView& node,
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
  const bool audit = policy.node_enforcement == policy::NodeEnforcement::audit;
  const bool allow_unknown = policy.node_enforcement_unknown == policy::NodeEnforcementUnknown::allow;
  const std::string allocated = allocated_text(allocation);
  const std::string ask = "It was allocated " + allocated + " (" + cut(allocation.detail, kBeyondLineMax) +
                          "); request the GPUs it needs, or ask the cluster admin (gpuguard's nodeEnforcement policy)";
  const Scope scope(node, allocation);

  if (container.all_devices_allowed) {
    // It can make and open any device node, whatever it is given now: counted and reported, not confined.
    // A GPU's MPS server, though, it reaches only through that GPU's directory: a bind mount of another
    // GPU's, or of the MPS root, is held against it as against any container (a look-alike of gpuguard's
    // own MPS daemons, which are exempt).
    std::vector<Reach> mps;
    for (const Mount& mount : container.mounts) mps_door(mount, scope, mps);
    for (const Reach& reach : mps) {
      if (allocation.source == Allocation::Source::unknown || names_beyond(reach, scope)) {
        keep_beyond(decision, beyond_of(reach, scope).empty() ? reach.door : beyond_of(reach, scope));
      }
    }
    const bool mps_beyond = decision.beyond_count > 0;
    keep_beyond(decision, "every device (its device cgroup allows all: privileged)");
    decision.why = Decision::Why::privileged;
    if (!mps_beyond) return decision;
    if (audit) {
      decision.why = Decision::Why::audited;
      return decision;
    }
    decision.why = Decision::Why::enforced;
    decision.action = Decision::Action::refuse;
    decision.message =
        refusal(container, decision, "would reach MPS servers of GPUs the kubelet did not allocate it", ask);
    return decision;
  }

  std::vector<Reach> reaches = reaches_of(container, scope);
  if (allocation.source == Allocation::Source::unknown) {
    // Nothing can be proven its own: everything it would reach is what the enforcer cannot judge. A none
    // that the node might read as all is made void, which no node reads as a GPU: none asked for none.
    std::map<std::string, std::string> fixes;
    for (const Reach& reach : reaches) {
      if (reach.none_meant && (!reach.names.empty() || !reach.unknown.empty())) fixes[reach.fix] = "void";
    }
    for (const Reach& reach : reaches_of(with_env_set(container, fixes), scope)) {
      if (!reach.names.empty() || !reach.unknown.empty()) keep_beyond(decision, cut(reach.door, kBeyondLineMax));
    }
    if (decision.beyond_count == 0) {  // it reaches no GPU: there is nothing to judge
      if (!fixes.empty() && !audit) {
        decision.action = Decision::Action::adjust;
        decision.why = Decision::Why::enforced;
        decision.set_env = std::move(fixes);
        decision.message = "NVIDIA_VISIBLE_DEVICES set to void (was none, which this node's toolkit may read as all)";
      }
      return decision;
    }
    decision.why = Decision::Why::cannot_judge;
    if (audit || allow_unknown) {
      decision.message =
          "the kubelet's allocation could not be read (" + cut(allocation.detail, kBeyondLineMax) + "): left as it is";
      return decision;
    }
    decision.action = Decision::Action::refuse;
    decision.message =
        refusal(container, decision, "would reach GPUs while its allocation cannot be read",
                "The kubelet's allocation could not be read: " + cut(allocation.detail, kBeyondLineMax) +
                    ". The kubelet tries the create again; gpuguard's nodeEnforcementUnknown policy decides this");
    return decision;
  }

  // What is beyond, and which variables set to the allocation take it away.
  std::map<std::string, std::string> fixes;
  for (const Reach& reach : reaches) {
    if (beyond_of(reach, scope).empty()) continue;
    keep_beyond(decision, beyond_of(reach, scope));
    if (reach.fix == kVisibleDevices) fixes[reach.fix] = allocation.gpus.empty() ? "void" : join(allocation.gpus, ",");
    if (reach.fix == kImexChannels) fixes[reach.fix] = scope.allowed_imex();
  }
  if (decision.beyond_count == 0) return decision;
  if (audit) {
    decision.why = Decision::Why::audited;
    decision.message = "would be changed under nodeEnforcement: enforce; allocated " + allocated;
    return decision;
  }
  decision.why = Decision::Why::enforced;
  // The container as the runtime would make it with those variables set: what is still beyond (a variable
  // set more than once keeps its last entry; doors other than variables stay) is refused.
  Decision remaining;
  bool only_unknown = true;
  for (const Reach& reach : reaches_of(with_env_set(container, fixes), scope)) {
    const std::string line = beyond_of(reach, scope);
    if (line.empty()) continue;
    keep_beyond(remaining, line);
    only_unknown = only_unknown && !names_beyond(reach, scope);
  }
  if (remaining.beyond_count == 0) {
    decision.action = Decision::Action::adjust;
    decision.set_env = std::move(fixes);
    std::string change;
    for (const auto& [name, value] : decision.set_env) {
      change.append(change.empty() ? "" : "; ").append(name + " set to " + cut(value, kBeyondLineMax));
    }
    decision.message = change + " (was: " + join(decision.beyond, "; ") + ")";
    return decision;
  }
  if (only_unknown && allow_unknown) {
    // What is left cannot be named, and the policy lets such a container be: the variables are still set.
    decision.why = Decision::Why::cannot_judge;
    decision.action = fixes.empty() ? Decision::Action::allow : Decision::Action::adjust;
    decision.set_env = std::move(fixes);
    decision.message =
        "cannot be judged (" + join(remaining.beyond, "; ") + "): left so under nodeEnforcementUnknown: allow";
    return decision;
  }
  decision.beyond = std::move(remaining.beyond);
  decision.beyond_count = remaining.beyond_count;
  decision.action = Decision::Action::refuse;
  if (only_unknown) decision.why = Decision::Why::cannot_judge;
  decision.message = refusal(container, decision,
                             only_unknown ? "would reach GPUs the enforcer cannot prove are its own"
                                          : "would get GPUs the kubelet did not allocate it",
                             ask);
  return decision;
}

}  // namespace gpuguard::enforcer

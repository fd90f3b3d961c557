// gpuguard-node-enforcer's decision (include/gpuguard/enforcement/decision.hpp). The selection variables are
// written, not read the ways NVIDIA's runtime reads them; every other door is judged exactly, one function
// each. docs/node-enforcer.md says what each door is and cites the toolkit's source for it;
// tests/enforcer/toolkit_model.cpp reads containers the toolkit's ways, written apart from this file, and a
// property test holds what this file lets through to it.
#include "gpuguard/enforcement/decision.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>

#include "gpuguard/k8s/host_path.hpp"

namespace gpuguard::enforcement {

std::string host_path(std::string_view source) {
  std::string path = k8s::lexical_path(source);
  if (k8s::is_or_under(path, "/var/run")) path.replace(0, std::string_view("/var/run").size(), "/run");
  return path;
}

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
// CDI kinds whose device names are GPU IDs: NVIDIA's (nvidia-ctk, the device plugin's CDI strategies),
// NVIDIA's JIT kind, and gpuguard's plugin's. The management kind is every GPU and every IMEX channel
// (pkg/nvcdi/management.go), never an allocation.
constexpr std::string_view kGpuKinds[] = {"nvidia.com/gpu", "runtime.nvidia.com/gpu", "k8s.gpuguard.io/gpu"};
constexpr std::string_view kGpuVendors[] = {"nvidia.com/", "k8s.gpu.nvidia.com/", "k8s.gpuguard.io/"};
constexpr std::string_view kManagementKind = "management.nvidia.com/gpu";
constexpr std::string_view kCudaVersion = "CUDA_VERSION";
constexpr std::string_view kRequireCuda = "NVIDIA_REQUIRE_CUDA";
constexpr std::string_view kVoid = "void";
// What a device plugin's volume-mounts strategy writes into the variable, its devices being the mounts under
// it (k8s-device-plugin's deviceListStrategy volume-mounts, gpuguard's plugin's): no reading of it as an ID
// selects a device (every mode fails on it, "unknown device" or "not a valid UUID or index"), but csv before
// 1.19, where any request is every device.
constexpr std::string_view kVolumeMountsValue = "/var/run/nvidia-container-devices";
constexpr unsigned kUnknownCap = 0xffffffffU;  // under /dev/nvidia-caps, and not nvidia-cap<minor>

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// Split on every comma, nothing trimmed, empty parts kept: a value is within only if each part is exactly
// what the enforcer writes, so no reading of spaces, cases or empty parts can matter.
std::vector<std::string_view> exact_parts(std::string_view text) {
  std::vector<std::string_view> parts;
  while (true) {
    const std::size_t comma = text.find(',');
    parts.push_back(text.substr(0, comma));
    if (comma == std::string_view::npos) return parts;
    text.remove_prefix(comma + 1);
  }
}

// A CDI device's fully qualified name: "vendor/class=name" (CDI's parser.IsQualifiedName, loosely).
bool is_qualified(std::string_view name) {
  const std::size_t equals = name.find('=');
  return equals != std::string_view::npos && name.substr(0, equals).find('/') != std::string_view::npos;
}

template <typename Items>
std::string join(const Items& items, std::string_view separator) {
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

// An allocated ID the enforcer can write into a selection variable as it is: one token of the characters
// device plugins name devices with (UUIDs, indices, "i:j"), and none of the words the toolkit reads apart.
bool writable_id(std::string_view id) {
  if (id.empty() || id.size() > kNameMax) return false;
  const std::string word = lower(id);
  if (word == "all" || word == "none" || word == "void") return false;
  return std::all_of(id.begin(), id.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.' || c == ':';
  });
}

std::optional<unsigned> number_after(std::string_view path, std::string_view prefix, std::size_t max_digits) {
  if (!path.starts_with(prefix)) return std::nullopt;
  const std::string_view digits = path.substr(prefix.size());
  if (!all_digits(digits) || digits.size() > max_digits) return std::nullopt;
  unsigned value = 0;
  std::from_chars(digits.data(), digits.data() + digits.size(), value);
  return value;
}

// The GPU minor a device node opens: the driver's major and a GPU's minor, or a /dev/nvidiaN path.
std::optional<unsigned> gpu_minor(const Device& device) {
  if (device.major == kNvidiaMajor && device.minor >= 0 && device.minor < kFirstControlMinor) {
    return static_cast<unsigned>(device.minor);
  }
  const auto minor = number_after(device.path, kGpuNode, 3);
  if (minor && *minor < kFirstControlMinor) return minor;
  return std::nullopt;
}

// A MIG capability's minor (/dev/nvidia-caps/nvidia-cap<minor>); kUnknownCap for anything else under
// /dev/nvidia-caps/.
std::optional<unsigned> cap_minor(std::string_view path) {
  if (const auto cap = number_after(path, kCapNode, 6)) return cap;
  return path.starts_with("/dev/nvidia-caps/") ? std::optional<unsigned>(kUnknownCap) : std::nullopt;
}

// The node's GPUs by minor and index, and what the allocation allows of them: the one place that maps
// between IDs, device nodes, capabilities and IMEX channels.
class Scope {
 public:
  Scope(const NodeView& node, const Allocation& allocation) : node_(node), allocation_(allocation) {
    gpus_ = node.gpus;
    std::sort(gpus_.begin(), gpus_.end(),
              [](const discovery::Gpu& a, const discovery::Gpu& b) { return a.pci_address < b.pci_address; });
    for (std::size_t index = 0; index < gpus_.size(); ++index) {
      const discovery::Gpu& gpu = gpus_[index];
      // A device plugin names a GPU by UUID, or by index where its ID strategy says so.
      if (allocation.gpus.contains(gpu.uuid) || allocation.gpus.contains(std::to_string(index))) {
        allowed_minors_.insert(gpu.minor);
        allowed_names_.insert(gpu.uuid);
      }
      for (const discovery::MigDevice& mig : gpu.mig_devices) {
        if (!allocation.gpus.contains(mig.uuid)) continue;
        allowed_minors_.insert(gpu.minor);  // a MIG device's container opens its parent GPU's node too
        allowed_caps_.insert(mig.cap_minors.begin(), mig.cap_minors.end());
      }
    }
    for (const std::string& id : allocation.gpus) {
      allowed_names_.insert(id);
      if (id.starts_with("MIG-") && std::none_of(gpus_.begin(), gpus_.end(), [&](const discovery::Gpu& gpu) {
            return discovery::find_mig(gpu, id) != nullptr;
          })) {
        unmapped_mig_ = id;
      }
    }
    for (const std::string& path : allocation.device_paths) {
      // A claim's own nodes, as its CDI spec names them.
      if (const auto channel = number_after(path, kImexNode, 7)) allowed_imex_.insert(std::to_string(*channel));
      if (const auto minor = gpu_minor(Device{path, "c", 0, 0})) allowed_minors_.insert(*minor);
      if (const auto cap = cap_minor(path); cap && *cap != kUnknownCap) allowed_caps_.insert(*cap);
    }
  }

  const NodeView& node() const { return node_; }
  const Allocation& allocation() const { return allocation_; }
  bool known() const { return allocation_.source != Allocation::Source::unknown; }

  // Why a selection naming the allocated GPUs may give the container more than them, or "": csv mode before
  // 1.19 gives every device for any request but void (internal/modifier/csv.go), so it selects exactly only
  // where the container is allocated every GPU of the node. csv may be what runs where the mode is csv, auto
  // on Tegra, or not known.
  std::string spread() const {
    const Toolkit& toolkit = node_.toolkit;
    const bool csv = !toolkit.mode || toolkit.mode == "csv" || (toolkit.mode == "auto" && toolkit.tegra);
    if (!csv || (toolkit.version && *toolkit.version >= ToolkitVersion{1, 19, 0})) return {};
    const bool every = node_.gpus_unknown.empty() &&
                       std::all_of(gpus_.begin(), gpus_.end(),
                                   [&](const discovery::Gpu& gpu) { return allowed_names_.contains(gpu.uuid); });
    if (every) return {};
    return toolkit.mode ? "csv mode before 1.19 gives every device for any request but void, and the container is "
                          "allocated only some of the node's GPUs"
                        : "the node's toolkit mode cannot be read, and csv mode before 1.19 gives every device for "
                          "any request but void";
  }

  // The value the enforcer writes into NVIDIA_VISIBLE_DEVICES and swarm-resource's variables: the allocated
  // IDs, sorted, once each, comma-separated; void for none. nullopt when an ID cannot be written as it is.
  std::optional<std::string> devices_value() const {
    if (allocation_.gpus.empty()) return std::string(kVoid);
    if (!std::all_of(allocation_.gpus.begin(), allocation_.gpus.end(), writable_id)) return std::nullopt;
    return join(allocation_.gpus, ",");
  }

  // ...and into NVIDIA_IMEX_CHANNELS: the claimed channels, or empty, which every toolkit version reads as
  // none (void fails the container on 1.14 and 1.16, which hand the value to the CLI as it is).
  std::string imex_value() const { return join(allowed_imex_, ","); }

  bool id_allowed(std::string_view id) const { return allocation_.gpus.contains(std::string(id)); }
  bool channel_allowed(std::string_view channel) const { return allowed_imex_.contains(std::string(channel)); }
  const std::string* first_unwritable_id() const {
    const auto found = std::find_if_not(allocation_.gpus.begin(), allocation_.gpus.end(), writable_id);
    return found == allocation_.gpus.end() ? nullptr : &*found;
  }

  // What a GPU's device node reaches beyond the allocation ("" when nothing), or why it cannot be named.
  std::string minor_beyond(unsigned minor, bool& unknown) const {
    unknown = false;
    if (allowed_minors_.contains(minor)) return {};  // its own GPU, or the parent of its MIG device
    for (const discovery::Gpu& gpu : gpus_) {
      if (gpu.minor != minor) continue;
      if (unmapped_mig_.empty()) return gpu.uuid;
      unknown = true;
      return gpu.uuid + ", which may be the parent of " + unmapped_mig_ + " (its GPU cannot be told)";
    }
    if (node_.gpus_unknown.empty() && unmapped_mig_.empty()) {
      return "GPU minor " + std::to_string(minor) + ", which the driver does not list";
    }
    unknown = true;
    return "GPU minor " + std::to_string(minor) + ", which cannot be named" +
           (node_.gpus_unknown.empty() ? "" : ": " + node_.gpus_unknown) +
           (unmapped_mig_.empty() ? "" : "; " + unmapped_mig_ + " cannot be mapped to its GPU");
  }

  std::string cap_beyond(unsigned cap, bool& unknown) const {
    unknown = false;
    if (allowed_caps_.contains(cap)) return {};
    if (cap == kUnknownCap) return "a capability the enforcer does not know";
    std::vector<std::string> migs;
    for (const discovery::Gpu& gpu : gpus_) {
      const std::size_t first = migs.size();
      for (const discovery::MigDevice& mig : gpu.mig_devices) {
        if (std::find(mig.cap_minors.begin(), mig.cap_minors.end(), cap) != mig.cap_minors.end()) {
          migs.push_back(mig.uuid);
        }
      }
      std::sort(migs.begin() + static_cast<std::ptrdiff_t>(first), migs.end());  // by GPU, then UUID
    }
    if (!migs.empty()) return join(migs, ", ");
    if (node_.gpus_unknown.empty() && unmapped_mig_.empty()) {
      return "MIG capability " + std::to_string(cap) + ", of no MIG device the node lists";
    }
    unknown = true;
    return "MIG capability " + std::to_string(cap) + ", which cannot be named" +
           (node_.gpus_unknown.empty() ? "" : ": " + node_.gpus_unknown) +
           (unmapped_mig_.empty() ? "" : "; " + unmapped_mig_ + " cannot be mapped to its capabilities");
  }

  std::string imex_beyond(std::string_view channel) const {
    return channel_allowed(channel) ? std::string() : "IMEX channel " + std::string(channel);
  }

  // What a device node at `path` (a CDI spec's, or a bind mount's source) reaches beyond the allocation.
  std::string path_beyond(std::string_view path, bool& unknown) const {
    unknown = false;
    if (allocation_.device_paths.contains(std::string(path))) return {};
    if (const auto channel = number_after(path, kImexNode, 7)) return imex_beyond(std::to_string(*channel));
    if (path.starts_with(kImexNode)) return "an IMEX channel the enforcer does not know";
    if (const auto cap = cap_minor(path)) return cap_beyond(*cap, unknown);
    if (const auto minor = gpu_minor(Device{std::string(path), "c", 0, 0})) return minor_beyond(*minor, unknown);
    return {};
  }

  // Every GPU of the node beyond the allocation, for a door that opens them all.
  std::string every_gpu_beyond(bool& unknown) const {
    unknown = !node_.gpus_unknown.empty();
    if (unknown) return "every GPU, which cannot be named: " + node_.gpus_unknown;
    std::vector<std::string> beyond;
    for (const discovery::Gpu& gpu : gpus_) {
      if (!allowed_minors_.contains(gpu.minor)) beyond.push_back(gpu.uuid);
    }
    return join(beyond, ", ");
  }

 private:
  const NodeView& node_;
  const Allocation& allocation_;
  std::vector<discovery::Gpu> gpus_;
  std::set<std::string> allowed_names_;
  std::set<unsigned> allowed_minors_;
  std::set<unsigned> allowed_caps_;
  std::set<std::string> allowed_imex_;
  std::string unmapped_mig_;  // an allocated MIG device whose capabilities and parent the node does not say
};

// What the doors found, in order: each a line for the report, and what it takes.
struct Findings {
  enum class Kind { writable, beyond, unknown };
  struct Finding {
    std::string line;
    Kind kind;
  };
  std::vector<Finding> all;
  std::map<std::string, std::string> set_env;  // what writing the selection sets
  std::set<std::string> masks;                 // where writing masks goes (Decision::masks)

  void add(std::string line, Kind kind) { all.push_back({cut(std::move(line), kBeyondLineMax), kind}); }
  bool any(Kind kind) const {
    return std::any_of(all.begin(), all.end(), [kind](const Finding& f) { return f.kind == kind; });
  }
};

// --- The selection variables: written, not read ---------------------------------------------------------

// Whether a device selection's value is, part for part, what the enforcer writes: void (also an empty
// value, which every toolkit reads as void: internal/config/image/cuda_image.go), or allocated IDs each
// exactly as the kubelet lists them, or none where every toolkit the node may run reads it as no GPU.
bool devices_within(const Selection& selection, const Scope& scope) {
  if (selection.last_over) return false;
  const std::string& value = selection.last;
  if (value.empty() || value == kVoid) return true;
  if (value == "none") return none_honoured(scope.node());
  if (!scope.known() || !scope.spread().empty()) return false;
  if (value == kVolumeMountsValue) return true;
  const std::vector<std::string_view> parts = exact_parts(value);
  return std::all_of(parts.begin(), parts.end(), [&](std::string_view id) { return scope.id_allowed(id); });
}

bool channels_within(const Selection& selection, const Scope& scope) {
  if (selection.last_over) return false;
  if (selection.last.empty() || selection.last == kVoid) return true;
  if (!scope.known()) return false;
  const std::vector<std::string_view> parts = exact_parts(selection.last);
  return std::all_of(parts.begin(), parts.end(), [&](std::string_view ch) { return scope.channel_allowed(ch); });
}

std::string shown(std::string_view name, const Selection& selection) {
  return std::string(name) + "=" + (selection.last_over ? std::string("(over 4 KiB)") : cut(selection.last, 96));
}

// One selection variable: left where it is within, written where the runtime will read what is written (it
// is set once), refused where it cannot be (set more than once: NRI changes the first entry and copies the
// later ones over it, and the toolkit reads the last).
void selection_door(std::string_view name, const Selection* selection, bool imex, const ContainerView& container,
                    const Scope& scope, Findings& findings) {
  const bool absent = selection == nullptr || selection->entries == 0;
  if (absent) {
    // A legacy CUDA image without the variable is read as all: the variable is written.
    if (imex || name != kVisibleDevices || !container.legacy_cuda_image) return;
  } else if (imex ? channels_within(*selection, scope) : devices_within(*selection, scope)) {
    return;
  }
  const std::string what = absent ? "no " + std::string(name) +
                                        " in a legacy CUDA image (CUDA_VERSION without NVIDIA_REQUIRE_CUDA), "
                                        "which NVIDIA's runtime reads as all"
                                  : shown(name, *selection) + ", not what gpuguard writes for the allocation";
  if (!scope.known()) {
    // Nothing can be written for an allocation that is not known, but void for a none: none asked for no GPU.
    if (!absent && !imex && selection->last == "none" && selection->entries == 1) {
      findings.set_env[std::string(name)] = std::string(kVoid);
      findings.add(what, Findings::Kind::writable);
    } else {
      findings.add(what, Findings::Kind::unknown);
    }
    return;
  }
  if (!absent && selection->entries > 1) {
    findings.add(what + " (set " + std::to_string(selection->entries) + " times; NRI can change only the first, and " +
                     "NVIDIA's runtime reads the last: remove the container's own " + std::string(name) + ")",
                 Findings::Kind::beyond);
    return;
  }
  const std::optional<std::string> value =
      imex ? std::optional<std::string>(scope.imex_value()) : scope.devices_value();
  if (!imex && value && *value != kVoid && !scope.spread().empty()) {
    // Written all the same, for nodeEnforcementUnknown: allow: the allocation, where the mode may select by
    // it, is never more than what the container asked for.
    findings.set_env[std::string(name)] = *value;
    findings.add(what + "; it cannot be written: " + scope.spread(), Findings::Kind::unknown);
    return;
  }
  if (!value) {
    findings.add(what + "; the allocated ID " + cut(*scope.first_unwritable_id(), 64) +
                     " cannot be written as a device selection",
                 Findings::Kind::unknown);
    return;
  }
  findings.set_env[std::string(name)] = *value;
  findings.add(what, Findings::Kind::writable);
}

const Selection* selection(const ContainerView& container, std::string_view name) {
  const auto found = container.selections.find(name);
  return found == container.selections.end() ? nullptr : &found->second;
}

// Whether the allocation holds a GPU: a device plugin's, or a claim's CDI device of a GPU kind or vendor.
bool allocates_gpu(const Allocation& allocation) {
  return !allocation.gpus.empty() ||
         std::any_of(allocation.cdi_devices.begin(), allocation.cdi_devices.end(), [](const std::string& name) {
           const std::string_view kind = std::string_view(name).substr(0, name.find('='));
           return std::find(std::begin(kGpuKinds), std::end(kGpuKinds), kind) != std::end(kGpuKinds) ||
                  std::any_of(std::begin(kGpuVendors), std::end(kGpuVendors),
                              [&](std::string_view vendor) { return kind.starts_with(vendor); });
         });
}

// A variable the enforcer writes empty: within only where the container leaves it so (or sets it not at all).
void emptied_door(std::string_view name, const Selection* selection, std::string_view reaches, Findings& findings) {
  if (selection == nullptr || selection->entries == 0 || (!selection->last_over && selection->last.empty())) return;
  const std::string what = shown(name, *selection) + ", " + std::string(reaches);
  if (selection->entries > 1) {
    findings.add(what + " (set " + std::to_string(selection->entries) + " times; NRI can change only the first, and " +
                     "NVIDIA's runtime reads the last: remove the container's own " + std::string(name) + ")",
                 Findings::Kind::beyond);
    return;
  }
  findings.set_env[std::string(name)] = "";
  findings.add(what, Findings::Kind::writable);
}

void selection_doors(const ContainerView& container, const Scope& scope, Findings& findings) {
  if (scope.node().toolkit.swarm_over) {
    findings.add("the toolkit's swarm-resource names more variables than the " + std::to_string(kSwarmMax) +
                     " gpuguard reads, and any of them may select GPUs",
                 Findings::Kind::unknown);
  }
  for (const std::string_view name : {kMigConfigDevices, kMigMonitorDevices}) {
    emptied_door(name, selection(container, name), "MIG configuration or monitoring of every GPU", findings);
  }
  // Where the allocation is not known to hold a GPU: not known at all either (its none is left where honoured,
  // and legacy 1.17 counts none as a request for them), or a claim of another vendor's devices only.
  if (!scope.known() || !allocates_gpu(scope.allocation())) {
    for (const std::string_view name : kFeatureVariables) {
      emptied_door(name, selection(container, name), "device nodes for a container allocated no GPU", findings);
    }
  }
  selection_door(kVisibleDevices, selection(container, kVisibleDevices), false, container, scope, findings);
  for (const std::string& swarm : scope.node().toolkit.swarm_variables) {
    if (const Selection* set = selection(container, swarm))
      selection_door(swarm, set, false, container, scope, findings);
  }
  selection_door(kImexChannels, selection(container, kImexChannels), true, container, scope, findings);
}

// --- Doors judged exactly ---------------------------------------------------------------------------------

// Whether a fully qualified CDI name is the allocation's: a claim's device, or a GPU kind's device named
// by an allocated ID exactly. Any other GPU kind's name is beyond whatever it names; another vendor's is
// judged by the device nodes its spec on the node brings.
void cdi_name_door(std::string_view name, const std::string& door, const Scope& scope, Findings& findings) {
  const Allocation& allocation = scope.allocation();
  if (allocation.cdi_devices.contains(std::string(name))) return;
  const std::size_t equals = name.find('=');
  const std::string_view kind = name.substr(0, equals);
  const std::string_view device = equals == std::string_view::npos ? std::string_view{} : name.substr(equals + 1);
  const bool gpu_kind = kind == scope.node().toolkit.default_kind ||
                        std::find(std::begin(kGpuKinds), std::end(kGpuKinds), kind) != std::end(kGpuKinds);
  if (gpu_kind) {
    if (scope.known() && scope.id_allowed(device)) return;
    findings.add(door + ", not a device of the allocation",
                 scope.known() ? Findings::Kind::beyond : Findings::Kind::unknown);
    return;
  }
  const bool nvidia = kind == kManagementKind || std::any_of(std::begin(kGpuVendors), std::end(kGpuVendors),
                                                             [&](std::string_view v) { return name.starts_with(v); });
  const auto spec = scope.node().cdi_devices.find(std::string(name));
  if (spec == scope.node().cdi_devices.end()) {
    // Not in the specs the enforcer read: the runtime fails on it, unless a spec the enforcer could not read
    // defines it.
    findings.add(door + ", which no CDI spec the enforcer read defines", Findings::Kind::unknown);
    return;
  }
  std::vector<std::string> reached;
  bool unknown = false;
  for (const std::string& path : spec->second) {
    bool this_unknown = false;
    const std::string beyond = scope.path_beyond(path, this_unknown);
    if (!beyond.empty()) reached.push_back(beyond);
    unknown = unknown || this_unknown;
  }
  if (!reached.empty()) {
    findings.add(door + " brings " + join(reached, ", "),
                 unknown || !scope.known() ? Findings::Kind::unknown : Findings::Kind::beyond);
  } else if (nvidia && !scope.known() && !spec->second.empty()) {
    findings.add(door + ", an NVIDIA device while the allocation cannot be read", Findings::Kind::unknown);
  }
}

void cdi_device_door(const ContainerView& container, const Scope& scope, Findings& findings) {
  for (const std::string& name : container.cdi_devices) {
    cdi_name_door(name, "CDI device " + cut(name, 128), scope, findings);
  }
}

// The toolkit's CDI annotations, which it reads in cdi mode: comma-separated names, untrimmed, each
// qualified with the default kind where it is not, an empty one as none (cuda_image.go,
// internal/modifier/cdi.go).
void annotation_door(const ContainerView& container, const Scope& scope, Findings& findings) {
  const std::string& kind = scope.node().toolkit.default_kind;
  for (const auto& [key, part] : container.cdi_annotation_names) {
    const std::string name = is_qualified(part) ? part : kind + "=" + (part.empty() ? std::string("none") : part);
    cdi_name_door(name, "the annotation " + cut(key, 96) + " naming " + cut(name, 96), scope, findings);
  }
}

// A mount under a device list root: NVIDIA's runtime reads its cleaned destination, by string prefix, as
// a device request (cuda_image.go requestsFromMounts). Within only as NVIDIA's volume-mounts strategy writes
// one: <root>/<allocated ID>, or <root>/imex/<claimed channel>, exactly.
void device_list_door(const Mount& mount, const Scope& scope, Findings& findings) {
  const std::string destination = k8s::lexical_path(mount.destination);
  for (const std::string_view root : kDeviceListRoots) {
    if (!destination.starts_with(root)) continue;
    const std::string_view rest =
        std::string_view(mount.destination)
            .substr(mount.destination.starts_with(root) ? root.size() : mount.destination.size());
    if (scope.known() && rest.starts_with('/')) {
      const std::string_view name = rest.substr(1);
      if (name.starts_with("imex/") ? scope.channel_allowed(name.substr(5))
                                    : scope.id_allowed(name) && scope.spread().empty()) {
        return;
      }
    }
    findings.add("a mount at " + cut(mount.destination, 160) + ", where NVIDIA's runtime reads device lists, " +
                     "not one gpuguard's allocation names",
                 scope.known() ? Findings::Kind::beyond : Findings::Kind::unknown);
    return;
  }
}

void device_node_door(const ContainerView& container, const Scope& scope, Findings& findings) {
  for (const Device& device : container.devices) {
    bool unknown = false;
    std::string beyond;
    if (scope.allocation().device_paths.contains(device.path)) continue;
    if (const auto minor = gpu_minor(device)) {
      beyond = scope.minor_beyond(*minor, unknown);
    } else {
      beyond = scope.path_beyond(device.path, unknown);
    }
    if (beyond.empty()) continue;
    findings.add(cut(device.path, 128) + " reaches " + beyond,
                 unknown || !scope.known() ? Findings::Kind::unknown : Findings::Kind::beyond);
  }
}

void device_rule_door(const ContainerView& container, const Scope& scope, Findings& findings) {
  for (const DeviceRule& rule : container.device_rules) {
    const std::string door = "its device cgroup, which allows c " +
                             (rule.major ? std::to_string(*rule.major) : std::string("*")) + ":" +
                             (rule.minor ? std::to_string(*rule.minor) : std::string("*")) + " (a node it may make)";
    bool unknown = false;
    std::string beyond;
    if (!rule.minor) {
      beyond = scope.every_gpu_beyond(unknown);
    } else if (*rule.minor >= 0 && *rule.minor < kFirstControlMinor) {
      beyond = scope.minor_beyond(static_cast<unsigned>(*rule.minor), unknown);
    }
    if (beyond.empty()) continue;
    findings.add(std::string(door).append(" reaches ").append(beyond),
                 unknown || !scope.known() ? Findings::Kind::unknown : Findings::Kind::beyond);
  }
}

// What a bind mount of `source` reaches of the MPS server under one MPS root: a GPU's directory under it
// reaches that GPU's (`gpu` names it); the root itself, every shared GPU's. Empty when neither: also where
// the root lies under the source, which mps_door judges apart.
std::string mps_reach(std::string_view source, const std::string& root, std::string& gpu) {
  if (!k8s::is_or_under(source, root)) return {};
  std::string_view rest = source.substr(root.size());
  while (!rest.empty() && gpu.empty()) {
    while (rest.starts_with('/')) rest.remove_prefix(1);
    const std::string_view part = rest.substr(0, rest.find('/'));
    if (part.starts_with("GPU-") || part.starts_with("MIG-")) gpu = std::string(part);
    rest.remove_prefix(part.size());
  }
  return gpu.empty() ? "every shared GPU's MPS server" : "the MPS server of " + gpu;
}

// Where, in the container, a bind mount of `source` at its destination shows `root`, which lies below it.
std::string mask_destination(const Mount& mount, std::string_view source, std::string_view root) {
  return k8s::lexical_path(k8s::lexical_path(mount.destination) + "/" + std::string(root.substr(source.size())));
}

bool masked(const ContainerView& container, std::string_view at) {
  return std::any_of(container.mounts.begin(), container.mounts.end(),
                     [&](const Mount& m) { return is_mask(m) && k8s::lexical_path(m.destination) == at; });
}

// Why an MPS root that a bind mount shows cannot be hidden by a mask over it; empty when it can.
std::string unmaskable(const ContainerView& container, const Mount& mount, bool bound, const std::string& root,
                       const NodeView& node) {
  if (!bound) return "the mount's source is a link, and runc binds where it leads";
  if (!container.masks_checked) {
    return "the runtime (CRI-O) starts a container whose start the enforcer refuses, and the node has no "
           "mask check (gpuguard-node-enforcer --mask-hook-dir), so where runc puts a mask, through the image's "
           "own links, cannot be held to";
  }
  if (mount.destination != k8s::lexical_path(mount.destination)) {
    // runc follows the container's own links before a "..", where the enforcer cannot: the mask would be
    // written somewhere else than the mount.
    return "its mount point is not a plain path (., .., // or a trailing /)";
  }
  if (!node.mps_roots_maskable.contains(root)) {
    return root + " is not a directory on the host, or is reached through a link";
  }
  const bool shared = std::any_of(mount.options.begin(), mount.options.end(),
                                  [](const std::string& o) { return o == "rshared" || o == "shared"; });
  if (shared) return "the mount propagates to the host (Bidirectional), so a mask would hide the root there too";
  return {};
}

// A bind mount of an MPS directory: within only for the container's own GPU's (a MIG device's, or its
// parent's). A bind mount of a directory above an MPS root (`/`, `/run`) shows every shared GPU's MPS
// server: that root gets a mask, where it can, and the container keeps the rest of the mount.
// `bound`: `source` is the host path runc binds (the mount's source where its links lead).
void mps_door(const ContainerView& container, const Mount& mount, std::string_view source, bool bound,
              const Scope& scope, const std::string& door, Findings& findings) {
  const Findings::Kind held = scope.known() ? Findings::Kind::beyond : Findings::Kind::unknown;
  const std::vector<std::string>& roots = scope.node().mps_roots;
  for (const std::string& configured : roots) {
    const std::string root = host_path(configured);
    if (k8s::is_or_under(root, source) && root != source) {
      // A root below another root the mount shows is masked with it (the device plugin's /run/gpuguard/mps
      // under /run/gpuguard): runc could not make its mount point in the read-only mask above it anyway.
      const bool below_another = std::any_of(roots.begin(), roots.end(), [&](const std::string& other) {
        const std::string above = host_path(other);
        return above != root && k8s::is_or_under(root, above) && k8s::is_or_under(above, source) && above != source;
      });
      if (below_another) continue;
      const std::string reach =
          std::string(door).append(" reaches every shared GPU's MPS server (").append(root).append(" lies under it)");
      if (const std::string why_not = unmaskable(container, mount, bound, root, scope.node()); !why_not.empty()) {
        findings.add(std::string(reach).append("; not masked: ").append(why_not), held);
        continue;
      }
      const std::string at = mask_destination(mount, source, root);
      if (masked(container, at)) continue;
      findings.masks.insert(at);
      findings.add(reach + ": masked at " + cut(at, 160), Findings::Kind::writable);
      continue;
    }
    std::string gpu;
    const std::string reach = mps_reach(source, root, gpu);
    if (reach.empty() || (scope.known() && !gpu.empty() && scope.id_allowed(gpu))) continue;
    findings.add(std::string(door).append(" reaches ").append(reach), held);
  }
}

// The host paths a bind mount is judged at: as written, and where its links lead; and the one runc binds.
std::set<std::string> host_sources(const Mount& mount) {
  std::set<std::string> sources = {host_path(mount.source)};
  if (!mount.resolved.empty()) sources.insert(host_path(mount.resolved));
  return sources;
}
std::string bound_source(const Mount& mount) {
  return host_path(mount.resolved.empty() ? mount.source : mount.resolved);
}

// Bind mounts of the host's device nodes, of /dev, of /dev/nvidia-caps or of an MPS directory, judged at
// the host path runc binds: where the source's links lead, and where it says as written.
void bind_mount_door(const ContainerView& container, const Scope& scope, Findings& findings) {
  for (const Mount& mount : container.mounts) {
    device_list_door(mount, scope, findings);
    if (!is_bind(mount)) continue;
    const std::string door =
        "the host's " + cut(k8s::lexical_path(mount.source), 160) + " mounted at " + cut(mount.destination, 96);
    if (!mount.doubt.empty()) {
      findings.add(door + ": " + mount.doubt, Findings::Kind::unknown);
      continue;
    }
    const std::set<std::string> sources = host_sources(mount);
    const std::string bound = bound_source(mount);
    for (const std::string& source : sources) {
      const std::string at = source == host_path(mount.source) ? door : door + " (a link to " + cut(source, 160) + ")";
      mps_door(container, mount, source, source == bound, scope, at, findings);
      if (scope.allocation().device_paths.contains(source)) continue;
      bool unknown = false;
      std::string beyond;
      if (source == "/dev") {
        beyond = scope.every_gpu_beyond(unknown);
        beyond += std::string(beyond.empty() ? "" : ", ") + "every MIG capability and IMEX channel";
      } else if (source == "/dev/nvidia-caps" || source == "/dev/nvidia-caps-imex-channels") {
        beyond = source == "/dev/nvidia-caps" ? "every MIG capability" : "every IMEX channel";
      } else {
        beyond = scope.path_beyond(source, unknown);
      }
      if (!beyond.empty()) {
        findings.add(std::string(at).append(" reaches ").append(beyond),
                     unknown || !scope.known() ? Findings::Kind::unknown : Findings::Kind::beyond);
      }
    }
  }
}

void unread_door(const ContainerView& container, Findings& findings) {
  for (const std::string& what : container.unread) findings.add("not read: " + what, Findings::Kind::unknown);
  if (container.unread_count > container.unread.size()) {
    findings.add("and " + std::to_string(container.unread_count - container.unread.size()) + " more not read",
                 Findings::Kind::unknown);
  }
}

Findings doors(const ContainerView& container, const Scope& scope) {
  Findings findings;
  selection_doors(container, scope, findings);
  annotation_door(container, scope, findings);
  cdi_device_door(container, scope, findings);
  device_node_door(container, scope, findings);
  device_rule_door(container, scope, findings);
  bind_mount_door(container, scope, findings);
  unread_door(container, findings);
  return findings;
}

// --- The answer -------------------------------------------------------------------------------------------

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

std::string masks_text(const std::set<std::string>& masks) {
  std::string text = "an empty read-only tmpfs over the MPS root at ";
  for (const std::string& at : masks) text.append(at == *masks.begin() ? "" : ", ").append(cut(at, 160));
  return text;
}

std::string ask_text(const Allocation& allocation) {
  return "It was allocated " + allocated_text(allocation) + " (" + cut(allocation.detail, kBeyondLineMax) +
         "); request the GPUs it needs, or ask the cluster admin (gpuguard's nodeEnforcement policy)";
}

// A container larger than NRI can send at a registration: refused under enforce, whatever it reaches, so
// that the node's plugins can register again; reported under audit.
Decision oversized_decision(const ContainerView& container, bool audit) {
  Decision decision;
  decision.why = Decision::Why::oversized;
  keep_beyond(decision, "its NRI message is " + std::to_string(container.nri_bytes >> 10) + " KiB, over " +
                            std::to_string(kNriContainerBytesMax >> 10) + " KiB");
  if (audit) {
    decision.message = "would be refused under nodeEnforcement: enforce: " + decision.beyond.front();
    return decision;
  }
  decision.action = Decision::Action::refuse;
  decision.message = refusal(
      container, decision, "is larger than the container runtime can show its NRI plugins at their registration",
      "NRI sends every running container to each plugin when it registers, no fewer than four to a message of "
      "at most 4 MiB, so a container this large would keep every NRI plugin on the node, gpuguard's enforcer "
      "included, from registering again. Make the container smaller: fewer or shorter environment variables, "
      "arguments, mounts or annotations");
  return decision;
}

// A privileged container can make and open any device node, a GPU's MPS server's included (whose clients
// open the GPU's nodes): whatever it is given now, it is counted and reported, never refused, as Pod Security
// `baseline` and the webhook's `privileged` key are what keep it out. An MPS root that a bind mount above it
// shows is masked all the same, as for any container: the mask costs it nothing it asked for.
Decision privileged_decision(const ContainerView& container, const Scope& scope, bool audit) {
  Findings findings;
  for (const Mount& mount : container.mounts) {
    if (!is_bind(mount) || !mount.doubt.empty()) continue;
    const std::string door =
        "the host's " + cut(k8s::lexical_path(mount.source), 160) + " mounted at " + cut(mount.destination, 96);
    const std::set<std::string> sources = host_sources(mount);
    const std::string bound = bound_source(mount);
    for (const std::string& source : sources)
      mps_door(container, mount, source, source == bound, scope, door, findings);
  }
  Decision decision;
  decision.why = Decision::Why::privileged;
  keep_beyond(decision, "every device (its device cgroup allows all: privileged)");
  for (const auto& finding : findings.all) keep_beyond(decision, finding.line);
  if (audit || findings.masks.empty()) return decision;
  decision.action = Decision::Action::adjust;
  decision.masks = std::move(findings.masks);
  decision.message = "privileged, not confined; " + masks_text(decision.masks);
  return decision;
}

}  // namespace

void note_unread(ContainerView& view, std::string what) {
  ++view.unread_count;
  std::string line = cut(std::move(what), 160);
  // Each reason once: a thousand mounts past one bound would otherwise hide the next bound's name.
  if (view.unread.size() < kUnreadKept && std::find(view.unread.begin(), view.unread.end(), line) == view.unread.end())
    view.unread.push_back(std::move(line));
}

namespace {
constexpr std::size_t kUnreadLineMax = 160;

std::size_t string_bytes(const std::string& s) { return sizeof(std::string) + s.size(); }
template <typename Strings>
std::size_t strings_bytes(const Strings& strings) {
  std::size_t bytes = 0;
  for (const std::string& s : strings) bytes += string_bytes(s);
  return bytes;
}
}  // namespace

std::size_t view_bytes(const ContainerView& view) {
  std::size_t bytes = sizeof(ContainerView) + string_bytes(view.pod_namespace) + string_bytes(view.pod_name) +
                      string_bytes(view.pod_uid) + string_bytes(view.container) + string_bytes(view.service_account);
  for (const auto& [key, value] : view.pod_labels) bytes += string_bytes(key) + string_bytes(value) + 64;
  for (const auto& [name, selection] : view.selections) {
    bytes += string_bytes(name) + sizeof(Selection) + selection.last.size() + 64;
  }
  for (const Device& device : view.devices) bytes += sizeof(Device) + device.path.size() + device.type.size();
  bytes += view.device_rules.size() * sizeof(DeviceRule);
  for (const Mount& mount : view.mounts) {
    bytes += sizeof(Mount) + mount.destination.size() + mount.source.size() + mount.type.size() +
             mount.resolved.size() + mount.doubt.size() + strings_bytes(mount.options);
  }
  bytes += strings_bytes(view.cdi_devices);
  for (const auto& [key, name] : view.cdi_annotation_names) bytes += string_bytes(key) + string_bytes(name);
  if (view.allocated_annotation) bytes += view.allocated_annotation->size();
  return bytes + strings_bytes(view.unread);
}

std::size_t view_bytes_max() {
  // Four identity strings, the service account, the labels exemptions name (bounded by the policy, counted
  // here at eight), the selection variables, and each list full of its longest entries.
  const std::size_t name = sizeof(std::string) + kNameMax;
  return sizeof(ContainerView) + 5 * name + 8 * (2 * name + 64) +
         (4 + std::size(kFeatureVariables) + kSwarmMax) * (name + sizeof(Selection) + kValueMax + 64) +
         kListMax * (sizeof(Device) + kNameMax + 1) + kListMax * sizeof(DeviceRule) +
         kMountsMax * (sizeof(Mount) + kPathMax + 2 * kKeptPathMax + 16 + kUnreadLineMax + sizeof(std::string) + 8 +
                       2 * (sizeof(std::string) + 7)) +  // the two options kept, "ro" and "rshared"
         kListMax * name +
         kListMax * 2 * name + kValueMax + kUnreadKept * (sizeof(std::string) + kUnreadLineMax);
}

bool none_honoured(const NodeView& node) {
  const Toolkit& toolkit = node.toolkit;
  if (!toolkit.mode) return false;
  const auto fixed = ToolkitVersion{1, 18, 2};
  const std::string& mode = *toolkit.mode;
  if (mode == "absent") return true;  // no runtime handler runs NVIDIA's runtime: no variable selects anything
  if (mode == "legacy") return true;  // the hook passes no --device (cmd/nvidia-container-runtime-hook main.go)
  if (mode == "jit-cdi") return toolkit.version && *toolkit.version >= fixed;  // #1555, fixed by #1562
  if (mode == "cdi") {
    // <default-kind>=none, resolved through the specs: within only if they define it and it brings no GPU.
    const auto spec = node.cdi_devices.find(toolkit.default_kind + "=none");
    if (spec == node.cdi_devices.end()) return false;
    return std::none_of(spec->second.begin(), spec->second.end(), [](const std::string& path) {
      return path.starts_with(kGpuNode) && path != "/dev/nvidiactl" && path != "/dev/nvidia-uvm" &&
             path != "/dev/nvidia-uvm-tools" && path != "/dev/nvidia-modeset";
    });
  }
  if (mode == "auto") {
    // auto is csv on Tegra; legacy before 1.18.0; jit-cdi from it, with or without a driver
    // (internal/info/auto.go); cdi only where every request is a qualified CDI name, which none is not.
    if (toolkit.tegra || !toolkit.version) return false;
    return *toolkit.version < ToolkitVersion{1, 18, 0} || *toolkit.version >= fixed;
  }
  return false;  // csv gives every device for any request but void (internal/modifier/csv.go), and unknown modes
}

void add_mig_devices_from_cdi(NodeView& node) {
  for (const auto& [name, paths] : node.cdi_devices) {
    const std::size_t equals = name.find('=');
    if (equals == std::string::npos || name.compare(equals + 1, 4, "MIG-") != 0) continue;
    const std::string uuid = name.substr(equals + 1);
    std::optional<unsigned> parent;
    std::vector<unsigned> caps;
    for (const std::string& path : paths) {
      if (const auto cap = cap_minor(path); cap && *cap != kUnknownCap) {
        caps.push_back(*cap);
      } else if (const auto minor = gpu_minor(Device{path, "c", 0, 0})) {
        parent = *minor;
      }
    }
    if (!parent) continue;
    for (discovery::Gpu& gpu : node.gpus) {
      if (gpu.minor == *parent && discovery::find_mig(gpu, uuid) == nullptr) {
        gpu.mig_devices.push_back({uuid, 0, 0, "", caps});  // a CDI spec names no GPU or compute instance
      }
    }
  }
}

bool judged_variable(std::string_view name, const Toolkit& toolkit) {
  return name == kVisibleDevices || name == kImexChannels || name == kCudaVersion || name == kRequireCuda ||
         name == kMigConfigDevices || name == kMigMonitorDevices ||
         std::find(std::begin(kFeatureVariables), std::end(kFeatureVariables), name) != std::end(kFeatureVariables) ||
         std::find(toolkit.swarm_variables.begin(), toolkit.swarm_variables.end(), name) !=
             toolkit.swarm_variables.end();
}

bool judged_annotation(std::string_view key, const Toolkit& toolkit) {
  return std::any_of(toolkit.annotation_prefixes.begin(), toolkit.annotation_prefixes.end(),
                     [&](const std::string& prefix) { return key.starts_with(prefix); });
}

bool judged_device(const Device& device) { return device.major == kNvidiaMajor || device.path.starts_with(kGpuNode); }

bool judged_rule(bool allow, std::string_view type, const DeviceRule& rule) {
  return allow && (type.empty() || type == "a" || type == "c") && (!rule.major || *rule.major == kNvidiaMajor) &&
         (rule.major || rule.minor || type == "c");  // no major and no minor, type a: every device, said apart
}

bool is_bind(const Mount& mount) {
  return mount.type == "bind" || std::any_of(mount.options.begin(), mount.options.end(),
                                             [](const std::string& o) { return o == "bind" || o == "rbind"; });
}

bool is_mask(const Mount& mount) {
  return mount.type == "tmpfs" && !is_bind(mount) &&
         std::find(mount.options.begin(), mount.options.end(), "ro") != mount.options.end();
}

bool judged_mount(const Mount& mount, const NodeView& node) {
  if (is_mask(mount)) return true;
  const std::string destination = k8s::lexical_path(mount.destination);
  for (const std::string_view root : kDeviceListRoots) {
    if (destination.starts_with(root)) return true;
  }
  if (!is_bind(mount)) return false;
  if (!mount.doubt.empty()) return true;
  for (const std::string* written : {&mount.source, &mount.resolved}) {
    if (written->empty()) continue;
    const std::string source = host_path(*written);
    if (source == "/dev" || source.starts_with(kGpuNode)) return true;
    const bool mps = std::any_of(node.mps_roots.begin(), node.mps_roots.end(), [&](const std::string& root) {
      const std::string home = host_path(root);
      return k8s::is_or_under(source, home) || k8s::is_or_under(home, source);
    });
    if (mps) return true;
  }
  return false;
}

ContainerView with_env_set(ContainerView container, const std::map<std::string, std::string>& set_env) {
  for (const auto& [name, value] : set_env) {
    Selection& selection = container.selections[name];
    // The first entry is replaced, a missing one appended; a later entry stays, and stays the last.
    if (selection.entries <= 1) {
      selection.last = value.size() <= kValueMax ? value : std::string();
      selection.last_over = value.size() > kValueMax;
    }
    selection.entries = std::max<std::size_t>(selection.entries, 1);
  }
  return container;
}

namespace {

// One line of a mountinfo (proc(5)): the fields the check reads, paths unescaped.
struct MountLine {
  std::string device, root, point, type;
  bool read_only = false;
};

}  // namespace

std::string mountinfo_path(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isdigit(static_cast<unsigned char>(text[i + 2])) &&
        std::isdigit(static_cast<unsigned char>(text[i + 3]))) {
      out.push_back(static_cast<char>((text[i + 1] - '0') * 64 + (text[i + 2] - '0') * 8 + (text[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

namespace {

std::optional<MountLine> mount_line(std::string_view line) {
  std::vector<std::string_view> fields;
  while (!line.empty()) {
    const std::size_t space = line.find(' ');
    fields.push_back(line.substr(0, space));
    if (space == std::string_view::npos) break;
    line.remove_prefix(space + 1);
  }
  const auto separator = std::find(fields.begin(), fields.end(), "-");
  if (fields.size() < 7 || separator == fields.end() || separator + 1 == fields.end() ||
      separator - fields.begin() < 6) {
    return std::nullopt;
  }
  return MountLine{std::string(fields[2]), mountinfo_path(fields[3]), mountinfo_path(fields[4]),
                   std::string(*(separator + 1)), fields[5] == "ro" || fields[5].starts_with("ro,")};
}

}  // namespace

std::vector<std::string> unmasked_roots(std::string_view mountinfo, const std::vector<NodeView::RootPlace>& places,
                                        const MaskCheck& check) {
  const std::string rootfs = k8s::lexical_path(check.rootfs);
  std::vector<MountLine> mounts;
  while (!mountinfo.empty()) {
    const std::size_t end = mountinfo.find('\n');
    if (auto mount = mount_line(mountinfo.substr(0, end)); mount && k8s::is_or_under(mount->point, rootfs)) {
      mounts.push_back(std::move(*mount));
    }
    if (end == std::string_view::npos) break;
    mountinfo.remove_prefix(end + 1);
  }
  // Where a mask is mounted, and the last line it is on (a mask hides what was mounted before it).
  std::map<std::string, std::size_t, std::less<>> masks;
  for (std::size_t i = 0; i < mounts.size(); ++i) {
    if (mounts[i].type == "tmpfs" && (mounts[i].read_only || !check.masks_read_only)) {
      masks[k8s::lexical_path(mounts[i].point)] = i;
    }
  }
  std::vector<std::string> unmasked;
  for (std::size_t i = 0; i < mounts.size(); ++i) {
    for (const NodeView::RootPlace& place : places) {
      const MountLine& mount = mounts[i];
      if (mount.device != place.device || !k8s::is_or_under(place.path, k8s::lexical_path(mount.root))) continue;
      const std::string root = k8s::lexical_path(mount.root);
      const std::string at = k8s::lexical_path(mount.point + "/" + place.path.substr(root == "/" ? 0 : root.size()));
      // A mask there, or above it (the device plugin's root under gpuguard's, masked with it), mounted after.
      bool hidden = false;
      for (std::string above = at; !hidden; above = std::filesystem::path(above).parent_path().string()) {
        const auto mask = masks.find(above);
        hidden = mask != masks.end() && mask->second > i;
        if (above == "/") break;
      }
      // Said as the container sees it: below its root.
      const std::string seen = rootfs == "/" ? at : k8s::lexical_path("/" + at.substr(rootfs.size()));
      std::string line = cut(seen, 256) + " (" + place.root + ")";
      if (hidden || std::find(unmasked.begin(), unmasked.end(), line) != unmasked.end()) continue;
      unmasked.push_back(std::move(line));
      if (unmasked.size() == kBeyondKept) return unmasked;
    }
  }
  return unmasked;
}

ContainerView with_masks(ContainerView container, const std::set<std::string>& masks) {
  for (const std::string& at : masks) {
    container.mounts.push_back({at, "tmpfs", "tmpfs", {std::begin(kMaskOptions), std::end(kMaskOptions)}, {}, {}});
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
    case Decision::Why::oversized: return "oversized";
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
  if (container.nri_bytes > kNriContainerBytesMax) return oversized_decision(container, audit);
  const bool allow_unknown = policy.node_enforcement_unknown == policy::NodeEnforcementUnknown::allow;
  const Scope scope(node, allocation);
  if (container.all_devices_allowed) return privileged_decision(container, scope, audit);

  Findings findings = doors(container, scope);
  if (findings.all.empty()) return decision;
  for (const auto& finding : findings.all) keep_beyond(decision, finding.line);
  const bool beyond = findings.any(Findings::Kind::beyond);
  const bool unknown = findings.any(Findings::Kind::unknown);
  if (audit) {
    const bool changed = beyond || findings.any(Findings::Kind::writable);
    decision.why = changed ? Decision::Why::audited : Decision::Why::cannot_judge;
    decision.message = changed
                           ? "would be changed under nodeEnforcement: enforce; allocated " + allocated_text(allocation)
                           : "cannot be judged (" + join(decision.beyond, "; ") + "): left so under audit";
    return decision;
  }
  decision.why = Decision::Why::enforced;
  if (!beyond && !unknown) {
    decision.action = Decision::Action::adjust;
    decision.set_env = std::move(findings.set_env);
    decision.masks = std::move(findings.masks);
    std::string change;
    for (const auto& [name, value] : decision.set_env) {
      change.append(change.empty() ? "" : "; ").append(name + " set to " + cut(value.empty() ? "\"\"" : value, 256));
    }
    if (!decision.masks.empty()) change.append(change.empty() ? "" : "; ").append(masks_text(decision.masks));
    decision.message = change + " (was: " + join(decision.beyond, "; ") + ")";
    return decision;
  }
  // What cannot be written stays: the lines are what is left beyond, or what cannot be judged.
  Decision remaining;
  for (const auto& finding : findings.all) {
    if (finding.kind != Findings::Kind::writable) keep_beyond(remaining, finding.line);
  }
  if (!beyond && allow_unknown) {
    // What is left cannot be judged, and the policy lets such a container be: the variables are still written.
    decision.why = Decision::Why::cannot_judge;
    decision.action =
        findings.set_env.empty() && findings.masks.empty() ? Decision::Action::allow : Decision::Action::adjust;
    decision.set_env = std::move(findings.set_env);
    decision.masks = std::move(findings.masks);
    decision.message =
        "cannot be judged (" + join(remaining.beyond, "; ") + "): left so under nodeEnforcementUnknown: allow";
    return decision;
  }
  decision.beyond = std::move(remaining.beyond);
  decision.beyond_count = remaining.beyond_count;
  decision.action = Decision::Action::refuse;
  if (!beyond) {
    decision.why = Decision::Why::cannot_judge;
    const std::string after =
        allocation.source == Allocation::Source::unknown
            ? "The kubelet's allocation could not be read: " + cut(allocation.detail, kBeyondLineMax) +
                  ". The kubelet tries the create again; gpuguard's nodeEnforcementUnknown policy decides this"
            : ask_text(allocation);
    decision.message = refusal(container, decision,
                               allocation.source == Allocation::Source::unknown
                                   ? "would reach GPUs while its allocation cannot be read"
                                   : "would reach GPUs the enforcer cannot prove are its own",
                               after);
    return decision;
  }
  decision.message =
      refusal(container, decision, "would get GPUs the kubelet did not allocate it", ask_text(allocation));
  return decision;
}

}  // namespace gpuguard::enforcement

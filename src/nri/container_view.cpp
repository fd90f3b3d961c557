// NRI's messages as the decision's plain data (include/gpuguard/nri/container_view.hpp).
#include "gpuguard/nri/container_view.hpp"

#include <nlohmann/json.hpp>

#include "gpuguard/enforcement/allocation.hpp"
#include "gpuguard/k8s/host_path.hpp"
#include "gpuguard/nri/messages.hpp"
#include "gpuguard/nri/proto_reader.hpp"

namespace gpuguard::nri {
namespace {

using enforcement::ContainerView;
using enforcement::Device;
using enforcement::DeviceRule;
using enforcement::kKeptPathMax;
using enforcement::kListMax;
using enforcement::kMountsMax;
using enforcement::kNameMax;
using enforcement::kPathMax;
using enforcement::kValueMax;
using enforcement::Mount;
using enforcement::note_unread;

// CRI-O's copy of the container's own annotations is JSON the runtime writes: read up to this much.
constexpr std::size_t kCrioAnnotationsMax = std::size_t{64} << 10;
constexpr std::size_t kOptionMax = 64;
constexpr std::string_view kCudaVersion = "CUDA_VERSION";
constexpr std::string_view kRequireCuda = "NVIDIA_REQUIRE_CUDA";
// Bind mounts of one message whose host paths are followed (each a turn of the node state's path worker);
// past them the container is one the enforcer cannot judge. Kubernetes gives a container a bind mount per
// volume mount and a few of its own: a thousand is more than any pod needs, and costs milliseconds, where
// the 90,000 mounts of one hostPath that fit in a message would cost seconds, past NRI's 2 s.
constexpr std::size_t kBindMountsFollowedMax = 1024;

// A map<string, string> field's entries, each key and value.
template <typename Visit>
bool for_each_entry(std::string_view message, std::uint32_t number, Visit visit) {
  return for_each_field(message, number, [&](std::string_view entry) {
    visit(string_field(entry, field::kMapKey), string_field(entry, field::kMapValue));
  });
}

// int64 fields as protobuf writes them: two's complement in a varint.
std::int64_t as_int64(std::optional<std::uint64_t> value) { return static_cast<std::int64_t>(value.value_or(0)); }

std::string bytes_of(std::size_t size) { return std::to_string(size) + " bytes"; }

template <typename Item>
void keep(std::vector<Item>& list, Item item, ContainerView& view, std::string_view what) {
  if (list.size() < kListMax) {
    list.push_back(std::move(item));
  } else {
    note_unread(view, "more " + std::string(what) + " than " + std::to_string(kListMax));
  }
}

// The one value of gpuguard's allocation key at the top level of CRI-O's JSON copy of the container's own
// annotations, read as a stream: nothing but that value is held.
class AllocatedKeyReader final : public nlohmann::json::json_sax_t {
 public:
  std::optional<std::string> value;
  bool key(string_t& key) override {
    take_next_ = depth_ == 1 && key == enforcement::kAllocatedAnnotation;
    return true;
  }
  bool string(string_t& text) override {
    if (take_next_ && depth_ == 1 && text.size() <= kValueMax) value = text;
    take_next_ = false;
    return true;
  }
  bool start_object(std::size_t /*elements*/) override { return enter(); }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t /*elements*/) override { return enter(); }
  bool end_array() override { return leave(); }
  bool null() override { return scalar(); }
  bool boolean(bool /*val*/) override { return scalar(); }
  bool number_integer(number_integer_t /*val*/) override { return scalar(); }
  bool number_unsigned(number_unsigned_t /*val*/) override { return scalar(); }
  bool number_float(number_float_t /*val*/, const string_t& /*s*/) override { return scalar(); }
  bool binary(binary_t& /*val*/) override { return scalar(); }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::json::exception& /*ex*/) override {
    value.reset();
    return false;
  }

 private:
  bool enter() {
    take_next_ = false;
    return ++depth_ < 64;  // deeper than any annotations the runtime writes: not read on
  }
  bool leave() {
    --depth_;
    return true;
  }
  bool scalar() {
    take_next_ = false;
    return true;
  }
  int depth_ = 0;
  bool take_next_ = false;
};

std::optional<std::string> crio_allocated(std::string_view json) {
  if (json.size() > kCrioAnnotationsMax) return std::nullopt;
  AllocatedKeyReader reader;
  if (!nlohmann::json::sax_parse(json, &reader) || !reader.value) return std::nullopt;
  return reader.value;
}

// What the decoder gathers beside the view, resolved when the message is read through.
struct Reading {
  const enforcement::NodeView& node;
  const HostPathResolver& resolve;
  std::optional<std::string> own_allocated;        // the container's allocation key, as the runtime shows it
  std::optional<std::string> crio_allocated;       // the same key in CRI-O's copy of the container's own
  std::optional<bool> cuda_version, require_cuda;  // the last entry of each: set to a non-empty value
  std::size_t binds_followed = 0;                  // kBindMountsFollowedMax
};

// An annotation's value of CDI names, each with the annotation's key.
void read_cdi_names(ContainerView& view, std::string_view key, std::string_view value) {
  if (key.size() > kNameMax) {
    note_unread(view, "a CDI annotation whose key is " + bytes_of(key.size()));
    return;
  }
  // The toolkit splits the value at each comma, untrimmed (cuda_image.go), as NVIDIA's NRI plugin does: each
  // part is one name.
  while (true) {
    const std::size_t comma = value.find(',');
    const std::string_view part = value.substr(0, comma);
    if (part.size() > kNameMax) {
      note_unread(view,
                  "a CDI name of " + bytes_of(part.size()) + " in the annotation " + std::string(key.substr(0, 64)));
    } else if (view.cdi_annotation_names.size() >= kListMax) {
      note_unread(view, "more CDI names in annotations than " + std::to_string(kListMax));
      return;
    } else {
      view.cdi_annotation_names.emplace_back(key, part);
    }
    if (comma == std::string_view::npos) return;
    value.remove_prefix(comma + 1);
  }
}

void read_annotation(ContainerView& view, Reading& reading, std::string_view key, std::string_view value) {
  if (key == enforcement::kCrioContainerAnnotations) {
    view.crio_annotations = true;
    reading.crio_allocated = crio_allocated(value);
    return;
  }
  if (key == enforcement::kAllocatedAnnotation) {
    reading.own_allocated = value.size() <= kValueMax ? std::optional<std::string>(value) : std::nullopt;
    return;
  }
  if (!enforcement::judged_annotation(key, reading.node.toolkit)) return;
  read_cdi_names(view, key, value);
}

void set_selection(ContainerView& view, std::string_view name, std::string_view value) {
  enforcement::Selection& selection = view.selections[std::string(name)];
  ++selection.entries;
  selection.last_over = value.size() > kValueMax;
  selection.last = selection.last_over ? std::string() : std::string(value);
}

void read_variable(ContainerView& view, Reading& reading, std::string_view entry) {
  const std::size_t equals = entry.find('=');
  if (equals == std::string_view::npos) return;  // NRI's generator drops it; the toolkit fails on it
  const std::string_view name = entry.substr(0, equals);
  const std::string_view value = entry.substr(equals + 1);
  if (name == kCudaVersion) {
    reading.cuda_version = !value.empty();
  } else if (name == kRequireCuda) {
    reading.require_cuda = !value.empty();
  } else if (enforcement::judged_variable(name, reading.node.toolkit)) {
    set_selection(view, name, value);
  }
}

// A mount message, bounded: nullopt (and the view told) when a path is longer than PATH_MAX.
std::optional<Mount> mount_of(std::string_view bytes, ContainerView& view) {
  const std::string_view destination = string_field(bytes, field::kMountDestination);
  const std::string_view source = string_field(bytes, field::kMountSource);
  if (destination.size() > kPathMax || source.size() > kPathMax) {
    note_unread(view, "a mount whose path is longer than PATH_MAX (" +
                          bytes_of(std::max(destination.size(), source.size())) + ")");
    return std::nullopt;
  }
  const std::string_view type = string_field(bytes, field::kMountType);
  bool bind = type == "bind", read_only = false, shared = false;
  for_each_field(bytes, field::kMountOptions, [&](std::string_view option) {
    bind = bind || option == "bind" || option == "rbind";
    if (option == "ro" || option == "rw") read_only = option == "ro";  // the last one says
    shared = shared || option == "rshared" || option == "shared";
  });
  // Whether it binds, is read-only (a mask, is_mask) and propagates to the host is all the decision reads
  // of its type and options: at most two options kept.
  Mount mount{std::string(destination),
              std::string(source),
              bind ? "bind" : std::string(type.substr(0, kOptionMax)),
              {},
              {},
              {}};
  if (read_only) mount.options.emplace_back("ro");
  if (shared) mount.options.emplace_back("rshared");
  return mount;
}

// A mount read: a bind mount's source followed where its links lead, then kept if it may reach a GPU.
void read_mount(ContainerView& view, Reading& reading, std::string_view bytes) {
  std::optional<Mount> mount = mount_of(bytes, view);
  if (!mount) return;
  if (enforcement::is_bind(*mount)) {
    if (reading.binds_followed == kBindMountsFollowedMax) {
      note_unread(view, "more bind mounts than " + std::to_string(kBindMountsFollowedMax));
      return;
    }
    ++reading.binds_followed;
    const std::string lexical = k8s::lexical_path(mount->source);
    enforcement::HostPathResolution where = reading.resolve(lexical);
    if (where.path != lexical) mount->resolved = std::move(where.path);
    mount->doubt = std::move(where.doubt);
  }
  if (!enforcement::judged_mount(*mount, reading.node)) return;
  if (mount->source.size() > kKeptPathMax || mount->resolved.size() > kKeptPathMax) {
    note_unread(view, "a mount of a host path that may reach a GPU, of " +
                          bytes_of(std::max(mount->source.size(), mount->resolved.size())));
    return;
  }
  if (view.mounts.size() >= kMountsMax) {
    note_unread(view, "more mounts that may reach a GPU than " + std::to_string(kMountsMax));
    return;
  }
  view.mounts.push_back(std::move(*mount));
}

void read_device(ContainerView& view, std::string_view bytes) {
  const std::string_view path = string_field(bytes, field::kDevicePath);
  const std::int64_t major = as_int64(varint_field(bytes, field::kDeviceMajor));
  if (path.starts_with('-') || !enforcement::judged_device(Device{std::string(path.substr(0, 16)), {}, major, 0})) {
    return;
  }
  if (path.size() > kNameMax) {
    note_unread(view, "an NVIDIA device node whose path is " + bytes_of(path.size()));
    return;
  }
  keep(view.devices,
       Device{std::string(path), std::string(string_field(bytes, field::kDeviceType).substr(0, 1)), major,
              as_int64(varint_field(bytes, field::kDeviceMinor))},
       view, "NVIDIA device nodes");
}

// A LinuxDeviceCgroup rule: every device allowed ("a", or no type, with no major and minor, as a privileged
// container's cgroup has it), or one the decision reads (judged_rule).
void read_rule(ContainerView& view, std::string_view rule) {
  DeviceRule numbers;
  ProtoReader reader(rule);
  // OptionalInt64 {1 value}: present with 0 when the field is there without a value. runc reads -1 as "*"
  // (libcontainer/devices.Wildcard), as it reads an absent one; any other negative number too, here.
  const auto number = [](std::string_view bytes) -> std::optional<std::int64_t> {
    const auto value = static_cast<std::int64_t>(varint_field(bytes, field::kOptionalValue).value_or(0));
    return value < 0 ? std::nullopt : std::optional<std::int64_t>(value);
  };
  while (reader.next()) {
    if (reader.field() == field::kCgroupMajor) numbers.major = number(reader.bytes());
    if (reader.field() == field::kCgroupMinor) numbers.minor = number(reader.bytes());
  }
  const std::string_view type = string_field(rule, field::kCgroupType);
  const bool allow = varint_field(rule, field::kCgroupAllow).value_or(0) != 0;
  if (allow && (type.empty() || type == "a") && !numbers.major && !numbers.minor) {
    view.all_devices_allowed = true;
  } else if (allow && (type.empty() || type == "a")) {
    // "a" with numbers: cgroup v1 reads it as every device, whatever they are (runc writes "a 195:1 rwm", the
    // kernel takes the "a"); v2's filter as both types of those numbers. Held to the widest: every GPU's
    // node, judged as "c *:*" (not taken for privileged, which would be reported and let through).
    keep(view.device_rules, DeviceRule{}, view, "device cgroup rules for NVIDIA's devices");
  } else if (enforcement::judged_rule(allow, type, numbers)) {
    keep(view.device_rules, numbers, view, "device cgroup rules for NVIDIA's devices");
  }
}

void read_cdi_device(ContainerView& view, std::string_view bytes) {
  const std::string_view name = string_field(bytes, field::kCdiDeviceName);
  if (name.size() > kNameMax) {
    note_unread(view, "a CDI device name of " + bytes_of(name.size()));
    return;
  }
  keep(view.cdi_devices, std::string(name), view, "CDI devices");
}

// NVIDIA's own NRI plugin (nvidia-ctk-installer --enable-nri-plugin) adds, as CDI devices, what the pod's
// annotation names for the container, the key found as NRI's GetEffectiveAnnotation finds it: the
// container's, else the pod's, else the bare domain. Read at the create: a runtime without NRI's validation
// (containerd before 2.2, CRI-O before 1.34) never shows the enforcer what that plugin added.
void read_nvidia_nri_annotation(ContainerView& view, std::string_view pod) {
  constexpr std::string_view kDomain = "nvidia.cdi.k8s.io";
  const std::string keys[] = {std::string(kDomain) + "/container." + view.container, std::string(kDomain) + "/pod",
                              std::string(kDomain)};
  std::optional<std::string_view> values[std::size(keys)];
  for_each_entry(pod, field::kPodAnnotations, [&](std::string_view key, std::string_view value) {
    for (std::size_t i = 0; i < std::size(keys); ++i) {
      if (key == keys[i]) values[i] = value;  // the last of a key, as protobuf's map keeps it
    }
  });
  for (std::size_t i = 0; i < std::size(keys); ++i) {
    if (values[i]) {
      read_cdi_names(view, keys[i], *values[i]);
      return;
    }
  }
}

void finish(ContainerView& view, const Reading& reading) {
  view.allocated_annotation = view.crio_annotations ? reading.crio_allocated : reading.own_allocated;
  if (reading.cuda_version) view.legacy_cuda_image = *reading.cuda_version && !reading.require_cuda.value_or(false);
}

}  // namespace

enforcement::HostPathResolution as_written(std::string_view /*source*/) { return {}; }

PodIdentity pod_identity(std::string_view pod) {
  const auto bounded = [&](std::uint32_t number) { return std::string(string_field(pod, number).substr(0, kNameMax)); };
  return {bounded(field::kPodId), bounded(field::kPodNamespace), bounded(field::kPodName), bounded(field::kPodUid)};
}

ContainerIds container_ids(std::string_view container) {
  return {std::string(string_field(container, field::kContainerId).substr(0, kNameMax)),
          std::string(string_field(container, field::kContainerSandboxId).substr(0, kNameMax))};
}

PodFacts pod_facts(std::string_view pod, const std::set<std::string>& label_keys) {
  PodFacts facts{pod_identity(pod), {}, false, false};
  for (const std::uint32_t number : {field::kPodId, field::kPodNamespace, field::kPodName, field::kPodUid}) {
    facts.oversized = facts.oversized || string_field(pod, number).size() > kNameMax;
  }
  for_each_entry(pod, field::kPodLabels, [&](std::string_view key, std::string_view value) {
    if (value.size() <= kNameMax && label_keys.contains(std::string(key))) facts.labels[std::string(key)] = value;
  });
  for_each_entry(pod, field::kPodAnnotations, [&](std::string_view key, std::string_view /*value*/) {
    facts.allocated_annotation = facts.allocated_annotation || key == enforcement::kAllocatedAnnotation;
  });
  return facts;
}

void set_pod(ContainerView& view, const PodFacts& pod) {
  view.pod_namespace = pod.identity.pod_namespace;
  view.pod_name = pod.identity.name;
  view.pod_uid = pod.identity.uid;
  view.pod_labels = pod.labels;
  view.allocated_annotation_on_pod = pod.allocated_annotation;
  if (pod.oversized)
    note_unread(view, "the pod's name, namespace, UID or ID, over " + std::to_string(kNameMax) + " bytes");
}

std::optional<ContainerView> view_of(std::string_view pod, std::string_view container,
                                     const enforcement::NodeView& node, const std::set<std::string>& label_keys,
                                     const HostPathResolver& resolve) {
  if (!well_formed(pod)) return std::nullopt;
  std::optional<ContainerView> view = container_view(container, node, resolve);
  if (view) {
    set_pod(*view, pod_facts(pod, label_keys));
    read_nvidia_nri_annotation(*view, pod);
  }
  return view;
}

std::optional<ContainerView> container_view(std::string_view container, const enforcement::NodeView& node,
                                            const HostPathResolver& resolve) {
  if (!well_formed(container)) return std::nullopt;
  ContainerView view;
  view.nri_bytes = container.size();
  Reading reading{node, resolve, {}, {}, {}, {}, 0};
  const std::string_view name = string_field(container, field::kContainerName);
  view.container = std::string(name.substr(0, kNameMax));
  if (name.size() > kNameMax) note_unread(view, "the container's name, of " + bytes_of(name.size()));
  for_each_entry(container, field::kContainerAnnotations,
                 [&](std::string_view key, std::string_view value) { read_annotation(view, reading, key, value); });
  for_each_field(container, field::kContainerEnv, [&](std::string_view entry) { read_variable(view, reading, entry); });
  // A container over the size the decision refuses is refused whatever its mounts are: they are not
  // followed, which would cost time in proportion to what was sent.
  if (container.size() <= enforcement::kNriContainerBytesMax) {
    for_each_field(container, field::kContainerMounts,
                   [&](std::string_view bytes) { read_mount(view, reading, bytes); });
  }
  for_each_field(container, field::kContainerLinux, [&](std::string_view linux_part) {
    for_each_field(linux_part, field::kLinuxDevices, [&](std::string_view bytes) { read_device(view, bytes); });
    for_each_field(linux_part, field::kLinuxResources, [&](std::string_view resources) {
      for_each_field(resources, field::kResourcesDevices, [&](std::string_view rule) { read_rule(view, rule); });
    });
  });
  for_each_field(container, field::kContainerCdiDevices, [&](std::string_view bytes) { read_cdi_device(view, bytes); });
  finish(view, reading);
  return view;
}

bool apply_adjustment(ContainerView& view, std::string_view adjustment, const enforcement::NodeView& node,
                      const HostPathResolver& resolve) {
  if (!well_formed(adjustment)) return false;
  Reading reading{node, resolve, {}, {}, {}, {}, 0};
  std::map<std::string, std::string> set_env;
  for_each_field(adjustment, field::kAdjustEnv, [&](std::string_view pair) {
    const std::string_view key = string_field(pair, field::kKeyValueKey);
    // A removal reaches the runtime only with a set of the same key, which it comes before.
    if (key.starts_with('-') || !enforcement::judged_variable(key, node.toolkit) || key == kCudaVersion ||
        key == kRequireCuda) {
      return;
    }
    const std::string_view value = string_field(pair, field::kKeyValueValue);
    set_env[std::string(key)] = std::string(value.substr(0, kValueMax + 1));  // longer reads as over
  });
  view = enforcement::with_env_set(std::move(view), set_env);
  for_each_field(adjustment, field::kAdjustMounts, [&](std::string_view bytes) {
    const std::string_view destination = string_field(bytes, field::kMountDestination);
    if (destination.starts_with('-')) {
      // RemoveMount takes the first mount at exactly that destination.
      const std::string_view removed = destination.substr(1);
      const auto found = std::find_if(view.mounts.begin(), view.mounts.end(),
                                      [&](const Mount& m) { return m.destination == removed; });
      if (found != view.mounts.end()) view.mounts.erase(found);
      return;
    }
    read_mount(view, reading, bytes);
  });
  for_each_field(adjustment, field::kAdjustLinux, [&](std::string_view linux_part) {
    for_each_field(linux_part, field::kAdjustLinuxDevices, [&](std::string_view bytes) { read_device(view, bytes); });
    for_each_field(linux_part, field::kAdjustLinuxResources, [&](std::string_view resources) {
      for_each_field(resources, field::kResourcesDevices, [&](std::string_view rule) { read_rule(view, rule); });
    });
  });
  for_each_field(adjustment, field::kAdjustCdiDevices, [&](std::string_view bytes) { read_cdi_device(view, bytes); });
  for_each_entry(adjustment, field::kAdjustAnnotations, [&](std::string_view key, std::string_view value) {
    if (!key.starts_with('-') && enforcement::judged_annotation(key, node.toolkit))
      read_annotation(view, reading, key, value);
  });
  return true;
}

}  // namespace gpuguard::nri

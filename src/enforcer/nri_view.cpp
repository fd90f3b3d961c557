// NRI's messages to and from the decision's plain data (include/gpuguard/enforcer/nri_view.hpp).
#include "gpuguard/enforcer/nri_view.hpp"

#include "gpuguard/enforcer/allocation.hpp"
#include "gpuguard/nri/messages.hpp"
#include "gpuguard/nri/proto_reader.hpp"

namespace gpuguard::enforcer {
namespace {

namespace field = nri::field;
using nri::ProtoReader;

// A map<string, string> field's entries, each key and value.
template <typename Visit>
bool for_each_entry(std::string_view message, std::uint32_t number, Visit visit) {
  return nri::for_each_field(message, number, [&](std::string_view entry) {
    visit(nri::string_field(entry, field::kMapKey), nri::string_field(entry, field::kMapValue));
  });
}

// int64 fields as protobuf writes them: two's complement in a varint.
std::int64_t as_int64(std::optional<std::uint64_t> value) { return static_cast<std::int64_t>(value.value_or(0)); }

Device device_of(std::string_view bytes) {
  return {std::string(nri::string_field(bytes, field::kDevicePath)),
          std::string(nri::string_field(bytes, field::kDeviceType)),
          as_int64(nri::varint_field(bytes, field::kDeviceMajor)),
          as_int64(nri::varint_field(bytes, field::kDeviceMinor))};
}

Mount mount_of(std::string_view bytes) {
  Mount mount{std::string(nri::string_field(bytes, field::kMountDestination)),
              std::string(nri::string_field(bytes, field::kMountSource)),
              std::string(nri::string_field(bytes, field::kMountType)),
              {}};
  nri::for_each_field(bytes, field::kMountOptions, [&](std::string_view option) {
    if (mount.options.size() < kViewListMax) mount.options.emplace_back(option);
  });
  return mount;
}

template <typename Item>
void keep(std::vector<Item>& list, Item item, ContainerView& view) {
  if (list.size() < kViewListMax) {
    list.push_back(std::move(item));
  } else {
    ++view.unkept;
  }
}

void keep_annotation(ContainerView& view, std::string_view key, std::string_view value, const Toolkit& toolkit) {
  if (!judged_annotation(key, toolkit)) return;
  if (view.annotations.size() >= kViewListMax && !view.annotations.contains(std::string(key))) {
    ++view.unkept;
    return;
  }
  if (value.size() > kViewValueMax) {
    // Too long to read: CRI-O's copy of the container's annotations is then kept as not parsable (no
    // allocation annotation is trusted from it); any other is a door that cannot be read.
    if (key != kCrioContainerAnnotations) ++view.unkept;
    value = {};
  }
  view.annotations[std::string(key)] = std::string(value);
}

void set_variable(ContainerView& view, std::string_view entry, const Toolkit& toolkit) {
  const std::size_t equals = entry.find('=');
  const std::string_view name = entry.substr(0, equals);
  if (!judged_variable(name, toolkit)) return;
  EnvVariable& variable = view.env[std::string(name)];
  if (equals == std::string_view::npos) {
    variable.bare = true;
    return;
  }
  const std::string_view value = entry.substr(equals + 1);
  ++variable.entries;
  variable.last_cut = value.size() > kViewValueMax;
  variable.last = std::string(value.substr(0, kViewValueMax));
}

// A LinuxDeviceCgroup rule: every device allowed ("a", or no type, with no major and minor, as a privileged
// container's cgroup has it), or one the decision reads (judged_rule).
void read_rule(std::string_view rule, ContainerView& view) {
  DeviceRule numbers;
  ProtoReader reader(rule);
  while (reader.next()) {
    // OptionalInt64 {1 value}: present with 0 when the field is there without a value.
    if (reader.field() == field::kCgroupMajor) {
      numbers.major = static_cast<std::int64_t>(nri::varint_field(reader.bytes(), 1).value_or(0));
    }
    if (reader.field() == field::kCgroupMinor) {
      numbers.minor = static_cast<std::int64_t>(nri::varint_field(reader.bytes(), 1).value_or(0));
    }
  }
  const std::string_view type = nri::string_field(rule, field::kCgroupType);
  const bool allow = nri::varint_field(rule, field::kCgroupAllow).value_or(0) != 0;
  if (allow && (type.empty() || type == "a") && !numbers.major && !numbers.minor) {
    view.all_devices_allowed = true;
  } else if (judged_rule(allow, type, numbers)) {
    keep(view.device_rules, numbers, view);
  }
}

}  // namespace

PodIdentity pod_identity(std::string_view pod) {
  return {std::string(nri::string_field(pod, field::kPodId)), std::string(nri::string_field(pod, field::kPodNamespace)),
          std::string(nri::string_field(pod, field::kPodName)), std::string(nri::string_field(pod, field::kPodUid))};
}

ContainerIds container_ids(std::string_view container) {
  return {std::string(nri::string_field(container, field::kContainerId)),
          std::string(nri::string_field(container, field::kContainerSandboxId))};
}

PodFacts pod_facts(std::string_view pod, const std::set<std::string>& label_keys) {
  PodFacts facts{pod_identity(pod), {}, {}};
  for_each_entry(pod, field::kPodLabels, [&](std::string_view key, std::string_view value) {
    if (label_keys.contains(std::string(key)))
      facts.labels[std::string(key)] = std::string(value.substr(0, kViewValueMax));
  });
  for_each_entry(pod, field::kPodAnnotations, [&](std::string_view key, std::string_view value) {
    if (key == kAllocatedAnnotation) facts.annotations[std::string(key)] = std::string(value.substr(0, kViewValueMax));
  });
  return facts;
}

void set_pod(ContainerView& view, const PodFacts& pod) {
  view.pod_namespace = pod.identity.pod_namespace;
  view.pod_name = pod.identity.name;
  view.pod_uid = pod.identity.uid;
  view.pod_labels = pod.labels;
  view.pod_annotations = pod.annotations;
}

std::optional<ContainerView> view_of(std::string_view pod, std::string_view container, const NodeView& node,
                                     const std::set<std::string>& label_keys) {
  if (!nri::well_formed(pod)) return std::nullopt;
  std::optional<ContainerView> view = container_view(container, node);
  if (view) set_pod(*view, pod_facts(pod, label_keys));
  return view;
}

std::optional<ContainerView> container_view(std::string_view container, const NodeView& node) {
  if (!nri::well_formed(container)) return std::nullopt;
  const Toolkit& toolkit = node.toolkit;
  ContainerView view;
  view.container = std::string(nri::string_field(container, field::kContainerName));
  for_each_entry(container, field::kContainerAnnotations,
                 [&](std::string_view key, std::string_view value) { keep_annotation(view, key, value, toolkit); });
  nri::for_each_field(container, field::kContainerEnv,
                      [&](std::string_view entry) { set_variable(view, entry, toolkit); });
  nri::for_each_field(container, field::kContainerMounts, [&](std::string_view bytes) {
    Mount mount = mount_of(bytes);
    if (judged_mount(mount, node)) keep(view.mounts, std::move(mount), view);
  });
  nri::for_each_field(container, field::kContainerLinux, [&](std::string_view linux_part) {
    nri::for_each_field(linux_part, field::kLinuxDevices, [&](std::string_view bytes) {
      Device device = device_of(bytes);
      if (judged_device(device)) keep(view.devices, std::move(device), view);
    });
    nri::for_each_field(linux_part, field::kLinuxResources, [&](std::string_view resources) {
      nri::for_each_field(resources, field::kResourcesDevices, [&](std::string_view rule) { read_rule(rule, view); });
    });
  });
  nri::for_each_field(container, field::kContainerCdiDevices, [&](std::string_view device) {
    keep(view.cdi_devices, std::string(nri::string_field(device, field::kCdiDeviceName)), view);
  });
  return view;
}

bool apply_adjustment(ContainerView& view, std::string_view adjustment, const NodeView& node) {
  if (!nri::well_formed(adjustment)) return false;
  const Toolkit& toolkit = node.toolkit;
  std::map<std::string, std::string> set_env;
  nri::for_each_field(adjustment, field::kAdjustEnv, [&](std::string_view pair) {
    const std::string_view key = nri::string_field(pair, field::kKeyValueKey);
    // A removal reaches the runtime only with a set of the same key, which it comes before.
    if (key.starts_with('-') || !judged_variable(key, toolkit)) return;
    const std::string_view value = nri::string_field(pair, field::kKeyValueValue);
    if (value.size() > kViewValueMax) {
      ++view.unkept;
      return;
    }
    set_env[std::string(key)] = std::string(value);
  });
  view = with_env_set(std::move(view), set_env);
  nri::for_each_field(adjustment, field::kAdjustMounts, [&](std::string_view bytes) {
    Mount mount = mount_of(bytes);
    if (mount.destination.starts_with('-')) {
      // RemoveMount takes the first mount at that destination.
      const std::string destination = mount.destination.substr(1);
      const auto found = std::find_if(view.mounts.begin(), view.mounts.end(),
                                      [&](const Mount& m) { return m.destination == destination; });
      if (found != view.mounts.end()) view.mounts.erase(found);
      return;
    }
    if (judged_mount(mount, node)) keep(view.mounts, std::move(mount), view);
  });
  nri::for_each_field(adjustment, field::kAdjustLinux, [&](std::string_view linux_part) {
    nri::for_each_field(linux_part, field::kAdjustLinuxDevices, [&](std::string_view bytes) {
      Device device = device_of(bytes);
      if (!device.path.starts_with('-') && judged_device(device)) keep(view.devices, std::move(device), view);
    });
    nri::for_each_field(linux_part, field::kAdjustLinuxResources, [&](std::string_view resources) {
      nri::for_each_field(resources, field::kResourcesDevices, [&](std::string_view rule) { read_rule(rule, view); });
    });
  });
  nri::for_each_field(adjustment, field::kAdjustCdiDevices, [&](std::string_view device) {
    keep(view.cdi_devices, std::string(nri::string_field(device, field::kCdiDeviceName)), view);
  });
  for_each_entry(adjustment, field::kAdjustAnnotations, [&](std::string_view key, std::string_view value) {
    if (!key.starts_with('-')) keep_annotation(view, key, value, toolkit);
  });
  return true;
}

}  // namespace gpuguard::enforcer

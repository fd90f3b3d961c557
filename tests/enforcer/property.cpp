// The node enforcer's property over generated containers (property.hpp).
#include "property.hpp"

#include <algorithm>
#include <sstream>

#include "gpuguard/nri/container_view.hpp"
#include "proto_writer.hpp"

namespace gpuguard::test::property {
namespace {

using toolkit::Config;

const std::vector<std::tuple<int, int, int>> kVersions = {{1, 17, 8}, {1, 18, 0}, {1, 18, 1}, {1, 18, 2}, {1, 20, 1}};
const std::vector<std::string> kModes = {"legacy", "cdi", "jit-cdi", "csv", "auto"};
constexpr const char* kDevicesRoot = "/var/run/nvidia-container-devices";

std::string uuid(const char* kind, int n) {
  std::ostringstream out;
  out << kind << "-" << n << n << n << n << "0000-0000-4000-8000-00000000000" << n;
  return out.str();
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const std::string& item : items) out.append(out.empty() ? "" : separator).append(item);
  return out;
}

// The ways a device variable's value names devices, drawn from what the toolkit reads.
std::string device_value(Choices& c, const Case& made) {
  std::vector<std::string> ids = {"all",
                                  "none",
                                  "void",
                                  "",
                                  " , ",
                                  "ALL",
                                  "0,void",
                                  "none,all",
                                  "all,none",
                                  "0,1,0",
                                  "0",
                                  "1",
                                  "2",
                                  "0,1",
                                  "1:0",
                                  "0:1",
                                  "1:0.0",    // MIG device 0 of GPU 1 to the CLI's sscanf("%lu:%lu")
                                  "01:00.0",  // the same, and a PCI bus id to a reader that takes one
                                  "1:0:0",    // sscanf's PCI form, and then its MIG form
                                  " 1:0",
                                  "+1:0",
                                  "0:10:0",  // a PCI bus id without its function: sscanf reads three numbers
                                  "0:10:00.0",
                                  "/var/run/nvidia-container-devices",
                                  "nvidia.com/gpu=all",
                                  "nvidia.com/gpu=0",
                                  "nvidia.com/gpu=none",
                                  "runtime.nvidia.com/gpu=all",
                                  "runtime.nvidia.com/gpu=1",
                                  "management.nvidia.com/gpu=all",
                                  "bogus",
                                  "channel0"};
  for (const auto& gpu : made.node.gpus) {
    ids.push_back(gpu.uuid);
    ids.push_back(gpu.uuid + "::1");
    ids.push_back(gpu.pci_address);
    std::string lower = gpu.uuid;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
    ids.push_back(lower);
    for (const auto& mig : gpu.mig_devices) ids.push_back(mig.uuid);
  }
  std::vector<std::string> parts;
  const std::size_t count = 1 + c.pick(3);
  for (std::size_t i = 0; i < count; ++i) parts.push_back(c.one_of(ids));
  return join(parts, c.chance(20) ? " , " : ",");
}

void add_env(Case& made, const std::string& entry) {
  made.spec.env.push_back(entry);
  made.story += "  env " + entry + "\n";
}

void add_mount(Case& made, const std::string& source, const std::string& destination) {
  made.spec.mounts.push_back({destination, source, "bind", {"rbind", "ro"}, {}, {}});
  made.story += "  mount " + source + " at " + destination + "\n";
}

void add_device(Case& made, const std::string& path, std::int64_t major, std::int64_t minor) {
  made.spec.devices.push_back({path, "c", major, minor});
  made.spec.cgroup_allows.emplace_back(major, minor);  // the runtime allows each device it adds
  made.story += "  device " + path + " " + std::to_string(major) + ":" + std::to_string(minor) + "\n";
}

// A device list entry's destination for a name, written as an attacker might.
std::string list_destination(Choices& c, const std::string& name) {
  switch (c.pick(5)) {
    case 0: return std::string("//var/run/nvidia-container-devices/x/../") + name;
    case 1: return std::string(kDevicesRoot) + name;  // glued: the toolkit's prefix test takes it
    case 2: return std::string("/run/nvidia-container-devices/") + name;
    case 3: return std::string(kDevicesRoot) + "/./" + name + "/";
    default: return std::string(kDevicesRoot) + "/" + name;
  }
}

// The node's toolkit, what the enforcer reads of it, and every toolkit that reading allows.
void make_toolkit(Choices& c, Case& made) {
  Config actual;
  actual.mode = c.one_of(kModes);
  actual.version = c.one_of(kVersions);
  if (actual.mode == "jit-cdi" && actual.version < std::tuple{1, 18, 0}) actual.mode = "auto";
  actual.volume_mounts = c.chance(50);
  actual.envvar_when_unprivileged = c.chance(70);
  if (c.chance(10)) actual.swarm = {"DOCKER_RESOURCE_GPU"};
  made.known.toolkit.swarm_variables = actual.swarm;
  const bool mode_known = c.chance(60);
  const bool version_known = c.chance(60);
  if (mode_known) made.known.toolkit.mode = actual.mode;  // as configured: auto is not resolved
  if (version_known) {
    const auto [a, b, d] = actual.version;
    made.known.toolkit.version = enforcement::ToolkitVersion{a, b, d};
  }
  // Every toolkit the enforcer's reading allows: the settings it does not read all vary.
  for (const std::string& mode : kModes) {
    for (const auto& version : kVersions) {
      if (mode == "jit-cdi" && version < std::tuple{1, 18, 0}) continue;
      if (version_known && version != actual.version) continue;
      if (mode_known && mode != *made.known.toolkit.mode) continue;
      for (const bool mounts : {false, true}) {
        for (const bool envvar : {false, true}) {
          Config config;
          config.mode = mode;
          config.version = version;
          config.volume_mounts = mounts;
          config.envvar_when_unprivileged = envvar;
          config.swarm = actual.swarm;
          made.configs.push_back(config);
        }
      }
    }
  }
}

void make_node(Choices& c, Case& made) {
  const std::size_t gpus = 1 + c.pick(3);
  for (std::size_t i = 0; i < gpus; ++i) {
    discovery::Gpu gpu{
        uuid("GPU", static_cast<int>(i)), static_cast<unsigned>(i), "0000:" + std::to_string(10 + i) + ":00.0", {}};
    made.node.cdi["nvidia.com/gpu=" + std::to_string(i)] = {"/dev/nvidia" + std::to_string(i)};
    made.node.cdi["nvidia.com/gpu=" + gpu.uuid] = {"/dev/nvidia" + std::to_string(i)};
    made.node.gpus.push_back(std::move(gpu));
  }
  if (c.chance(30)) {  // the last GPU in MIG mode, with two MIG devices
    discovery::Gpu& gpu = made.node.gpus.back();
    gpu.mig_enabled = true;
    gpu.mig_listed = true;
    for (int j = 0; j < 2; ++j) {
      const std::string mig = uuid("MIG", 5 + j);
      const unsigned gi = 20 + 2 * static_cast<unsigned>(j), ci = gi + 1;
      gpu.mig_devices.push_back({mig, 0, 0, "", {gi, ci}});
      const std::vector<std::string> nodes = {"/dev/nvidia" + std::to_string(gpu.minor),
                                              "/dev/nvidia-caps/nvidia-cap" + std::to_string(gi),
                                              "/dev/nvidia-caps/nvidia-cap" + std::to_string(ci)};
      made.node.cdi["nvidia.com/gpu=" + mig] = nodes;
      made.node.cdi["nvidia.com/gpu=" + std::to_string(gpu.minor) + ":" + std::to_string(j)] = nodes;
    }
  }
  std::vector<std::string> every;
  for (const auto& gpu : made.node.gpus) every.push_back("/dev/nvidia" + std::to_string(gpu.minor));
  made.node.cdi["nvidia.com/gpu=all"] = every;
  if (c.chance(50)) made.node.cdi["nvidia.com/gpu=none"] = {};
  made.node.imex_channels = {0, 1};
  made.node.cdi["compute-domain.nvidia.com/channel=channel-0"] = {"/dev/nvidia-caps-imex-channels/channel0"};

  // What the enforcer reads of it: the GPUs (with MIG devices where NVML is there, or named by the CDI specs),
  // or none at all; the toolkit's mode and version, or not.
  made.known.gpus = made.node.gpus;
  if (c.chance(20)) {
    for (auto& gpu : made.known.gpus) {  // no NVML: the specs may still name them
      gpu.mig_devices.clear();
      gpu.mig_listed = false;
    }
  }
  if (c.chance(5)) {
    made.known.gpus.clear();
    made.known.gpus_unknown = "the driver lists no GPU";
  }
  for (const auto& [name, nodes] : made.node.cdi) {
    if (c.chance(90)) made.known.cdi_devices[name] = nodes;
  }
  enforcement::add_mig_devices_from_cdi(made.known);

  make_toolkit(c, made);
}

void make_allocation(Choices& c, Case& made) {
  made.allocation.source =
      c.chance(90) ? enforcement::Allocation::Source::pod_resources : enforcement::Allocation::Source::unknown;
  if (made.allocation.source == enforcement::Allocation::Source::unknown) return;
  for (const auto& gpu : made.node.gpus) {
    if (!gpu.mig_devices.empty()) {
      if (c.chance(40)) made.allocation.gpus.insert(gpu.mig_devices.front().uuid);
    } else if (c.chance(40)) {
      made.allocation.gpus.insert(gpu.uuid);
    }
  }
  if (c.chance(10)) {
    made.allocation.cdi_devices.insert("compute-domain.nvidia.com/channel=channel-0");
    made.allocation.device_paths.insert("/dev/nvidia-caps-imex-channels/channel0");
  }
}

// What a device plugin, or a DRA driver, gives the container for its allocation.
void plugin_part(Choices& c, Case& made) {
  std::vector<std::string> ids(made.allocation.gpus.begin(), made.allocation.gpus.end());
  switch (c.pick(5)) {
    case 0:  // envvar strategy: the variable, and the nodes
      if (!ids.empty()) add_env(made, "NVIDIA_VISIBLE_DEVICES=" + join(ids, ","));
      [[fallthrough]];
    case 1:  // device specs
      for (const auto& gpu : made.node.gpus) {
        if (made.allocation.gpus.contains(gpu.uuid))
          add_device(made, "/dev/nvidia" + std::to_string(gpu.minor), 195, gpu.minor);
        for (const auto& mig : gpu.mig_devices) {
          if (!made.allocation.gpus.contains(mig.uuid)) continue;
          add_device(made, "/dev/nvidia" + std::to_string(gpu.minor), 195, gpu.minor);
          for (unsigned cap : mig.cap_minors)
            add_device(made, "/dev/nvidia-caps/nvidia-cap" + std::to_string(cap), 238, cap);
        }
      }
      break;
    case 2:  // volume-mounts strategy
      for (const std::string& id : ids) add_mount(made, "/dev/null", std::string(kDevicesRoot) + "/" + id);
      if (!ids.empty()) add_env(made, std::string("NVIDIA_VISIBLE_DEVICES=") + kDevicesRoot);
      break;
    case 3:  // cdi-annotations strategy
      for (const std::string& id : ids) {
        made.spec.annotations["cdi.k8s.io/nvidia-device-plugin_" + id] = "nvidia.com/gpu=" + id;
        made.story += "  annotation cdi.k8s.io/nvidia-device-plugin_" + id + "\n";
      }
      break;
    default: break;
  }
  if (made.allocation.device_paths.contains("/dev/nvidia-caps-imex-channels/channel0")) {
    add_device(made, "/dev/nvidia-caps-imex-channels/channel0", 234, 0);
    if (c.chance(50)) add_env(made, "NVIDIA_IMEX_CHANNELS=0");
  }
}

// The image's variables, then what an attacker adds: each door the toolkit reads, in its forms.
void attack_part(Choices& c, Case& made) {
  switch (c.pick(4)) {
    case 0: add_env(made, "CUDA_VERSION=11.0.3"); break;  // a legacy image
    case 1:
      add_env(made, "CUDA_VERSION=12.4.1");
      add_env(made, "NVIDIA_REQUIRE_CUDA=cuda>=12.4");
      break;
    case 2: add_env(made, "NVIDIA_VISIBLE_DEVICES=all"); break;  // an image's ENV
    default: break;
  }
  const std::size_t doors = c.pick(4);
  for (std::size_t i = 0; i < doors; ++i) {
    switch (c.pick(12)) {
      case 0: add_env(made, "NVIDIA_VISIBLE_DEVICES=" + device_value(c, made)); break;
      case 1: add_env(made, c.chance(50) ? "NVIDIA_VISIBLE_DEVICES" : "NVIDIA_VISIBLE_DEVICES="); break;
      case 2:
        add_env(made, "NVIDIA_IMEX_CHANNELS=" +
                          c.one_of(std::vector<std::string>{"0", "1", "all", "none", "void", "channel1", "0,1"}));
        break;
      case 3: add_env(made, "DOCKER_RESOURCE_GPU=" + device_value(c, made)); break;
      case 4: {
        const std::string name = c.chance(20)   ? "imex/" + c.one_of(std::vector<std::string>{"0", "1", "all"})
                                 : c.chance(20) ? "cdi/nvidia.com/gpu/" + std::to_string(c.pick(3))
                                                : device_value(c, made);
        add_mount(made, c.chance(85) ? "/dev/null" : "/tmp/file", list_destination(c, name));
        break;
      }
      case 5: {
        const unsigned minor = static_cast<unsigned>(c.pick(3));
        add_device(made, c.chance(80) ? "/dev/nvidia" + std::to_string(minor) : "/dev/gpu" + std::to_string(minor), 195,
                   minor);
        break;
      }
      case 6:
        add_device(made, "/dev/nvidia-caps/nvidia-cap" + std::to_string(20 + c.pick(4)), 238,
                   static_cast<std::int64_t>(20 + c.pick(4)));
        break;
      case 7: add_device(made, "/dev/nvidia-caps-imex-channels/channel1", 234, 1); break;
      case 8: {  // a device cgroup rule, with which CAP_MKNOD makes the node
        std::optional<std::int64_t> minor;
        if (c.chance(70)) minor = static_cast<std::int64_t>(c.pick(3));
        made.spec.cgroup_allows.emplace_back(195, minor);
        made.story += "  cgroup allow c 195:" + (minor ? std::to_string(*minor) : std::string("*")) + "\n";
        break;
      }
      case 9: {
        const std::string value = c.one_of(std::vector<std::string>{
            "nvidia.com/gpu=all", "nvidia.com/gpu=1", "1", "", "all", "nvidia.com/gpu=0,nvidia.com/gpu=1",
            "runtime.nvidia.com/gpu=all", "management.nvidia.com/gpu=all"});
        made.spec.annotations["cdi.k8s.io/x"] = value;
        made.story += "  annotation cdi.k8s.io/x=" + value + "\n";
        break;
      }
      case 10:
        add_mount(made, c.one_of(std::vector<std::string>{"/dev", "/dev/nvidia1", "/dev/nvidia-caps"}), "/host-dev");
        break;
      default:
        made.spec.cap_sys_admin = true;
        made.story += "  CAP_SYS_ADMIN\n";
        break;
    }
  }
}

// The container as NRI's Container message (api.proto v0.12.3's field numbers), as the runtime writes it.
std::string container_message(const toolkit::Spec& spec) {
  ProtoWriter container;
  container.bytes(1, "ctr").bytes(3, "app");
  for (const auto& [key, value] : spec.annotations) container.message(6, ProtoWriter().bytes(1, key).bytes(2, value));
  for (const std::string& entry : spec.env) container.bytes(8, entry);
  for (const enforcement::Mount& m : spec.mounts) {
    ProtoWriter mount;
    mount.bytes(1, m.destination).bytes(2, m.type).bytes(3, m.source);
    for (const std::string& option : m.options) mount.bytes(4, option);
    container.message(9, mount);
  }
  ProtoWriter linux_part, resources;
  for (const enforcement::Device& d : spec.devices) {
    linux_part.message(2, ProtoWriter()
                              .bytes(1, d.path)
                              .bytes(2, d.type)
                              .varint(3, static_cast<std::uint64_t>(d.major))
                              .varint(4, static_cast<std::uint64_t>(d.minor)));
  }
  resources.message(7, ProtoWriter().varint(1, 0).bytes(5, "rwm"));  // deny every device, then allow
  for (const auto& [major, minor] : spec.cgroup_allows) {
    ProtoWriter rule;
    rule.varint(1, 1).bytes(2, "c");
    if (major) rule.message(3, ProtoWriter().varint(1, static_cast<std::uint64_t>(*major)));
    if (minor) rule.message(4, ProtoWriter().varint(1, static_cast<std::uint64_t>(*minor)));
    resources.message(7, rule.bytes(5, "rwm"));
  }
  if (spec.every_device) resources.message(7, ProtoWriter().varint(1, 1).bytes(5, "rwm"));
  linux_part.message(3, resources);
  container.message(11, linux_part);
  return container.str();
}

}  // namespace

Case generate(Choices& c) {
  Case made;
  make_node(c, made);
  make_allocation(c, made);
  plugin_part(c, made);
  attack_part(c, made);
  if (c.chance(3)) {
    made.spec.every_device = true;
    made.story += "  privileged\n";
  }
  made.pod = ProtoWriter().bytes(1, "sandbox").bytes(2, "pod").bytes(3, "uid").bytes(4, "team-a").str();
  made.container = container_message(made.spec);
  made.story.insert(
      0, "allocated: " + join(std::vector<std::string>(made.allocation.gpus.begin(), made.allocation.gpus.end()), ",") +
             (made.allocation.source == enforcement::Allocation::Source::unknown ? " (unknown)" : "") + "\n");
  return made;
}

std::vector<std::string> apply_env(const std::vector<std::string>& env,
                                   const std::map<std::string, std::string>& set_env) {
  if (set_env.empty()) return env;
  std::map<std::string, std::string> pending = set_env;
  std::vector<std::string> out;
  const auto add = [&out](const std::string& name, const std::string& entry) {  // AddProcessEnv
    const auto same =
        std::find_if(out.begin(), out.end(), [&](const std::string& e) { return e.starts_with(name + "="); });
    if (same != out.end()) {
      *same = entry;
    } else {
      out.push_back(entry);
    }
  };
  for (const std::string& entry : env) {
    const std::size_t equals = entry.find('=');
    if (equals == std::string::npos) continue;
    const std::string name = entry.substr(0, equals);
    if (const auto adjusted = pending.find(name); adjusted != pending.end()) {
      out.push_back(std::string(name).append("=").append(adjusted->second));
      pending.erase(adjusted);
    } else {
      add(name, entry);
    }
  }
  for (const auto& [name, value] : pending) out.push_back(std::string(name).append("=").append(value));
  return out;
}

std::optional<std::string> check(const Case& c) {
  const std::optional<enforcement::ContainerView> view =
      gpuguard::nri::view_of(c.pod, c.container, c.known, {}, gpuguard::nri::as_written);
  if (!view) return "the view could not be read";
  const enforcement::Decision decision = enforcement::decide(*view, c.allocation, c.known, c.policy);
  if (decision.action == enforcement::Decision::Action::refuse) return std::nullopt;
  if (c.spec.every_device) {
    // Privileged: reported, never confined (docs/node-enforcer.md); what it reaches is not the property's.
    return decision.why == enforcement::Decision::Why::privileged
               ? std::nullopt
               : std::optional<std::string>("privileged, not reported");
  }
  // What may be had: the allocated GPUs and MIG devices (a MIG device's parent too: in MIG mode its node
  // alone computes nothing), their nodes and capabilities, the claimed IMEX channels.
  std::set<std::string> uuids = c.allocation.gpus;
  std::set<unsigned> minors, caps, imex;
  for (const auto& gpu : c.node.gpus) {
    if (uuids.contains(gpu.uuid)) minors.insert(gpu.minor);
    for (const auto& mig : gpu.mig_devices) {
      if (!c.allocation.gpus.contains(mig.uuid)) continue;
      uuids.insert(gpu.uuid);
      minors.insert(gpu.minor);
      caps.insert(mig.cap_minors.begin(), mig.cap_minors.end());
    }
  }
  if (c.allocation.device_paths.contains("/dev/nvidia-caps-imex-channels/channel0")) imex.insert(0);
  toolkit::Spec final_spec = c.spec;
  final_spec.env = apply_env(c.spec.env, decision.set_env);
  for (const toolkit::Config& config : c.configs) {
    const toolkit::Given given = toolkit::gives(final_spec, config, c.node);
    if (given.fails) continue;
    std::vector<std::string> beyond;
    for (const std::string& id : given.gpus) {
      if (!uuids.contains(id)) beyond.push_back(id);
    }
    for (unsigned minor : given.gpu_nodes) {
      if (!minors.contains(minor)) beyond.push_back("/dev/nvidia" + std::to_string(minor));
    }
    for (unsigned cap : given.cap_nodes) {
      if (!caps.contains(cap)) beyond.push_back("cap " + std::to_string(cap));
    }
    for (unsigned channel : given.imex) {
      if (!imex.contains(channel)) beyond.push_back("IMEX channel " + std::to_string(channel));
    }
    if (beyond.empty()) continue;
    const auto [a, b, d] = config.version;
    std::ostringstream out;
    out << "toolkit " << config.mode << " " << a << "." << b << "." << d
        << (config.volume_mounts ? " volume-mounts" : "")
        << (config.envvar_when_unprivileged ? " envvar-when-unprivileged" : "") << " gives " << join(beyond, ", ")
        << "\nthe enforcer: " << enforcement::why_name(decision.why) << " "
        << (decision.action == enforcement::Decision::Action::adjust ? "adjust" : "allow") << " " << decision.message
        << "\nfinal env: " << join(final_spec.env, " | ") << "\n"
        << c.story << "known mode: " << c.known.toolkit.mode.value_or("?")
        << ", GPUs known: " << (c.known.gpus_unknown.empty() ? "yes" : "no");
    return out.str();
  }
  return std::nullopt;
}

}  // namespace gpuguard::test::property

#include "gpuguard/deviceplugin/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <functional>
#include <map>
#include <set>

#include "gpuguard/files/read_file.hpp"
#include "gpuguard/k8s/names.hpp"

namespace gpuguard::deviceplugin {

using discovery::DiscoveryMode;
using discovery::parse_discovery_mode;
namespace {

// A bad key or value: where it is (flags.plugin.deviceListStrategy) and why.
struct Problem {
  std::string key, reason;
};

// A DNS subdomain (RFC 1123), as a Node's name is: it becomes part of the API path the condition is
// written to.
bool is_node_name(std::string_view name) {
  if (name.empty() || name.size() > 253 || name.front() == '.' || name.back() == '.' || name.front() == '-' ||
      name.back() == '-') {
    return false;
  }
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'; });
}

std::string child(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

std::string scalar(const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar()) throw Problem{key, "must be a single value"};
  return node.Scalar();
}

bool boolean(const YAML::Node& node, const std::string& key) {
  const std::string value = scalar(node, key);
  if (value == "true") return true;
  if (value == "false") return false;
  throw Problem{key, "must be true or false, not \"" + value + "\""};
}

unsigned whole_number(const YAML::Node& node, const std::string& key) {
  const std::string value = scalar(node, key);
  unsigned number = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (value.empty() || ec != std::errc{} || end != value.data() + value.size()) {
    throw Problem{key, "must be a whole number, not \"" + value + "\""};
  }
  return number;
}

// A single value or a list of them.
std::vector<std::string> strings(const YAML::Node& node, const std::string& key) {
  if (node.IsScalar()) return {node.Scalar()};
  if (!node.IsSequence()) throw Problem{key, "must be a value or a list of values"};
  std::vector<std::string> values;
  for (std::size_t i = 0; i < node.size(); ++i) values.push_back(scalar(node[i], key + "[" + std::to_string(i) + "]"));
  return values;
}

template <typename T>
T one_of(const YAML::Node& node, const std::string& key, std::optional<T> (*parse)(std::string_view),
         const char* allowed) {
  const std::string value = scalar(node, key);
  if (auto parsed = parse(value)) return *parsed;
  throw Problem{key, "must be " + std::string(allowed) + ", not \"" + value + "\""};
}

using Handler = std::function<void(const YAML::Node& value, const std::string& key)>;

// Calls the handler of each key of a map; any other key is a Problem.
void each_key(const YAML::Node& node, const std::string& path, const std::map<std::string, Handler>& handlers) {
  if (node.IsNull()) return;
  if (!node.IsMap()) throw Problem{path, "must be a map of keys"};
  for (const auto& entry : node) {
    const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : std::string("?");
    const auto handler = handlers.find(key);
    if (handler == handlers.end()) {
      std::string known;
      for (const auto& [name, _] : handlers) known += (known.empty() ? "" : ", ") + name;
      throw Problem{child(path, key), "unknown key (known here: " + known + ")"};
    }
    handler->second(entry.second, child(path, key));
  }
}

// NVIDIA's resource names take nvidia.com/ when they have no domain.
std::string resource_name(const YAML::Node& node, const std::string& key) {
  std::string name = scalar(node, key);
  if (name.find('/') == std::string::npos) name = "nvidia.com/" + name;
  if (!is_resource_name(name)) throw Problem{key, "\"" + name + "\" is not a resource name such as nvidia.com/gpu"};
  return name;
}

Handler unsupported(std::string why) {
  return [why = std::move(why)](const YAML::Node&, const std::string& key) { throw Problem{key, why}; };
}

// A key whose only accepted value is the one that needs nothing of gpuguard (NVIDIA's default).
Handler only(std::string accepted, std::string why) {
  return [accepted = std::move(accepted), why = std::move(why)](const YAML::Node& node, const std::string& key) {
    if (!node.IsScalar() || node.Scalar() != accepted) throw Problem{key, why};
  };
}

// Keys NVIDIA's file has for features gpuguard does not have: false (or empty) is accepted, anything else
// refused, so that a file never asks for something that silently does not happen.
Handler only_off(std::string why) {
  return [why = std::move(why)](const YAML::Node& node, const std::string& key) {
    const std::string value = node.IsScalar() ? node.Scalar() : std::string("?");
    if (value != "false" && !value.empty()) throw Problem{key, why};
  };
}

// The dotted path of every key the file sets that is not itself a map of keys.
void collect_keys(const YAML::Node& node, const std::string& path, std::vector<std::string>& keys) {
  if (!node.IsMap()) {
    if (!path.empty()) keys.push_back(path);
    return;
  }
  for (const auto& entry : node) {
    collect_keys(entry.second, child(path, entry.first.IsScalar() ? entry.first.Scalar() : std::string("?")), keys);
  }
}

// A UUID as NVML writes it after GPU- or MIG-: 8-4-4-4-12 hexadecimal digits.
bool is_uuid(std::string_view text) {
  if (text.size() != 36) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    const char c = text[i];
    if (dash ? c != '-' : !std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool is_index(std::string_view text) {
  return !text.empty() && text.size() <= 4 &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// NVIDIA's device references: a GPU index, a MIG device's "g:m", a GPU-/MIG- UUID, or the older MIG
// form MIG-GPU-<uuid>/<gi>/<ci>.
bool is_device_ref(std::string_view ref) {
  if (is_index(ref)) return true;
  if (const std::size_t colon = ref.find(':'); colon != std::string_view::npos) {
    return is_index(ref.substr(0, colon)) && is_index(ref.substr(colon + 1));
  }
  if (ref.starts_with("GPU-")) return is_uuid(ref.substr(4));
  if (!ref.starts_with("MIG-")) return false;
  if (is_uuid(ref.substr(4))) return true;
  if (!ref.starts_with("MIG-GPU-") || ref.size() < 8 + 36 || !is_uuid(ref.substr(8, 36))) return false;
  const std::string_view rest = ref.substr(8 + 36);  // /<gi>/<ci>
  const std::size_t second = rest.find('/', 1);
  return rest.starts_with('/') && second != std::string_view::npos && is_index(rest.substr(1, second - 1)) &&
         is_index(rest.substr(second + 1));
}

// sharing.*.resources[].devices: "all", a count of devices, or a list of device references.
SharedDevices shared_devices(const YAML::Node& node, const std::string& key) {
  SharedDevices devices;
  if (node.IsScalar()) {
    const std::string& value = node.Scalar();
    if (value == "all") return devices;
    // A count is a number, as NVIDIA reads it; "2" in quotes is a string, and the only string is all.
    if (node.Tag() != "!" && is_index(value)) {
      devices.kind = SharedDevices::Kind::count;
      devices.count = static_cast<unsigned>(std::stoul(value));
      if (devices.count == 0) throw Problem{key, "a count of devices must be more than 0"};
      return devices;
    }
    throw Problem{key, "must be all, a count of devices, or a list of them, not \"" + value + "\""};
  }
  if (!node.IsSequence() || node.size() == 0) {
    throw Problem{key, "must be all, a count of devices, or a list of GPU indices, g:m MIG indices or UUIDs"};
  }
  devices.kind = SharedDevices::Kind::list;
  for (std::size_t i = 0; i < node.size(); ++i) {
    const std::string at = key + "[" + std::to_string(i) + "]";
    const std::string ref = scalar(node[i], at);
    if (!is_device_ref(ref)) {
      throw Problem{at, "\"" + ref + "\" is not a GPU index, a g:m MIG index, or a GPU- or MIG- UUID"};
    }
    devices.refs.push_back(ref);
  }
  return devices;
}

class Reader {
 public:
  explicit Reader(PluginConfig& config) : c_(config) {}
  std::vector<std::string> warnings;

  void read(const YAML::Node& root) {
    each_key(root, "",
             {{"version",
               [](const YAML::Node& node, const std::string& key) {
                 if (const std::string version = scalar(node, key); version != "v1") {
                   throw Problem{key, "must be v1, not \"" + version + "\""};
                 }
               }},
              {"flags", [this](const YAML::Node& node, const std::string& key) { flags(node, key); }},
              {"sharing", [this](const YAML::Node& node, const std::string& key) { sharing(node, key); }},
              {"resources",
               [this](const YAML::Node&, const std::string& key) {
                 warnings.push_back(key +
                                    " is ignored, as NVIDIA's plugin ignores it: name the GPU resource with "
                                    "gpuguard.resourceName");
               }},
              {"imex", unsupported("IMEX channels are not supported by gpuguard-device-plugin")},
              {"gpuguard", [this](const YAML::Node& node, const std::string& key) { gpuguard(node, key); }}});
  }

 private:
  void flags(const YAML::Node& node, const std::string& path) {
    const std::string roots =
        "gpuguard reads the host's /dev, /proc and /sys under gpuguard.hostRoot (--host-root) and mounts no "
        "driver files";
    each_key(node, path,
             {{"migStrategy",
               [this](const YAML::Node& n, const std::string& key) {
                 c_.mig_strategy = one_of(n, key, parse_mig_strategy, "none, single or mixed");
               }},
              {"failOnInitError",
               [this](const YAML::Node& n, const std::string& key) { c_.fail_on_init_error = boolean(n, key); }},
              {"deviceDiscoveryStrategy",
               [this](const YAML::Node& n, const std::string& key) {
                 const std::string value = scalar(n, key);
                 if (value == "auto")
                   c_.discovery = DiscoveryMode::automatic;
                 else if (value == "nvml")
                   c_.discovery = DiscoveryMode::nvml;
                 else
                   throw Problem{key, "must be auto or nvml (Tegra is not supported), not \"" + value + "\""};
               }},
              {"nvidiaDriverRoot", only("/", "only / is accepted: " + roots)},
              {"nvidiaDevRoot", only("/", "only / is accepted: " + roots)},
              {"mpsRoot",
               [this](const YAML::Node& n, const std::string& key) {
                 c_.gpu.mps_root = scalar(n, key);
                 if (!c_.gpu.mps_root.starts_with('/')) throw Problem{key, "must be an absolute path on the host"};
               }},
              {"gdrcopyEnabled", only_off("GDRCopy devices are not supported by gpuguard-device-plugin")},
              {"gdsEnabled", only_off("GPUDirect Storage is not supported by gpuguard-device-plugin")},
              {"mofedEnabled", only_off("MOFED devices are not supported by gpuguard-device-plugin")},
              {"useNodeFeatureAPI",
               [this](const YAML::Node&, const std::string& key) {
                 warnings.push_back(key + " is GPU Feature Discovery's: no effect on the device plugin");
               }},
              {"gfd",
               [this](const YAML::Node&, const std::string& key) {
                 warnings.push_back(key + " is GPU Feature Discovery's: no effect on the device plugin");
               }},
              {"plugin", [this](const YAML::Node& n, const std::string& key) { plugin(n, key); }}});
  }

  void plugin(const YAML::Node& node, const std::string& path) {
    each_key(node, path,
             {{"passDeviceSpecs",
               [this](const YAML::Node& n, const std::string& key) { c_.gpu.pass_device_specs = boolean(n, key); }},
              {"deviceListStrategy",
               [this](const YAML::Node& n, const std::string& key) {
                 std::vector<Strategy> strategies;
                 for (const std::string& name : strings(n, key)) {
                   const auto strategy = parse_strategy(name);
                   if (!strategy) {
                     throw Problem{key, "\"" + name + "\" is not envvar, volume-mounts, cdi-annotations or cdi-cri"};
                   }
                   strategies.push_back(*strategy);
                 }
                 if (auto reason = check_strategies(strategies)) throw Problem{key, *reason};
                 c_.gpu.strategies = std::move(strategies);
               }},
              {"deviceIDStrategy",
               [](const YAML::Node& n, const std::string& key) {
                 if (const std::string value = scalar(n, key); value != "uuid") {
                   throw Problem{key,
                                 "must be uuid: gpuguard hands out GPUs by UUID only, since an index changes when a "
                                 "GPU fails or is excluded (not \"" +
                                     value + "\")"};
                 }
               }},
              {"cdiAnnotationPrefix",
               [this](const YAML::Node& n, const std::string& key) { c_.gpu.cdi_annotation_prefix = scalar(n, key); }},
              {"sharedDevicesAllocationPolicy",
               [this](const YAML::Node& n, const std::string& key) {
                 c_.gpu.shared_allocation = one_of(n, key, parse_shared_allocation, "distributed or packed");
               }},
              {"nvidiaCTKPath", unsupported("gpuguard's CDI spec runs no nvidia-ctk hooks")},
              {"containerDriverRoot", unsupported("gpuguard's CDI spec mounts no driver files")}});
  }

  void sharing(const YAML::Node& node, const std::string& path) {
    bool time_slicing = false, mps = false;
    each_key(node, path,
             {{"timeSlicing",
               [&](const YAML::Node& n, const std::string& key) {
                 time_slicing = true;
                 shared(n, key, SharingStrategy::time_slicing);
               }},
              {"mps", [&](const YAML::Node& n, const std::string& key) {
                 mps = true;
                 shared(n, key, SharingStrategy::mps);
               }}});
    if (time_slicing && mps) {
      throw Problem{path,
                    "timeSlicing and mps are both set; a node shares its GPUs one way (NVIDIA's plugin "
                    "silently uses mps)"};
    }
  }

  void shared(const YAML::Node& node, const std::string& path, SharingStrategy strategy) {
    Sharing& t = c_.sharing;
    t.strategy = strategy;
    bool fail_requests_set = false;
    each_key(node, path,
             {{"renameByDefault",
               [&t](const YAML::Node& n, const std::string& key) { t.rename_by_default = boolean(n, key); }},
              {"failRequestsGreaterThanOne",
               [&](const YAML::Node& n, const std::string& key) {
                 t.fail_requests_greater_than_one = boolean(n, key);
                 fail_requests_set = true;
               }},
              {"resources",
               [this, strategy](const YAML::Node& n, const std::string& key) { shared_resources(n, key, strategy); }}});
    if (t.resources.empty()) throw Problem{child(path, "resources"), "no resources to share"};
    // NVIDIA's default under MPS (v0.20): a container holds one replica unless the file says otherwise.
    if (strategy == SharingStrategy::mps && !fail_requests_set) t.fail_requests_greater_than_one = true;
  }

  void shared_resources(const YAML::Node& node, const std::string& path, SharingStrategy strategy) {
    if (!node.IsSequence()) throw Problem{path, "must be a list of {name, replicas}"};
    const unsigned most = strategy == SharingStrategy::mps ? kMpsMaxClients : 1000;
    std::vector<Sharing::Resource> resources;
    for (std::size_t i = 0; i < node.size(); ++i) {
      const std::string at = path + "[" + std::to_string(i) + "]";
      Sharing::Resource r;
      r.replicas = 0;
      r.key = at;
      each_key(
          node[i], at,
          {{"name", [&r](const YAML::Node& n, const std::string& key) { r.name = resource_name(n, key); }},
           {"rename", [&r](const YAML::Node& n, const std::string& key) { r.rename = resource_name(n, key); }},
           {"replicas",
            [&r, most, strategy](const YAML::Node& n, const std::string& key) {
              r.replicas = whole_number(n, key);
              if (r.replicas < 2 || r.replicas > most) {
                throw Problem{key,
                              "must be from 2 to " + std::to_string(most) +
                                  (strategy == SharingStrategy::mps ? " (MPS serves at most 48 clients a GPU)" : "")};
              }
            }},
           {"devices", [&r](const YAML::Node& n, const std::string& key) { r.devices = shared_devices(n, key); }}});
      if (r.name.empty()) throw Problem{at, "needs a name"};
      if (r.replicas == 0) throw Problem{at, "needs replicas"};
      for (const auto& other : resources) {
        if (other.name == r.name) throw Problem{at + ".name", r.name + " is shared twice"};
      }
      resources.push_back(std::move(r));
    }
    c_.sharing.resources = std::move(resources);
  }

  void gpuguard(const YAML::Node& node, const std::string& path) {
    each_key(
        node, path,
        {{"devicePluginDir", [this](const YAML::Node& n, const std::string& key) { c_.plugin_dir = scalar(n, key); }},
         {"hostRoot", [this](const YAML::Node& n, const std::string& key) { c_.host_root = scalar(n, key); }},
         {"discovery",
          [this](const YAML::Node& n, const std::string& key) {
            c_.discovery = one_of(n, key, parse_discovery_mode, "auto, nvml, procfs or none");
          }},
         {"gpus",
          [this](const YAML::Node& n, const std::string& key) {
            c_.gpus = one_of(n, key, parse_gpu_serving, "serve, report-only or auto");
          }},
         {"resourceName",
          [this](const YAML::Node& n, const std::string& key) {
            c_.resource_name = scalar(n, key);
            if (!is_resource_name(c_.resource_name)) throw Problem{key, "must look like nvidia.com/gpu"};
          }},
         {"cdiRoot", [this](const YAML::Node& n, const std::string& key) { c_.cdi_root = scalar(n, key); }},
         {"nfdFeatureFile",
          [this](const YAML::Node& n, const std::string& key) {
            c_.nfd_feature_file = scalar(n, key);
            if (!c_.nfd_feature_file.empty() && !c_.nfd_feature_file.is_absolute()) {
              throw Problem{key, "must be an absolute path on the host, or empty"};
            }
          }},
         {"metricsAddress",
          [this](const YAML::Node& n, const std::string& key) { c_.metrics_address = scalar(n, key); }},
         {"nodeName", [this](const YAML::Node& n, const std::string& key) { c_.node_name = scalar(n, key); }},
         {"policyDir", [this](const YAML::Node& n, const std::string& key) { c_.policy_dir = scalar(n, key); }},
         {"infrastructureNamespaces",
          [this](const YAML::Node& n, const std::string& key) {
            std::string text;
            for (const std::string& item : strings(n, key)) text += item + "\n";
            std::string error;
            auto namespaces = parse_namespace_list(text, error);
            if (!namespaces) throw Problem{key, error};
            c_.infrastructure_namespaces = std::move(*namespaces);
          }},
         {"hostDevices", [this](const YAML::Node& n, const std::string& key) { host_devices(n, key); }},
         {"health", [this](const YAML::Node& n, const std::string& key) { health(n, key); }}});
  }

  void host_devices(const YAML::Node& node, const std::string& path) {
    if (!node.IsSequence()) throw Problem{path, "must be a list of {name, paths, slots}"};
    std::vector<HostDevice> devices;
    for (std::size_t i = 0; i < node.size(); ++i) {
      const std::string at = path + "[" + std::to_string(i) + "]";
      HostDevice device;
      each_key(node[i], at,
               {{"name", [&](const YAML::Node& n, const std::string& key) { device.resource = scalar(n, key); }},
                {"paths", [&](const YAML::Node& n, const std::string& key) { device.patterns = strings(n, key); }},
                {"slots", [&](const YAML::Node& n, const std::string& key) { device.slots = whole_number(n, key); }}});
      if (auto reason = check_host_device(device)) throw Problem{at, *reason};
      devices.push_back(std::move(device));
    }
    c_.host_devices = std::move(devices);
  }

  void health(const YAML::Node& node, const std::string& path) {
    const auto xids = [](const YAML::Node& n, const std::string& key) {
      std::string text;
      if (n.IsSequence()) {
        for (const std::string& item : strings(n, key)) text += (text.empty() ? "" : ",") + item;
      } else if (!n.IsNull()) {
        text = scalar(n, key);
      }
      std::string error;
      auto parsed = parse_xid_list(text, error);
      if (!parsed) throw Problem{key, error};
      return *parsed;
    };
    each_key(
        node, path,
        {{"checks", [this](const YAML::Node& n, const std::string& key) { c_.health_checks = boolean(n, key); }},
         {"ignoredXids", [&](const YAML::Node& n, const std::string& key) { c_.health.ignored_xids = xids(n, key); }},
         {"resetXids", [&](const YAML::Node& n, const std::string& key) { c_.health.reset_xids = xids(n, key); }}});
  }

  PluginConfig& c_;
};

}  // namespace

ConfigFileResult apply_config_text(std::string_view text, const std::string& source, PluginConfig& config) {
  ConfigFileResult result;
  PluginConfig updated = config;
  Reader reader(updated);
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    reader.read(root);
    collect_keys(root, "", result.keys);
  } catch (const Problem& problem) {
    result.error = source + ": " + (problem.key.empty() ? "" : problem.key + ": ") + problem.reason;
    return result;
  } catch (const YAML::Exception& e) {
    result.error = source + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                   ": not YAML: " + e.msg;
    return result;
  }
  if (auto reason = check_config(updated)) {
    result.error = source + ": " + *reason;
    return result;
  }
  config = std::move(updated);
  result.warnings = std::move(reader.warnings);
  return result;
}

ConfigFileResult apply_config_file(const std::filesystem::path& file, PluginConfig& config) {
  const auto text = files::read_file(file);
  if (!text) {
    ConfigFileResult result;
    result.error = file.string() + ": cannot be read";
    return result;
  }
  return apply_config_text(*text, file.string(), config);
}

std::optional<GpuServing> parse_gpu_serving(std::string_view name) {
  if (name == "serve") return GpuServing::serve;
  if (name == "report-only") return GpuServing::report_only;
  if (name == "auto") return GpuServing::automatic;
  return std::nullopt;
}

std::optional<std::set<std::string>> parse_namespace_list(std::string_view text, std::string& error) {
  std::set<std::string> namespaces;
  for (std::string& item : k8s::split_list(text)) {
    if (!k8s::is_dns_label(item)) {
      error.assign(1, '"')
          .append(std::string_view(item).substr(0, 64))
          .append("\" is not a namespace name (a DNS label)");
      return std::nullopt;
    }
    namespaces.insert(std::move(item));
  }
  return namespaces;
}

std::optional<std::string> check_config(const PluginConfig& config) {
  if (!is_resource_name(config.resource_name)) return "the GPU resource name must look like nvidia.com/gpu";
  if (auto reason = check_strategies(config.gpu.strategies)) return "device list strategy: " + *reason;
  const std::string& prefix = config.gpu.cdi_annotation_prefix;
  if (prefix.empty() || !prefix.ends_with('/') || prefix.find('/') != prefix.size() - 1) {
    return "the CDI annotation prefix must be a domain and a slash, such as cdi.k8s.io/";
  }
  if (!config.node_name.empty() && !is_node_name(config.node_name)) {
    return "the node name \"" + config.node_name +
           "\" is not a Kubernetes object name (lower case letters, digits, '-' and '.')";
  }
  if (config.sharing.strategy == SharingStrategy::mps && !config.sharing.resources.empty() &&
      config.mig_strategy == MigStrategy::mixed) {
    return "sharing.mps: MPS does not share MIG devices, and the MIG strategy mixed is not supported with it (use "
           "none, or timeSlicing)";
  }
  std::set<std::string> names = {config.resource_name};
  for (const HostDevice& device : config.host_devices) {
    if (!names.insert(device.resource).second) return "resource " + device.resource + " is named twice";
  }
  return std::nullopt;
}

}  // namespace gpuguard::deviceplugin

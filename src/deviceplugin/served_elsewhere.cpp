// Which GPUs another plugin serves here (include/gpuguard/deviceplugin/served_elsewhere.hpp).
#include "gpuguard/deviceplugin/served_elsewhere.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>

namespace gpuguard::deviceplugin {
namespace {

std::string lowered(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

}  // namespace

GpuUuids::GpuUuids(const std::vector<discovery::Gpu>& gpus) {
  for (const discovery::Gpu& gpu : gpus) {
    add(gpu.uuid, gpu.uuid);
    for (const discovery::MigDevice& mig : gpu.mig_devices) add(mig.uuid, gpu.uuid);
  }
}

void GpuUuids::add(const std::string& uuid, const std::string& gpu) {
  if (uuid.empty()) return;
  gpu_of_.emplace(lowered(uuid), gpu);
  if (std::find(lengths_.begin(), lengths_.end(), uuid.size()) == lengths_.end()) lengths_.push_back(uuid.size());
}

void GpuUuids::find(std::string_view text, std::set<std::string>& out) const {
  const auto lower = [&](std::size_t i) {
    return static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  };
  for (std::size_t at = 0; at + 4 <= text.size(); ++at) {
    if (text[at + 3] != '-') continue;
    const std::array<char, 3> head{lower(at), lower(at + 1), lower(at + 2)};
    const std::string_view prefix(head.data(), head.size());
    if (prefix != "gpu" && prefix != "mig") continue;
    for (const std::size_t length : lengths_) {
      if (at + length > text.size()) continue;
      const auto found = gpu_of_.find(lowered(text.substr(at, length)));
      if (found != gpu_of_.end()) out.insert(found->second);
    }
  }
}

bool names_gpus(std::string_view resource) {
  if (resource.starts_with(kDraPrefix)) return lowered(resource.substr(kDraPrefix.size())) == "gpu.nvidia.com";
  constexpr std::string_view kDomain = "nvidia.com/";
  if (!resource.starts_with(kDomain)) return false;
  const std::string name = lowered(resource.substr(kDomain.size()));
  return name == "gpu" || name.starts_with("gpu.") || name.starts_with("mig-");
}

namespace {

// Whether a pod's name is that of a pod of NVIDIA's DRA driver's kubelet plugin DaemonSet: the DaemonSet's
// name (<name>-kubelet-plugin, the name holding dra-driver), '-', and the five random characters the
// DaemonSet controller ends each of its pods' names with.
bool is_nvidia_dra_kubelet_plugin_pod(std::string_view name) {
  constexpr std::string_view kDaemonSet = "-kubelet-plugin-";
  constexpr std::size_t kRandom = 5;
  if (name.size() < kDaemonSet.size() + kRandom) return false;
  const std::string_view random = name.substr(name.size() - kRandom);
  const std::string_view daemon_set = name.substr(0, name.size() - kRandom);
  // Lower-case letters and digits, as ASCII, whatever the locale.
  const bool random_characters = std::all_of(random.begin(), random.end(),
                                             [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
  return random_characters && daemon_set.ends_with(kDaemonSet) &&
         daemon_set.substr(0, daemon_set.size() - kDaemonSet.size()).find("dra-driver") != std::string_view::npos;
}

}  // namespace

NvidiaGpuServer nvidia_gpu_server(const PodOnNode& pod) {
  const auto named = [&](std::string_view wanted) {
    return std::find(pod.containers.begin(), pod.containers.end(), wanted) != pod.containers.end();
  };
  for (const std::string_view plugin : {"nvidia-device-plugin-ctr", "nvidia-device-plugin"}) {
    if (named(plugin)) return {"NVIDIA's device plugin", std::string(plugin)};
  }
  if (is_nvidia_dra_kubelet_plugin_pod(pod.name) && named("gpus")) return {"NVIDIA's DRA driver", "gpus"};
  return {};
}

std::map<std::string, std::string> nvidia_plugin_on_node(const std::vector<PodOnNode>& pods,
                                                         const std::set<std::string>& infrastructure,
                                                         const std::vector<discovery::Gpu>& gpus) {
  std::map<std::string, std::string> served;
  for (const PodOnNode& pod : pods) {
    if (!infrastructure.contains(pod.pod_namespace)) continue;
    const NvidiaGpuServer server = nvidia_gpu_server(pod);
    if (server.empty()) continue;
    std::string why = server.server + " runs on this node (pod " + pod.pod_namespace + "/" + pod.name;
    why += ", container " + server.container + "), registered or not yet";
    for (const discovery::Gpu& gpu : gpus) served.emplace(gpu.uuid, why);
    break;
  }
  return served;
}

namespace {

// NVIDIA's DRA driver names a whole GPU gpu-<minor> and a MIG device of it gpu-<minor>-mig-… (its
// cmd/gpu-kubelet-plugin's deviceinfo.go and mig.go); the ID (kubelet_offers.cpp) starts with that name. The
// GPU of that minor here, or nullptr (gpu-vfio-<index>, a minor this node lacks).
const discovery::Gpu* gpu_of_nvidia_dra_device(std::string_view id, const std::vector<discovery::Gpu>& gpus) {
  constexpr std::string_view kGpu = "gpu-";
  const std::string_view name = id.substr(0, id.find(' '));
  if (!name.starts_with(kGpu)) return nullptr;
  const char* const digits = name.data() + kGpu.size();
  const char* const end = name.data() + name.size();
  unsigned minor = 0;
  const auto [after, error] = std::from_chars(digits, end, minor);
  if (error != std::errc() || after == digits) return nullptr;
  if (after != end && !std::string_view(after, static_cast<std::size_t>(end - after)).starts_with("-mig-")) {
    return nullptr;
  }
  const auto found =
      std::find_if(gpus.begin(), gpus.end(), [&](const discovery::Gpu& gpu) { return gpu.minor == minor; });
  return found == gpus.end() ? nullptr : &*found;
}

// served_elsewhere over an index already built (held_twice judges each pod's devices with its own).
std::map<std::string, std::string> served_elsewhere_in(const std::vector<OfferedResource>& offered,
                                                       const std::set<std::string>& own_resources,
                                                       const std::vector<discovery::Gpu>& gpus, const GpuUuids& index) {
  // The kubelet lists a resource once per device: judged whole, by name.
  struct Judged {
    std::set<std::string> named;  // the GPUs its IDs name
    std::string unnamed;          // an ID that names none
  };
  std::map<std::string, Judged> by_name;
  for (const OfferedResource& resource : offered) {
    if (own_resources.contains(resource.name)) continue;
    Judged& judged = by_name[resource.name];
    const bool nvidia_dra = resource.name.starts_with(kDraPrefix) && names_gpus(resource.name);
    for (const std::string& id : resource.device_ids) {
      std::set<std::string> named;
      index.find(id, named);
      if (const discovery::Gpu* gpu = nvidia_dra && named.empty() ? gpu_of_nvidia_dra_device(id, gpus) : nullptr) {
        named.insert(gpu->uuid);
      }
      if (named.empty() && judged.unnamed.empty()) judged.unnamed = id.substr(0, 64);
      judged.named.merge(named);
    }
  }
  std::map<std::string, std::string> served;
  for (const auto& [name, judged] : by_name) {
    const bool claimed = name.starts_with(kDraPrefix);
    const std::string where = claimed ? "a pod holds it through DRA driver " + name.substr(kDraPrefix.size())
                                      : "the kubelet offers it as " + name;
    // A GPU resource with an ID that names no GPU here (by UUID, or NVIDIA's DRA driver's by minor): NVIDIA's
    // deviceIDStrategy index, a MIG device made after discovery, gpu-vfio-<index>. Which GPU it is cannot be
    // told, so any of them may be served there.
    if (!judged.unnamed.empty() && names_gpus(name)) {
      const std::string device = (claimed ? "a pod holds a device of DRA driver " + name.substr(kDraPrefix.size())
                                          : "the kubelet offers " + name + " with device") +
                                 " " + judged.unnamed;
      for (const discovery::Gpu& gpu : gpus) {
        served.emplace(gpu.uuid, device + ", which names no GPU of this node by UUID" + (claimed ? " or minor" : "") +
                                     ": it may be any of them");
      }
    }
    for (const std::string& uuid : judged.named) served.emplace(uuid, where);
  }
  return served;
}

}  // namespace

std::map<std::string, std::string> served_elsewhere(const std::vector<OfferedResource>& offered,
                                                    const std::set<std::string>& own_resources,
                                                    const std::vector<discovery::Gpu>& gpus) {
  return served_elsewhere_in(offered, own_resources, gpus, GpuUuids(gpus));
}

std::map<std::string, std::string> held_twice(const std::vector<HeldDevices>& held,
                                              const std::set<std::string>& own_resources,
                                              const std::vector<discovery::Gpu>& gpus) {
  const GpuUuids index(gpus);
  std::map<std::string, std::string> whole_gpu;  // lower-case UUID: the GPU's, as discovered
  for (const discovery::Gpu& gpu : gpus) whole_gpu.emplace(lowered(gpu.uuid), gpu.uuid);
  // Each GPU's holders, a few named a side: the log line says where to look, not every pod. A device
  // plugin gives one whole GPU to one pod, so a pod holding it whole beside another pod holding it in any
  // form through a plugin is twice whoever served it: NVIDIA's plugin under gpuguard's own name, which
  // the kubelet lists as one resource. Not for DRA claims, which pods may share.
  constexpr std::size_t kNamed = 3;
  struct Holders {
    std::vector<std::string> own, other, plugin_pods;  // plugin_pods: two distinct pods are enough
    std::string whole;                                 // a pod a plugin gave the whole GPU
  };
  std::map<std::string, Holders> by_gpu;
  const auto add = [](std::vector<std::string>& names, std::string name, std::size_t most) {
    if (names.size() < most && std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(std::move(name));
    }
  };
  for (const HeldDevices& entry : held) {
    const std::string holder = entry.pod + " (" + entry.devices.name + ")";
    std::set<std::string> named;
    if (own_resources.contains(entry.devices.name)) {
      // An ID of gpuguard's GPU name in NVIDIA's index form (no UUID in it: 0, 0::1): another plugin's under
      // it. One that holds a UUID this start did not discover is not judged.
      bool index_form = false;
      for (const std::string& id : entry.devices.device_ids) {
        std::set<std::string> found;
        index.find(id, found);
        const std::string lower = lowered(id);
        index_form = index_form || (found.empty() && lower.find("gpu-") == std::string::npos &&
                                    lower.find("mig-") == std::string::npos);
        named.merge(found);
      }
      for (const std::string& gpu : named) add(by_gpu[gpu].own, holder, kNamed);
      if (index_form && names_gpus(entry.devices.name)) {  // NVIDIA's index IDs under gpuguard's name: any GPU
        for (const discovery::Gpu& gpu : gpus) {
          add(by_gpu[gpu.uuid].other, holder, kNamed);
          named.insert(gpu.uuid);
        }
      }
    } else {
      for (const auto& [gpu, why] : served_elsewhere_in({entry.devices}, own_resources, gpus, index)) {
        add(by_gpu[gpu].other, holder, kNamed);
        named.insert(gpu);
      }
    }
    if (entry.devices.name.starts_with(kDraPrefix)) continue;
    for (const std::string& gpu : named) add(by_gpu[gpu].plugin_pods, entry.pod, 2);
    for (const std::string& id : entry.devices.device_ids) {
      if (const auto whole = whole_gpu.find(lowered(id));
          whole != whole_gpu.end() && by_gpu[whole->second].whole.empty()) {
        by_gpu[whole->second].whole = holder;
      }
    }
  }
  const auto joined = [](const std::vector<std::string>& names) {
    std::string text;
    for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
    return text;
  };
  std::map<std::string, std::string> twice;
  for (const auto& [gpu, holders] : by_gpu) {
    if (!holders.own.empty() && !holders.other.empty()) {
      twice.emplace(gpu, "held under gpuguard's resource names by " + joined(holders.own) +
                             ", and under another server's by " + joined(holders.other));
    } else if (!holders.whole.empty() && holders.plugin_pods.size() > 1) {
      std::vector<std::string> all = holders.own;
      for (const std::string& name : holders.other) add(all, name, kNamed);
      twice.emplace(gpu, holders.whole + " holds it whole, and another pod holds it too: " + joined(all));
    }
  }
  return twice;
}

}  // namespace gpuguard::deviceplugin

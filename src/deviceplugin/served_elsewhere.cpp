// Which GPUs another plugin serves here (include/gpuguard/deviceplugin/served_elsewhere.hpp).
#include "gpuguard/deviceplugin/served_elsewhere.hpp"

#include <algorithm>
#include <cctype>
#include <unordered_map>

namespace gpuguard::deviceplugin {
namespace {

std::string lowered(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// Every UUID of this node's GPUs and their MIG devices, lower case, to the GPU's UUID as discovered.
class UuidIndex {
 public:
  explicit UuidIndex(const std::vector<discovery::Gpu>& gpus) {
    for (const discovery::Gpu& gpu : gpus) {
      add(gpu.uuid, gpu.uuid);
      for (const discovery::MigDevice& mig : gpu.mig_devices) add(mig.uuid, gpu.uuid);
    }
  }

  // The GPUs an ID names: at each "gpu-" or "mig-" in it, the text as long as a known UUID is looked up.
  // Linear in the ID's length (times the few lengths UUIDs have), whatever the plugin sent.
  void gpus_named(std::string_view id, std::set<std::string>& out) const {
    const std::string text = lowered(id);
    for (std::size_t at = 0; at + 4 <= text.size(); ++at) {
      const std::string_view prefix(text.data() + at, 4);
      if (prefix != "gpu-" && prefix != "mig-") continue;
      for (const std::size_t length : lengths_) {
        if (at + length > text.size()) continue;
        const auto found = gpu_of_.find(text.substr(at, length));
        if (found != gpu_of_.end()) out.insert(found->second);
      }
    }
  }

 private:
  void add(const std::string& uuid, const std::string& gpu) {
    if (uuid.empty()) return;
    gpu_of_.emplace(lowered(uuid), gpu);
    if (std::find(lengths_.begin(), lengths_.end(), uuid.size()) == lengths_.end()) lengths_.push_back(uuid.size());
  }

  std::unordered_map<std::string, std::string> gpu_of_;
  std::vector<std::size_t> lengths_;
};

}  // namespace

bool names_gpus(std::string_view resource) {
  constexpr std::string_view kDomain = "nvidia.com/";
  if (!resource.starts_with(kDomain)) return false;
  const std::string name = lowered(resource.substr(kDomain.size()));
  return name.find("gpu") != std::string::npos || name.starts_with("mig-");
}

std::map<std::string, std::string> served_elsewhere(const std::vector<OfferedResource>& offered,
                                                    const std::set<std::string>& own_resources,
                                                    const std::vector<discovery::Gpu>& gpus) {
  const UuidIndex index(gpus);
  // The kubelet lists a resource once per device: judged whole, by name.
  std::map<std::string, std::pair<std::set<std::string>, std::size_t>> by_name;  // GPUs named, devices
  for (const OfferedResource& resource : offered) {
    if (own_resources.contains(resource.name)) continue;
    auto& [named, devices] = by_name[resource.name];
    for (const std::string& id : resource.device_ids) index.gpus_named(id, named);
    devices += resource.device_ids.size();
  }
  std::map<std::string, std::string> served;
  for (auto& [name, found] : by_name) {
    auto& [named, devices] = found;
    if (named.empty() && devices > 0 && names_gpus(name)) {
      for (const discovery::Gpu& gpu : gpus) {
        served.emplace(gpu.uuid, "the kubelet offers " + name + " (" + std::to_string(devices) +
                                     " devices) whose IDs name no GPU of this node by UUID: it may serve any of them");
      }
    }
    for (const std::string& uuid : named) served.emplace(uuid, "the kubelet offers it as " + name);
  }
  return served;
}

}  // namespace gpuguard::deviceplugin

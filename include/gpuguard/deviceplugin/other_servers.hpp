#pragma once
// Keeps gpuguard's GPUs where no other plugin serves them. Every check asks the kubelet what it offers
// (kubelet_offers.hpp) and withholds each GPU that another resource serves (served_elsewhere.hpp) for the
// life of the process, so that two plugins never take turns with one GPU. Until the kubelet has first
// answered, every GPU is withheld: on a fresh node no GPU is served twice, whichever plugin starts first.
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gpuguard/deviceplugin/kubelet_offers.hpp"
#include "gpuguard/deviceplugin/resource.hpp"
#include "gpuguard/discovery/discovery.hpp"

namespace gpuguard::deviceplugin {

inline constexpr std::chrono::seconds kOffersInterval{2};

class OtherServers {
 public:
  using Read = std::function<KubeletOffers::Answer()>;

  // Withholds every GPU of gpu_sets (Hold::unchecked) until the first answer of read.
  OtherServers(Read read, std::vector<discovery::Gpu> gpus, std::vector<DeviceSet*> gpu_sets,
               std::set<std::string> own_resources);

  // One look: withholds what another plugin now serves; logs each new GPU withheld, and each new error.
  void check();
  // gpuguard_device_plugin_kubelet_offers_read, _gpus_served_elsewhere and _offers_errors_total.
  void render_metrics(std::string& out) const;

 private:
  void withhold_all(Hold why, bool withheld, const std::set<std::string>& uuids);

  Read read_;
  std::vector<discovery::Gpu> gpus_;
  std::vector<DeviceSet*> gpu_sets_;
  std::set<std::string> own_resources_;
  mutable std::mutex mutex_;
  bool answered_ = false;
  std::map<std::string, std::string> served_elsewhere_;  // GPU UUID: why, as first seen
  std::string last_error_;
  std::uint64_t errors_ = 0;
};

}  // namespace gpuguard::deviceplugin

#pragma once
// Keeps gpuguard's GPUs where no other plugin serves them. Every check asks the kubelet what it offers
// (kubelet_offers.hpp), and reads what DRA drivers publish on the node (published_gpus.hpp) where the API is
// watched, and withholds each GPU that another resource serves (served_elsewhere.hpp) or a ResourceSlice
// publishes, for the life of the process, so that two plugins never take turns with one GPU. Until the
// kubelet has first answered, and the slices have been listed (or kSlicesWait has passed), every GPU is
// withheld: on a fresh node no GPU is served twice, whichever plugin starts first.
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gpuguard/deviceplugin/kubelet_offers.hpp"
#include "gpuguard/deviceplugin/published_gpus.hpp"
#include "gpuguard/deviceplugin/resource.hpp"
#include "gpuguard/discovery/discovery.hpp"

namespace gpuguard::deviceplugin {

inline constexpr std::chrono::seconds kOffersInterval{2};
// How long the GPUs wait for the ResourceSlices' first list: an API server that cannot be reached must
// not keep the GPUs from pods for ever. Slices listed later are withheld as they arrive.
inline constexpr std::chrono::seconds kSlicesWait{30};

class OtherServers {
 public:
  using Read = std::function<KubeletOffers::Answer()>;

  // Withholds every GPU of gpu_sets (Hold::unchecked) until the first answer of read, and the first list
  // of `published` where it is given (null: no API to read it from).
  OtherServers(Read read, std::vector<discovery::Gpu> gpus, std::vector<DeviceSet*> gpu_sets,
               std::set<std::string> own_resources, const PublishedGpus* published = nullptr,
               std::chrono::steady_clock::duration slices_wait = kSlicesWait);

  // One look: withholds what another plugin now serves; logs each new GPU withheld, and each new error.
  void check();
  // gpuguard_device_plugin_kubelet_offers_read, _gpus_served_elsewhere, _kubelet_offers_errors_total, and
  // _resource_slices_listed where the slices are read.
  void render_metrics(std::string& out) const;

 private:
  void withhold_all(Hold why, bool withheld, const std::set<std::string>& uuids);

  Read read_;
  std::vector<discovery::Gpu> gpus_;
  std::vector<DeviceSet*> gpu_sets_;
  std::set<std::string> own_resources_;
  const PublishedGpus* published_;
  std::chrono::steady_clock::time_point slices_due_;
  mutable std::mutex mutex_;
  bool answered_ = false;  // the kubelet has
  bool released_ = false;  // Hold::unchecked, once the kubelet has answered and the slices are listed or late
  std::map<std::string, std::string> served_elsewhere_;  // GPU UUID: why, as first seen
  std::string last_error_;
  std::uint64_t errors_ = 0;
};

}  // namespace gpuguard::deviceplugin

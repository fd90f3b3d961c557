#pragma once
// Keeps gpuguard's GPUs where no other plugin serves them. Every check asks the kubelet what it offers
// (kubelet_offers.hpp), and reads what DRA drivers publish on the node (published_gpus.hpp) where the API is
// watched, and withholds each GPU that another resource serves (served_elsewhere.hpp) or a ResourceSlice
// publishes, for the life of the process, so that two plugins never take turns with one GPU. Until the
// kubelet has first answered, and the slices have been listed (or kSlicesWait has passed), every GPU is
// withheld. A GPU that pods hold through gpuguard's resource and another server's at once (a server that
// began after gpuguard's plugin had given it) cannot be taken back: it is logged and counted. The GPUs
// withheld are recorded in a file that outlives the process, the kubelet's restarts and the node's, and
// withheld again at the next start. Another plugin that answers on the socket of one of gpuguard's own
// resource names (the kubelet then lists either's devices under that name) withholds every GPU.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
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

// Where the GPUs withheld are recorded: a directory of the kubelet's plugin directory, which the kubelet's
// start leaves (it removes the files there, not the directories). Deleted, with the plugin started again,
// the GPUs are served again; forget-node removes it.
inline std::filesystem::path served_elsewhere_record(const std::filesystem::path& plugin_dir) {
  return plugin_dir / "gpuguard" / "served-elsewhere";
}

// Reads the record: uuid to why, a line each; empty where there is none yet, nullopt where it cannot be
// read (any error but its absence) or is over 64 KiB (a line a GPU): every GPU withheld, then.
std::optional<std::map<std::string, std::string>> read_served_elsewhere(const std::filesystem::path& record);

// Writes the record: "<uuid> <why>" a line, replacing the file whole. A failure is logged and returns false,
// not thrown: the GPUs stay withheld in this process, and only a restart would serve them again.
bool write_served_elsewhere(const std::filesystem::path& record, const std::map<std::string, std::string>& served);

// What OtherServers reads besides the kubelet's offers.
struct OtherServerSources {
  const PublishedGpus* published = nullptr;  // null: no API to read the slices from
  std::chrono::steady_clock::duration slices_wait = kSlicesWait;
  // Why another plugin serves one of gpuguard's own resource names now, or empty.
  std::function<std::string()> same_name = {};
  // The file that keeps the GPUs withheld across restarts; empty: none kept.
  std::filesystem::path record = {};
  // The namespaces of the GPU infrastructure (--infrastructure-namespaces): a pod of one of them that runs
  // NVIDIA's device plugin on this node withholds every GPU (nvidia_plugin_on_node). Empty: none.
  std::set<std::string> infrastructure = {};
};

class OtherServers {
 public:
  using Sources = OtherServerSources;
  using Read = std::function<KubeletOffers::Answer()>;

  // Withholds every GPU of gpu_sets (Hold::unchecked) until the first answer of read, and the first list
  // of sources.published where it is given; those the record names, for good, at once. With no gpu_sets
  // (GPUs only reported), it only counts the GPUs held twice.
  OtherServers(Read read, std::vector<discovery::Gpu> gpus, std::vector<DeviceSet*> gpu_sets,
               std::set<std::string> own_resources, Sources sources = {});

  // One look: withholds what another plugin now serves; logs each new GPU withheld, and each new error.
  void check();
  // Once the GPUs no other plugin serves are served (Hold::unchecked released): the plugin is ready then.
  bool released() const {
    std::lock_guard lock(mutex_);
    return released_;
  }
  // gpuguard_device_plugin_kubelet_offers_read, _gpus_served_elsewhere, _gpus_held_twice,
  // _kubelet_offers_errors_total, and _resource_slices_listed where the slices are read.
  void render_metrics(std::string& out) const;

 private:
  void withhold_all(Hold why, bool withheld, const std::set<std::string>& uuids);
  void load_record();
  void withhold_new(const std::map<std::string, std::string>& served);
  void release_when_judged(bool listed);
  void note_held_twice(std::map<std::string, std::string> twice);

  Read read_;
  std::vector<discovery::Gpu> gpus_;
  std::vector<DeviceSet*> gpu_sets_;
  std::set<std::string> own_resources_;
  const PublishedGpus* published_;
  std::chrono::steady_clock::time_point slices_due_;
  std::function<std::string()> same_name_;
  std::filesystem::path record_;
  std::set<std::string> infrastructure_;
  mutable std::mutex mutex_;
  bool answered_ = false;  // the kubelet has
  bool released_ = false;  // Hold::unchecked, once the kubelet has answered and the slices are listed or late
  std::map<std::string, std::string> served_elsewhere_;  // GPU UUID: why, as first seen
  std::map<std::string, std::string> recorded_;          // the record's lines, those of GPUs not found too
  std::map<std::string, std::string> held_twice_;        // GPU UUID: its holders, at the last answer
  std::string last_error_;
  std::uint64_t errors_ = 0;
};

}  // namespace gpuguard::deviceplugin

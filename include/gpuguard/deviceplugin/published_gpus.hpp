#pragma once
// The GPUs a DRA driver publishes on this node: a kube::Store for the list-and-watch of the node's
// ResourceSlices (in whichever resource.k8s.io version the API server serves), keeping of each slice only
// its driver and the GPUs whose UUIDs it holds, so that OtherServers withholds them as served elsewhere.
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gpuguard/deviceplugin/served_elsewhere.hpp"
#include "gpuguard/kube/store.hpp"

namespace gpuguard::deviceplugin {

class PublishedGpus : public kube::Store {
 public:
  explicit PublishedGpus(const std::vector<discovery::Gpu>& gpus) : uuids_(gpus) {}

  // Each GPU some slice publishes: why ("ResourceSlice <name> of driver <driver> publishes it").
  std::map<std::string, std::string> gpus() const;
  // Once the slices have been listed (an API server that serves no resource.k8s.io version lists none).
  bool listed() const { return listed_.load(); }

  void list_begin() override;
  void list_item(std::string_view object) override;
  void list_end(bool complete) override;
  void apply(std::string_view type, std::string_view object) override;

 private:
  struct Slice {
    std::string driver;
    std::set<std::string> gpus;
  };
  // The slice's name and what it publishes; nullopt for text that is not a slice.
  std::optional<std::pair<std::string, Slice>> read(std::string_view object) const;

  GpuUuids uuids_;
  mutable std::mutex mutex_;
  std::map<std::string, Slice> slices_, listing_;
  std::atomic<bool> listed_{false};
};

}  // namespace gpuguard::deviceplugin

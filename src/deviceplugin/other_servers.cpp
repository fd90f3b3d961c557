// Keeping the GPUs off where another plugin serves them (include/gpuguard/deviceplugin/other_servers.hpp).
#include "gpuguard/deviceplugin/other_servers.hpp"

#include "gpuguard/deviceplugin/served_elsewhere.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/metrics/text.hpp"

namespace gpuguard::deviceplugin {
namespace {

constexpr metrics::Family kOffersRead{
    "gpuguard_device_plugin_kubelet_offers_read", "gauge",
    "1 once the kubelet has said what it offers under every resource name; until then every GPU is withheld."};
constexpr metrics::Family kServedElsewhere{
    "gpuguard_device_plugin_gpus_served_elsewhere", "gauge",
    "GPUs withheld, for the life of the process, because the kubelet offers them under another plugin's resource."};
constexpr metrics::Family kOfferErrors{"gpuguard_device_plugin_kubelet_offers_errors_total", "counter",
                                       "Asks for the kubelet's offers that got no answer."};
constexpr metrics::Family kSlicesListed{
    "gpuguard_device_plugin_resource_slices_listed", "gauge",
    "1 once this node's DRA ResourceSlices have been listed; a GPU one publishes is withheld as served elsewhere."};

std::set<std::string> uuids_of(const std::vector<discovery::Gpu>& gpus) {
  std::set<std::string> uuids;
  for (const discovery::Gpu& gpu : gpus) uuids.insert(gpu.uuid);
  return uuids;
}

}  // namespace

OtherServers::OtherServers(Read read, std::vector<discovery::Gpu> gpus, std::vector<DeviceSet*> gpu_sets,
                           std::set<std::string> own_resources, const PublishedGpus* published,
                           std::chrono::steady_clock::duration slices_wait)
    : read_(std::move(read)),
      gpus_(std::move(gpus)),
      gpu_sets_(std::move(gpu_sets)),
      own_resources_(std::move(own_resources)),
      published_(published),
      slices_due_(std::chrono::steady_clock::now() + slices_wait) {
  withhold_all(Hold::unchecked, true, uuids_of(gpus_));
}

void OtherServers::withhold_all(Hold why, bool withheld, const std::set<std::string>& uuids) {
  for (DeviceSet* set : gpu_sets_) {
    for (const std::string& uuid : uuids) set->withhold(uuid, why, withheld);
  }
}

void OtherServers::check() {
  KubeletOffers::Answer answer = read_();
  std::lock_guard lock(mutex_);
  if (!answer.error.empty()) {
    ++errors_;
    if (answer.error != last_error_) {
      log::warn(answered_ ? "the kubelet's offers not read; the GPUs withheld so far stay withheld"
                          : "the kubelet's offers not read; every GPU is withheld until they are",
                {{"reason", answer.error}});
    }
    last_error_ = answer.error;
    return;
  }
  last_error_.clear();
  answered_ = true;
  auto served = served_elsewhere(answer.resources, own_resources_, gpus_);
  if (published_ != nullptr) served.merge(published_->gpus());
  std::set<std::string> now_withheld;
  for (auto& [uuid, why] : served) {
    if (!served_elsewhere_.emplace(uuid, why).second) continue;
    now_withheld.insert(uuid);
    log::warn("GPU withheld: another plugin serves it here", {{"gpu", uuid}, {"reason", why}});
  }
  withhold_all(Hold::served_elsewhere, true, now_withheld);
  if (released_) return;
  const bool listed = published_ == nullptr || published_->listed();
  if (!listed && std::chrono::steady_clock::now() < slices_due_) return;
  released_ = true;
  withhold_all(Hold::unchecked, false, uuids_of(gpus_));
  if (!listed) {
    log::warn(
        "this node's ResourceSlices not listed yet: GPUs served on the kubelet's word; one a DRA driver "
        "publishes is withheld once they are");
  }
  log::info("GPUs no other plugin serves are served",
            {{"gpus", gpus_.size()}, {"served_elsewhere", served_elsewhere_.size()}});
}

void OtherServers::render_metrics(std::string& out) const {
  std::lock_guard lock(mutex_);
  metrics::single(out, kOffersRead, answered_ ? "1" : "0");
  metrics::single(out, kServedElsewhere, served_elsewhere_.size());
  metrics::single(out, kOfferErrors, errors_);
  if (published_ != nullptr) metrics::single(out, kSlicesListed, published_->listed() ? "1" : "0");
}

}  // namespace gpuguard::deviceplugin

// Keeping the GPUs off where another plugin serves them (include/gpuguard/deviceplugin/other_servers.hpp).
#include "gpuguard/deviceplugin/other_servers.hpp"

#include <sstream>

#include "gpuguard/deviceplugin/served_elsewhere.hpp"
#include "gpuguard/files/read_file.hpp"
#include "gpuguard/files/write_file.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/metrics/text.hpp"

namespace gpuguard::deviceplugin {
namespace {

constexpr metrics::Family kOffersRead{
    "gpuguard_device_plugin_kubelet_offers_read", "gauge",
    "1 once the kubelet has said what it offers under every resource name; until then every GPU is withheld."};
constexpr metrics::Family kServedElsewhere{
    "gpuguard_device_plugin_gpus_served_elsewhere", "gauge",
    "GPUs withheld for good: the kubelet offers them under another plugin's resource, a pod holds them from one (a "
    "DRA claim too), NVIDIA's device plugin's or DRA kubelet plugin's pod runs on the node, a DRA driver's "
    "ResourceSlice publishes them, or an earlier start withheld them."};
constexpr metrics::Family kHeldTwice{
    "gpuguard_device_plugin_gpus_held_twice", "gauge",
    "GPUs two pods hold at the kubelet's last answer: one through gpuguard's plugin and one through another plugin "
    "or a DRA claim, or one whole and one in any form through device plugins (another under gpuguard's name): "
    "another server began to serve a GPU gpuguard's plugin had given."};
constexpr metrics::Family kOfferErrors{"gpuguard_device_plugin_kubelet_offers_errors_total", "counter",
                                       "Asks for the kubelet's offers that got no answer."};
constexpr metrics::Family kSlicesListed{
    "gpuguard_device_plugin_resource_slices_listed", "gauge",
    "1 once this node's DRA ResourceSlices have been listed; a GPU one publishes is withheld as served elsewhere."};

constexpr std::uintmax_t kRecordMax = 64 << 10;  // a line per GPU

std::set<std::string> uuids_of(const std::vector<discovery::Gpu>& gpus) {
  std::set<std::string> uuids;
  for (const discovery::Gpu& gpu : gpus) uuids.insert(gpu.uuid);
  return uuids;
}

}  // namespace

std::optional<std::map<std::string, std::string>> read_served_elsewhere(const std::filesystem::path& record) {
  std::map<std::string, std::string> recorded;
  std::error_code error;
  const auto size = std::filesystem::file_size(record, error);
  if (error == std::errc::no_such_file_or_directory) return recorded;  // none yet
  if (error) return std::nullopt;
  const std::optional<std::string> text = size <= kRecordMax ? files::read_file(record) : std::nullopt;
  if (!text) return std::nullopt;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    const std::string uuid = line.substr(0, line.find(' '));
    if (uuid.empty()) continue;  // a blank line
    recorded.emplace(uuid, line.size() > uuid.size() ? line.substr(uuid.size() + 1) : "");
  }
  return recorded;
}

bool write_served_elsewhere(const std::filesystem::path& record, const std::map<std::string, std::string>& served) {
  std::string text;
  for (const auto& [uuid, why] : served) {
    std::string line = uuid;
    line.append(" ").append(why);
    // One line a GPU, whatever a plugin put in the IDs a reason quotes.
    for (char& c : line) c = static_cast<unsigned char>(c) < 0x20 ? '?' : c;
    text.append(line).append("\n");
  }
  try {
    files::write_file_atomically(record, text);
    return true;
  } catch (const std::runtime_error& e) {
    log::warn("the GPUs withheld not recorded: a restart of the plugin serves them again",
              {{"path", record.string()}, {"reason", e.what()}});
    return false;
  }
}

OtherServers::OtherServers(Read read, std::vector<discovery::Gpu> gpus, std::vector<DeviceSet*> gpu_sets,
                           std::set<std::string> own_resources, Sources sources)
    : read_(std::move(read)),
      gpus_(std::move(gpus)),
      gpu_sets_(std::move(gpu_sets)),
      own_resources_(std::move(own_resources)),
      published_(sources.published),
      slices_due_(std::chrono::steady_clock::now() + sources.slices_wait),
      same_name_(std::move(sources.same_name)),
      record_(std::move(sources.record)),
      infrastructure_(std::move(sources.infrastructure)) {
  withhold_all(Hold::unchecked, true, uuids_of(gpus_));
  load_record();
}

void OtherServers::withhold_all(Hold why, bool withheld, const std::set<std::string>& uuids) {
  for (DeviceSet* set : gpu_sets_) {
    for (const std::string& uuid : uuids) set->withhold(uuid, why, withheld);
  }
}

// The GPUs an earlier run withheld: "<uuid> <why>" a line. Bounded, since it is read before anything else.
void OtherServers::load_record() {
  if (record_.empty()) return;
  const std::optional<std::map<std::string, std::string>> recorded = read_served_elsewhere(record_);
  if (!recorded) {
    log::warn("the record of GPUs served elsewhere cannot be read: every GPU is withheld as served elsewhere",
              {{"path", record_.string()}});
    for (const discovery::Gpu& gpu : gpus_) served_elsewhere_.emplace(gpu.uuid, "its record cannot be read");
  } else {
    recorded_ = *recorded;
    const std::set<std::string> known = uuids_of(gpus_);
    for (const auto& [uuid, why] : *recorded) {
      if (known.contains(uuid))
        served_elsewhere_.emplace(uuid, "withheld since an earlier start (" + record_.string() + "): " + why);
    }
  }
  std::set<std::string> uuids;
  for (const auto& [uuid, why] : served_elsewhere_) {
    uuids.insert(uuid);
    log::warn("GPU withheld: another plugin serves it here", {{"gpu", uuid}, {"reason", why}});
  }
  withhold_all(Hold::served_elsewhere, true, uuids);
}

void OtherServers::withhold_new(const std::map<std::string, std::string>& served) {
  std::set<std::string> now_withheld;
  for (const auto& [uuid, why] : served) {
    if (!served_elsewhere_.emplace(uuid, why).second) continue;
    now_withheld.insert(uuid);
    log::warn("GPU withheld: another plugin serves it here", {{"gpu", uuid}, {"reason", why}});
  }
  if (now_withheld.empty()) return;
  withhold_all(Hold::served_elsewhere, true, now_withheld);
  if (record_.empty()) return;
  // Added to the lines read at start, kept as they were: a GPU this start did not find stays recorded.
  for (const std::string& uuid : now_withheld) recorded_.emplace(uuid, served_elsewhere_.at(uuid));
  write_served_elsewhere(record_, recorded_);
}

void OtherServers::release_when_judged(bool listed) {
  if (released_ || !answered_) return;
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

void OtherServers::check() try {
  const std::string same = same_name_ ? same_name_() : std::string();
  KubeletOffers::Answer answer = read_();
  // Whether the slices are listed, before what they publish: a list that ends between the two is read
  // at the next check, never taken as listed with the GPUs it publishes unseen.
  const bool listed = published_ == nullptr || published_->listed();
  std::map<std::string, std::string> served = published_ != nullptr ? published_->gpus() : decltype(served){};
  if (!same.empty()) {
    for (const discovery::Gpu& gpu : gpus_) served.emplace(gpu.uuid, same);
  }
  std::lock_guard lock(mutex_);
  if (answer.error.empty()) {
    last_error_.clear();
    answered_ = true;
    note_held_twice(held_twice(answer.held, own_resources_, gpus_));
    if (gpu_sets_.empty()) return;  // GPUs only reported: nothing to withhold
    served.merge(served_elsewhere(answer.resources, own_resources_, gpus_));
    served.merge(nvidia_plugin_on_node(answer.pods, infrastructure_, gpus_));
  } else {
    ++errors_;
    if (answer.error != last_error_) {
      log::warn(gpu_sets_.empty() ? "the kubelet's offers not read; GPUs held twice are counted as last read"
                : answered_       ? "the kubelet's offers not read; the GPUs withheld so far stay withheld"
                                  : "the kubelet's offers not read; every GPU is withheld until they are",
                {{"reason", answer.error}});
    }
    last_error_ = answer.error;
  }
  if (gpu_sets_.empty()) return;
  withhold_new(served);
  release_when_judged(listed);
} catch (const std::exception& e) {
  log::error("the check of what other plugins serve failed; it runs again", {{"reason", e.what()}});
}

// Logged as each GPU begins to be held twice; the gauge says how many are at the last answer.
void OtherServers::note_held_twice(std::map<std::string, std::string> twice) {
  for (const auto& [uuid, holders] : twice) {
    if (!held_twice_.contains(uuid)) {
      log::error(
          gpu_sets_.empty()
              ? "GPU held twice: two servers gave it to pods; this plugin only reports, and serves it to none"
              : "GPU held twice: two pods hold it, given by two servers; withholding keeps it from new pods only",
          {{"gpu", uuid}, {"holders", holders}});
    }
  }
  held_twice_ = std::move(twice);
}

void OtherServers::render_metrics(std::string& out) const {
  std::lock_guard lock(mutex_);
  metrics::single(out, kOffersRead, answered_ ? "1" : "0");
  metrics::single(out, kServedElsewhere, served_elsewhere_.size());
  metrics::single(out, kHeldTwice, held_twice_.size());
  metrics::single(out, kOfferErrors, errors_);
  if (published_ != nullptr) metrics::single(out, kSlicesListed, published_->listed() ? "1" : "0");
}

}  // namespace gpuguard::deviceplugin

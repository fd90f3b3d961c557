// The GPUs DRA drivers publish on this node (include/gpuguard/deviceplugin/published_gpus.hpp).
#include "gpuguard/deviceplugin/published_gpus.hpp"

#include <simdjson.h>

namespace gpuguard::deviceplugin {

std::optional<std::pair<std::string, PublishedGpus::Slice>> PublishedGpus::read(std::string_view object) const {
  // The store's text is followed by kube::kJsonPadding readable bytes: parsed where it lies.
  simdjson::ondemand::parser parser;
  const simdjson::padded_string_view text(object.data(), object.size(), object.size() + kube::kJsonPadding);
  simdjson::ondemand::document document;
  std::string_view name, driver;
  if (parser.iterate(text).get(document) != simdjson::SUCCESS ||
      document.find_field_unordered("metadata").find_field_unordered("name").get_string().get(name) !=
          simdjson::SUCCESS) {
    return std::nullopt;
  }
  // Copied before the next string is read: simdjson unescapes every string into one buffer, from its start.
  std::string slice_name(name);
  document.rewind();
  if (document.find_field_unordered("spec").find_field_unordered("driver").get_string().get(driver) !=
      simdjson::SUCCESS) {
    driver = "unknown";
  }
  Slice slice{std::string(driver), {}};
  uuids_.find(object, slice.gpus);  // wherever the driver puts them: an attribute, a name
  return std::pair{std::move(slice_name), std::move(slice)};
}

std::map<std::string, std::string> PublishedGpus::gpus() const {
  std::lock_guard lock(mutex_);
  std::map<std::string, std::string> published;
  for (const auto& [name, slice] : slices_) {
    for (const std::string& uuid : slice.gpus) {
      published.emplace(uuid, "ResourceSlice " + name + " of DRA driver " + slice.driver + " publishes it");
    }
  }
  return published;
}

void PublishedGpus::list_begin() {
  std::lock_guard lock(mutex_);
  listing_.clear();
}

void PublishedGpus::list_item(std::string_view object) {
  auto slice = read(object);
  if (!slice) return;
  std::lock_guard lock(mutex_);
  listing_.insert_or_assign(std::move(slice->first), std::move(slice->second));
}

void PublishedGpus::list_end(bool complete) {
  std::lock_guard lock(mutex_);
  if (complete) {
    slices_.swap(listing_);
    listed_.store(true);
  }
  listing_.clear();
}

void PublishedGpus::apply(std::string_view type, std::string_view object) {
  auto slice = read(object);
  if (!slice) return;
  std::lock_guard lock(mutex_);
  if (type == "DELETED") {
    slices_.erase(slice->first);
  } else {
    slices_.insert_or_assign(std::move(slice->first), std::move(slice->second));
  }
}

}  // namespace gpuguard::deviceplugin

// What the admission switches are, from list and watch (include/gpuguard/webhook/admission_switches.hpp).
#include "gpuguard/webhook/admission_switches.hpp"

#include <simdjson.h>

#include <algorithm>
#include <iterator>
#include <optional>

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::webhook {
namespace {

constexpr metrics::Family kIgnored{
    "gpuguard_ignored_namespaces", "gauge",
    "Namespaces labelled gpuguard.io/ignore, whose pods the webhook and the backstop leave alone: by the break "
    "glass (value break-glass) or any other value (an admin's opt-out)."};
constexpr metrics::Family kWatched{
    "gpuguard_admission_switches_watched", "gauge",
    "1 while the list and watch of the resource work (its last list succeeded, or its last watch ran its course); "
    "0 from the start until then, and after a failed list or watch: the switches' series are not current."};
constexpr metrics::Family kPresent{
    "gpuguard_admission_object_present", "gauge",
    "1 while the object exists: the webhook configuration that sends pods here, the backstop's binding and "
    "policy that refuse those not patched, and the keeper's (gpuguard-keep-configmap-params) that keep the "
    "backstop's parameter watched; 0 once deleted (the break glass)."};

struct Read {
  std::string name;
  std::optional<std::string> label;  // kIgnoreLabel's value, where the object has it
};

// The object's name and its kIgnoreLabel; nullopt for text without a name. The store's text is followed
// by kube::kJsonPadding readable bytes: parsed where it lies.
std::optional<Read> read(std::string_view object) {
  simdjson::ondemand::parser parser;
  const simdjson::padded_string_view text(object.data(), object.size(), object.size() + kube::kJsonPadding);
  simdjson::ondemand::document document;
  simdjson::ondemand::object metadata;
  std::string_view name, value;
  if (parser.iterate(text).get(document) != simdjson::SUCCESS ||
      document.find_field_unordered("metadata").get_object().get(metadata) != simdjson::SUCCESS ||
      metadata.find_field_unordered("name").get_string().get(name) != simdjson::SUCCESS || name.empty()) {
    return std::nullopt;
  }
  // Copied: the view points into the parser's string buffer, which the parser is done with on return.
  Read found{std::string(name), std::nullopt};
  if (metadata.find_field_unordered("labels").find_field_unordered(kIgnoreLabel).get_string().get(value) ==
      simdjson::SUCCESS) {
    found.label = std::string(value);
  }
  return found;
}

}  // namespace

IgnoredNamespaces::Counts IgnoredNamespaces::counts() const {
  std::lock_guard lock(mutex_);
  Counts counts;
  for (const auto& [name, break_glass] : labelled_) ++(break_glass ? counts.break_glass : counts.other);
  return counts;
}

void IgnoredNamespaces::list_begin() {
  std::lock_guard lock(mutex_);
  listing_.clear();
}

void IgnoredNamespaces::list_item(std::string_view object) {
  auto namespace_read = read(object);
  if (!namespace_read || !namespace_read->label) return;
  std::lock_guard lock(mutex_);
  listing_.insert_or_assign(std::move(namespace_read->name), *namespace_read->label == kBreakGlassValue);
}

void IgnoredNamespaces::list_end(bool complete) {
  std::lock_guard lock(mutex_);
  if (complete) {
    labelled_.swap(listing_);
    listed_.store(true);
  }
  listing_.clear();
}

// A namespace that loses the label leaves the selection: the API server sends it DELETED, and one sent
// MODIFIED without the label (a server that did not select) counts the same.
void IgnoredNamespaces::apply(std::string_view type, std::string_view object) {
  auto namespace_read = read(object);
  if (!namespace_read) return;
  std::lock_guard lock(mutex_);
  if (type == "DELETED" || !namespace_read->label) {
    labelled_.erase(namespace_read->name);
  } else {
    labelled_.insert_or_assign(std::move(namespace_read->name), *namespace_read->label == kBreakGlassValue);
  }
}

bool NamedObject::is_it(std::string_view object) const {
  const auto found = read(object);
  return found && found->name == name_;
}

void NamedObject::list_item(std::string_view object) {
  if (is_it(object)) listing_ = true;
}

void NamedObject::list_end(bool complete) {
  if (!complete) return;
  exists_.store(listing_);
  listed_.store(true);
}

void NamedObject::apply(std::string_view type, std::string_view object) {
  if (is_it(object)) exists_.store(type != "DELETED");
}

AdmissionSwitches::AdmissionSwitches(std::string webhook_configuration, std::string backstop_binding,
                                     std::string backstop_policy, std::string parameter_keeper) {
  constexpr const char* kBindings = "validatingadmissionpolicybindings";
  constexpr const char* kPolicies = "validatingadmissionpolicies";
  const std::pair<const char*, const char*> kinds[] = {{"webhook-configuration", "mutatingwebhookconfigurations"},
                                                       {"backstop-binding", kBindings},
                                                       {"backstop-policy", kPolicies},
                                                       {"keeper-binding", kBindings},
                                                       {"keeper-policy", kPolicies}};
  std::string* names[] = {&webhook_configuration, &backstop_binding, &backstop_policy, &parameter_keeper,
                          &parameter_keeper};
  watches_.push_back(std::make_unique<Watch>());
  watches_.back()->resource = watches_.back()->reflector = "namespaces";
  for (std::size_t i = 0; i < std::size(kinds); ++i) {
    if (names[i]->empty()) continue;
    objects_.push_back({kinds[i].first, kinds[i].second, std::make_unique<NamedObject>(*names[i])});
    watches_.push_back(std::make_unique<Watch>());
    watches_.back()->resource = kinds[i].second;
    watches_.back()->reflector = kinds[i].first;
  }
}

std::vector<kube::WatchedResource> AdmissionSwitches::watched_resources() {
  std::vector<kube::WatchedResource> resources;
  kube::WatchedResource namespaces{"namespaces", "/api/v1/namespaces", "", &namespaces_};
  namespaces.label_selector = std::string(kIgnoreLabel);
  resources.push_back(std::move(namespaces));
  // admissionregistration.k8s.io/v1 serves all three from 1.30, the oldest minor gpuguard supports.
  for (const Object& object : objects_) {
    resources.push_back({object.label, std::string("/apis/admissionregistration.k8s.io/v1/") + object.resource,
                         "metadata.name=" + object.store->name(), object.store.get()});
  }
  return resources;
}

void AdmissionSwitches::observe(std::string_view reflector, kube::ReflectorOutcome outcome) {
  for (const auto& watch : watches_) {
    if (watch->reflector != reflector) continue;
    switch (outcome) {
      case kube::ReflectorOutcome::list_success:
      case kube::ReflectorOutcome::watch_closed: watch->working.store(true); break;
      case kube::ReflectorOutcome::list_failure:
      case kube::ReflectorOutcome::watch_error: watch->working.store(false); break;
      case kube::ReflectorOutcome::watch_gone:  // a list follows, which says
        break;
    }
  }
}

void AdmissionSwitches::render(std::string& out) const {
  metrics::header(out, kWatched);
  std::vector<std::string_view> resources;  // each collection once, in the order first watched
  for (const auto& watch : watches_) {
    if (std::find(resources.begin(), resources.end(), watch->resource) == resources.end()) {
      resources.push_back(watch->resource);
    }
  }
  for (const std::string_view resource : resources) {
    const bool working = std::all_of(watches_.begin(), watches_.end(), [&](const auto& watch) {
      return watch->resource != resource || watch->working.load();
    });
    metrics::sample(out, kWatched, metrics::labels({{"resource", resource}}), working ? "1" : "0");
  }
  if (namespaces_.listed()) {
    const IgnoredNamespaces::Counts counts = namespaces_.counts();
    metrics::header(out, kIgnored);
    metrics::sample(out, kIgnored, metrics::labels({{"value", kBreakGlassValue}}), counts.break_glass);
    metrics::sample(out, kIgnored, metrics::labels({{"value", "other"}}), counts.other);
  }
  bool headed = false;
  for (const Object& object : objects_) {
    if (!object.store->listed()) continue;
    if (!headed) metrics::header(out, kPresent);
    headed = true;
    metrics::sample(out, kPresent, metrics::labels({{"object", object.label}}), object.store->exists() ? "1" : "0");
  }
}

}  // namespace gpuguard::webhook

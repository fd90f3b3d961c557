#include "gpuguard/claims/claim_cache.hpp"

#include <mutex>

#include <nlohmann/json.hpp>

#include "gpuguard/log/log.hpp"

namespace gpuguard::claims {
namespace {

using nlohmann::json;
using Status = admission::ClaimLookupResult::Status;

std::string string_at(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string{};
}

const json* object_at(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_object() ? &*it : nullptr;
}

// spec.devices.requests of a claim (or of a template's spec.spec): each request's device classes, from
// exactly.deviceClassName, every firstAvailable[].deviceClassName, or the older top-level deviceClassName.
json requests_of(const json* spec) {
  json requests = json::array();
  const json* devices = spec != nullptr ? object_at(*spec, "devices") : nullptr;
  const auto list = devices != nullptr ? devices->find("requests") : json::const_iterator{};
  if (devices == nullptr || list == devices->end() || !list->is_array()) return requests;
  for (const json& request : *list) {
    if (!request.is_object()) continue;
    json classes = json::array();
    if (auto direct = string_at(request, "deviceClassName"); !direct.empty()) classes.push_back(direct);
    if (const json* exactly = object_at(request, "exactly")) {
      if (auto name = string_at(*exactly, "deviceClassName"); !name.empty()) classes.push_back(name);
    }
    if (const auto first = request.find("firstAvailable"); first != request.end() && first->is_array()) {
      for (const json& sub : *first) {
        if (sub.is_object()) {
          if (auto name = string_at(sub, "deviceClassName"); !name.empty()) classes.push_back(name);
        }
      }
    }
    requests.push_back({{"name", string_at(request, "name")}, {"classes", std::move(classes)}});
  }
  return requests;
}

std::vector<admission::ClaimRequest> to_requests(const json& trimmed) {
  std::vector<admission::ClaimRequest> requests;
  for (const json& request : trimmed["requests"]) {
    admission::ClaimRequest r{request["name"].get<std::string>(), {}};
    for (const json& device_class : request["classes"]) r.device_classes.push_back(device_class.get<std::string>());
    requests.push_back(std::move(r));
  }
  return requests;
}

}  // namespace

json trim_claim(const json& object) {
  const json* metadata = object.is_object() ? object_at(object, "metadata") : nullptr;
  const json* spec = object.is_object() ? object_at(object, "spec") : nullptr;
  const bool is_template = object.is_object() && string_at(object, "kind") == "ResourceClaimTemplate";
  // A template's claim spec is one level deeper; a watch event's object may lack `kind`, so look for it.
  const json* claim_spec =
      spec != nullptr && object_at(*spec, "spec") != nullptr && (is_template || !object_at(*spec, "devices"))
          ? object_at(*spec, "spec")
          : spec;
  const std::string key =
      metadata == nullptr ? std::string{} : string_at(*metadata, "namespace") + "/" + string_at(*metadata, "name");
  return {{"key", key}, {"requests", requests_of(claim_spec)}};
}

// One of the two indexes as kube::Informers feeds it: each object parsed and reduced on its own, a list
// built aside and swapped in whole. Claims are few and small beside pods, so a DOM per object is fine.
class ClaimCache::IndexStore final : public kube::Store {
 public:
  IndexStore(ClaimCache& cache, Index& index, std::atomic<bool>& listed)
      : cache_(cache), index_(index), listed_(listed) {}

  void list_begin() override { pending_.clear(); }
  void list_item(std::string_view object) override {
    const json parsed = json::parse(object, nullptr, false);
    if (!parsed.is_object()) return;
    const json trimmed = trim_claim(parsed);
    pending_[trimmed["key"].get<std::string>()] = to_requests(trimmed);
  }
  void list_end(bool complete) override {
    if (complete) cache_.replace(index_, listed_, std::move(pending_));
    pending_ = {};
  }
  void apply(std::string_view type, std::string_view object) override {
    const json parsed = json::parse(object, nullptr, false);
    if (parsed.is_object()) cache_.apply(index_, type, trim_claim(parsed));
  }

 private:
  ClaimCache& cache_;
  Index& index_;
  std::atomic<bool>& listed_;
  Index pending_;
};

ClaimCache::ClaimCache()
    : claim_store_(std::make_unique<IndexStore>(*this, claims_, claims_listed_)),
      template_store_(std::make_unique<IndexStore>(*this, templates_, templates_listed_)) {}
ClaimCache::~ClaimCache() = default;

void log_claims_discovery(const kube::GroupDiscovery& found) {
  if (found.outcome == kube::GroupDiscovery::Outcome::served) {
    log::info("DRA claims are read through resource.k8s.io/" + found.version, {{"served", found.served}});
  } else if (found.outcome == kube::GroupDiscovery::Outcome::not_served) {
    log::warn(claims_off_note(found),
              {{"effect", "a container's DRA claims give it no GPU; the cluster has no DRA API to give one through"}});
  }
}

std::string claims_off_note(const kube::GroupDiscovery& found) {
  if (found.outcome != kube::GroupDiscovery::Outcome::not_served) return {};
  return "DRA claims off: the API server serves no resource.k8s.io version gpuguard reads (v1, v1beta2, v1beta1; "
         "served: " +
         (found.served.empty() ? std::string("none") : found.served) + ")";
}

std::vector<kube::WatchedResource> ClaimCache::watched_resources() {
  // v1beta2 has v1's shape; v1beta1 names a request's class at its top (requests_of reads all three).
  const std::vector<std::string> versions = {"v1", "v1beta2", "v1beta1"};
  return {{"resourceclaims", "/apis/resource.k8s.io/{version}/resourceclaims", "", claim_store_.get(), versions},
          {"resourceclaimtemplates", "/apis/resource.k8s.io/{version}/resourceclaimtemplates", "",
           template_store_.get(), versions}};
}

std::size_t ClaimCache::load_list(const json& list) {
  Index claims, templates;
  std::size_t taken = 0;
  if (list.is_object() && list.contains("items") && list["items"].is_array()) {
    for (const json& item : list["items"]) {
      if (!item.is_object()) continue;
      const std::string kind = string_at(item, "kind");
      if (kind != "ResourceClaim" && kind != "ResourceClaimTemplate") continue;
      const json trimmed = trim_claim(item);
      (kind == "ResourceClaim" ? claims : templates)[trimmed["key"].get<std::string>()] = to_requests(trimmed);
      ++taken;
    }
  }
  replace(claims_, claims_listed_, std::move(claims));
  replace(templates_, templates_listed_, std::move(templates));
  return taken;
}

void ClaimCache::replace(Index& index, std::atomic<bool>& listed, Index fresh) {
  std::unique_lock lock(mutex_);
  index.swap(fresh);
  listed.store(true);
}

void ClaimCache::apply(Index& index, std::string_view type, const json& trimmed) {
  std::string key = trimmed["key"].get<std::string>();
  std::unique_lock lock(mutex_);
  if (type == "DELETED") {
    index.erase(key);
  } else {
    index[std::move(key)] = to_requests(trimmed);
  }
}

admission::ClaimLookupResult ClaimCache::lookup(const Index& index, const std::atomic<bool>& listed,
                                                std::string_view pod_namespace, std::string_view name) const {
  if (!listed.load()) return {Status::not_synced, {}};
  std::string key(pod_namespace);
  key.append("/").append(name);
  std::shared_lock lock(mutex_);
  const auto found = index.find(key);
  if (found == index.end()) return {Status::unknown, {}};
  return {Status::found, found->second};
}

admission::ClaimLookupResult ClaimCache::claim(std::string_view pod_namespace, std::string_view name) const {
  return lookup(claims_, claims_listed_, pod_namespace, name);
}

admission::ClaimLookupResult ClaimCache::claim_template(std::string_view pod_namespace, std::string_view name) const {
  return lookup(templates_, templates_listed_, pod_namespace, name);
}

}  // namespace gpuguard::claims

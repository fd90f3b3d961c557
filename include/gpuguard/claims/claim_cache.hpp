#pragma once
// The DRA claims the webhook and the audit know: every ResourceClaim and ResourceClaimTemplate of the cluster, kept by
// list-and-watch (kube::Informers) in whichever resource.k8s.io version the API server serves, each reduced
// as it arrives to its requests' device classes. The admission core asks it through admission::ClaimLookup;
// the audit command fills it from a file instead.
#include <atomic>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gpuguard/admission/claims.hpp"
#include "gpuguard/kube/discovery.hpp"
#include "gpuguard/kube/informer.hpp"

namespace gpuguard::claims {

class ClaimCache final : public admission::ClaimLookup {
 public:
  ClaimCache();
  ~ClaimCache() override;
  ClaimCache(const ClaimCache&) = delete;
  ClaimCache& operator=(const ClaimCache&) = delete;

  // The two resources that feed the cache, for kube::Informers, in the newest resource.k8s.io version the
  // API server serves of v1 (Kubernetes 1.34+), v1beta2 (1.33) and v1beta1 (1.32).
  std::vector<kube::WatchedResource> watched_resources();
  // Fills the cache from a List such as `kubectl get resourceclaims,resourceclaimtemplates -A -o json`
  // prints; marks both kinds listed. Returns the number of objects taken.
  std::size_t load_list(const nlohmann::json& list);

  // The group the resources belong to, as kube::Informers::discovered() takes it.
  static constexpr const char* kGroup = "resource.k8s.io";
  // Both kinds have been listed at least once (or are not served, and count as listed and empty).
  bool synced() const { return claims_listed_.load() && templates_listed_.load(); }

  admission::ClaimLookupResult claim(std::string_view pod_namespace, std::string_view name) const override;
  admission::ClaimLookupResult claim_template(std::string_view pod_namespace, std::string_view name) const override;

 private:
  using Index = std::unordered_map<std::string, std::vector<admission::ClaimRequest>>;
  class IndexStore;
  admission::ClaimLookupResult lookup(const Index& index, const std::atomic<bool>& listed,
                                      std::string_view pod_namespace, std::string_view name) const;
  void replace(Index& index, std::atomic<bool>& listed, Index fresh);
  void apply(Index& index, std::string_view type, const nlohmann::json& trimmed);

  mutable std::shared_mutex mutex_;
  Index claims_, templates_;
  std::atomic<bool> claims_listed_{false}, templates_listed_{false};
  std::unique_ptr<IndexStore> claim_store_, template_store_;
};

// Logs which resource.k8s.io version the claims are read through, or that claims are off because the API
// server serves none that gpuguard reads: once, and again only when that changes (on_discovery).
void log_claims_discovery(const kube::GroupDiscovery& found);
// For /readyz: why claims are off once discovery found no version to read; empty otherwise.
std::string claims_off_note(const kube::GroupDiscovery& found);

// A ResourceClaim or ResourceClaimTemplate trimmed to what the cache keeps:
// {"key": "namespace/name", "requests": [{"name": ..., "classes": [...]}]}.
nlohmann::json trim_claim(const nlohmann::json& object);

}  // namespace gpuguard::claims

#pragma once
// What the admission core needs to know of the DRA claims a pod names: the device classes each request of
// a ResourceClaim or ResourceClaimTemplate asks for. Finding them is I/O (the webhook's list-and-watch
// cache, src/claims/claim_cache.cpp), so the core only asks this interface and gets plain data back.
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::admission {

struct ClaimRequest {
  std::string name;
  // exactly.deviceClassName, or the deviceClassName of every firstAvailable subrequest.
  std::vector<std::string> device_classes;
};

struct ClaimLookupResult {
  enum class Status {
    found,
    unknown,     // the cache is synced and holds no such object (yet)
    not_synced,  // the cache has not listed the claims yet, or there is no cache
  };
  Status status = Status::not_synced;
  std::vector<ClaimRequest> requests;  // when found
};

class ClaimLookup {
 public:
  virtual ~ClaimLookup() = default;
  virtual ClaimLookupResult claim(std::string_view pod_namespace, std::string_view name) const = 0;
  virtual ClaimLookupResult claim_template(std::string_view pod_namespace, std::string_view name) const = 0;
};

}  // namespace gpuguard::admission

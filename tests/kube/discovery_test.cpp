// Which resource.k8s.io version the webhook and the audit read claims through, from the group's discovery
// documents as Kubernetes 1.32 to 1.37 serve them (tests/fixtures/discovery), and what /readyz and the logs
// then say.
#include <catch2/catch.hpp>

#include "files.hpp"
#include "gpuguard/claims/claim_cache.hpp"
#include "gpuguard/kube/discovery.hpp"

using namespace gpuguard;
using Outcome = kube::GroupDiscovery::Outcome;

namespace {

const std::vector<std::string> kClaimVersions = {"v1", "v1beta2", "v1beta1"};

kube::GroupDiscovery discover(unsigned status, const std::string& fixture) {
  return kube::choose_group_version(status, test::read_file(test::fixtures_dir() / "discovery" / fixture),
                                    kClaimVersions);
}

}  // namespace

TEST_CASE("kube discovery: the newest served version that the client reads, from each release's APIGroup") {
  struct Row {
    const char* fixture;
    Outcome outcome;
    const char* version;
    const char* served;
  };
  const Row rows[] = {
      {"resource-v1-only.json", Outcome::served, "v1", "v1"},
      {"resource-all-three.json", Outcome::served, "v1", "v1,v1beta2,v1beta1"},
      {"resource-1.33-betas.json", Outcome::served, "v1beta2", "v1beta2,v1beta1"},
      {"resource-1.32-v1beta1.json", Outcome::served, "v1beta1", "v1beta1"},
      {"resource-alpha-only.json", Outcome::not_served, "", "v1alpha3"},
  };
  for (const Row& row : rows) {
    INFO(row.fixture);
    const kube::GroupDiscovery found = discover(200, row.fixture);
    CHECK(found.outcome == row.outcome);
    CHECK(found.version == row.version);
    CHECK(found.served == row.served);
  }
}

TEST_CASE("kube discovery: 404 is a group not served, and other failures and non-APIGroup answers are retried") {
  CHECK(discover(404, "not-found-status.json").outcome == Outcome::not_served);
  CHECK(discover(200, "not-found-status.json").outcome == Outcome::unreadable);
  CHECK(discover(403, "resource-v1-only.json").outcome == Outcome::unreadable);
  CHECK(discover(500, "resource-v1-only.json").outcome == Outcome::unreadable);
  CHECK(discover(0, "resource-v1-only.json").outcome == Outcome::unreadable);
  CHECK(kube::choose_group_version(200, "{\"kind\":\"APIGroup\",\"versions\":7}", kClaimVersions).outcome ==
        Outcome::unreadable);
  CHECK(kube::choose_group_version(200, "not json", kClaimVersions).outcome == Outcome::unreadable);
  CHECK(kube::choose_group_version(200, "{\"kind\":\"APIGroup\",\"versions\":[{\"version\":1},\"v1\"]}", kClaimVersions)
            .outcome == Outcome::not_served);
}

TEST_CASE("kube discovery: a versioned path names its group") {
  CHECK(kube::group_of_versioned_path("/apis/resource.k8s.io/{version}/resourceclaims") == "resource.k8s.io");
  CHECK(kube::group_of_versioned_path("/apis/resource.k8s.io/v1/resourceclaims").empty());
  CHECK(kube::group_of_versioned_path("/api/{version}/pods").empty());
  CHECK(kube::group_of_versioned_path("/apis//{version}/x").empty());
}

TEST_CASE("kube discovery: the claim cache watches a versioned path in resource.k8s.io, and says when claims are off") {
  claims::ClaimCache cache;
  for (const kube::WatchedResource& resource : cache.watched_resources()) {
    INFO(resource.name);
    CHECK(kube::group_of_versioned_path(resource.path) == claims::ClaimCache::kGroup);
    CHECK(resource.versions == kClaimVersions);
  }
  CHECK(claims::claims_off_note(discover(200, "resource-1.33-betas.json")).empty());
  CHECK(claims::claims_off_note(kube::GroupDiscovery{}).empty());
  CHECK(claims::claims_off_note(discover(404, "not-found-status.json")) ==
        "DRA claims off: the API server serves no resource.k8s.io version gpuguard reads (v1, v1beta2, v1beta1; "
        "served: none)");
  CHECK(claims::claims_off_note(discover(200, "resource-alpha-only.json")).find("served: v1alpha3)") !=
        std::string::npos);
}

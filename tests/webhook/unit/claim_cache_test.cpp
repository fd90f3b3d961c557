// The webhook's DRA claim cache, driven as kube::Informers drives it: lists, then watch events. What it
// answers decides whether a container counts as a GPU user, so "not listed yet", "unknown" and every
// shape of request (exactly, firstAvailable, the older top-level deviceClassName) are pinned here.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "gpuguard/claims/claim_cache.hpp"
#include "stores.hpp"

using gpuguard::admission::ClaimLookupResult;
using gpuguard::claims::ClaimCache;
using gpuguard::claims::trim_claim;
using nlohmann::json;
using Status = ClaimLookupResult::Status;

namespace {

json claim(const std::string& ns, const std::string& name, json requests) {
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceClaim"},
          {"metadata", {{"namespace", ns}, {"name", name}}},
          {"spec", {{"devices", {{"requests", std::move(requests)}}}}}};
}

// As a watch event carries it: no `kind`, so the cache must tell a template by its shape.
json template_event(const std::string& ns, const std::string& name, json requests) {
  return {{"metadata", {{"namespace", ns}, {"name", name}}},
          {"spec", {{"spec", {{"devices", {{"requests", std::move(requests)}}}}}}}};
}

json exactly(const std::string& name, const std::string& device_class) {
  return {{"name", name}, {"exactly", {{"deviceClassName", device_class}, {"count", 1}}}};
}

std::vector<std::string> classes(const ClaimLookupResult& result) {
  std::vector<std::string> all;
  for (const auto& request : result.requests) {
    for (const auto& device_class : request.device_classes) all.push_back(request.name + ":" + device_class);
  }
  return all;
}

}  // namespace

TEST_CASE("claim cache: nothing is known until both kinds are listed, then events keep it current") {
  ClaimCache cache;
  auto resources = cache.watched_resources();
  REQUIRE(resources.size() == 2);
  auto& claims = resources[0];
  auto& templates = resources[1];
  CHECK(claims.path == "/apis/resource.k8s.io/{version}/resourceclaims");
  CHECK(templates.path == "/apis/resource.k8s.io/{version}/resourceclaimtemplates");

  CHECK(cache.claim("ml", "gpus").status == Status::not_synced);
  gpuguard::test::list(*claims.store, {claim("ml", "gpus", json::array({exactly("gpu", "gpu.nvidia.com")}))});
  CHECK_FALSE(cache.synced());
  CHECK(cache.claim("ml", "gpus").status == Status::found);
  CHECK(cache.claim_template("ml", "anything").status == Status::not_synced);
  gpuguard::test::list(*templates.store, {});
  CHECK(cache.synced());
  CHECK(cache.claim_template("ml", "anything").status == Status::unknown);

  CHECK(classes(cache.claim("ml", "gpus")) == std::vector<std::string>{"gpu:gpu.nvidia.com"});
  CHECK(cache.claim("other-namespace", "gpus").status == Status::unknown);

  gpuguard::test::event(*templates.store, "ADDED",
                        template_event("ml", "one-gpu", json::array({exactly("gpu", "mig.nvidia.com")})));
  CHECK(classes(cache.claim_template("ml", "one-gpu")) == std::vector<std::string>{"gpu:mig.nvidia.com"});

  gpuguard::test::event(*claims.store, "MODIFIED",
                        claim("ml", "gpus", json::array({exactly("nic", "nic.example.com")})));
  CHECK(classes(cache.claim("ml", "gpus")) == std::vector<std::string>{"nic:nic.example.com"});

  gpuguard::test::event(*claims.store, "DELETED", claim("ml", "gpus", json::array()));
  CHECK(cache.claim("ml", "gpus").status == Status::unknown);

  // A list that fails partway changes nothing; text that is no object is passed over.
  claims.store->list_begin();
  claims.store->list_item(gpuguard::kube::PaddedText(claim("ml", "late", json::array()).dump()).view());
  claims.store->list_item(gpuguard::kube::PaddedText("[1, 2]").view());
  claims.store->list_end(false);
  CHECK(cache.claim("ml", "late").status == Status::unknown);
  CHECK(cache.claim_template("ml", "one-gpu").status == Status::found);

  // A re-list replaces what was there: an object deleted during an outage is gone afterwards.
  gpuguard::test::list(*templates.store, {});
  CHECK(cache.claim_template("ml", "one-gpu").status == Status::unknown);
}

TEST_CASE("claim cache: every request shape gives its device classes") {
  const json first_available = {
      {"name", "any-accelerator"},
      {"firstAvailable", json::array({{{"name", "big"}, {"deviceClassName", "gpu.nvidia.com"}},
                                      {{"name", "small"}, {"deviceClassName", "mig.nvidia.com"}}})}};
  const json older = {{"name", "legacy"}, {"deviceClassName", "gpu.example.com"}};  // v1beta1's form
  const json trimmed = trim_claim(claim("ml", "mixed", json::array({first_available, older, exactly("nic", "nic")})));
  CHECK(trimmed == json{{"key", "ml/mixed"},
                        {"requests",
                         {{{"name", "any-accelerator"}, {"classes", {"gpu.nvidia.com", "mig.nvidia.com"}}},
                          {{"name", "legacy"}, {"classes", {"gpu.example.com"}}},
                          {{"name", "nic"}, {"classes", {"nic"}}}}}});

  // A template with kind set is read from spec.spec as well.
  json with_kind = template_event("ml", "t", json::array({exactly("gpu", "gpu.nvidia.com")}));
  with_kind["kind"] = "ResourceClaimTemplate";
  CHECK(trim_claim(with_kind)["requests"][0]["classes"] == json{"gpu.nvidia.com"});
}

TEST_CASE("claim cache: malformed objects are kept as claims without requests, never a crash") {
  for (const json& bad :
       {json(nullptr), json("text"), json::object(), json{{"metadata", 3}},
        json{{"metadata", {{"name", "x"}}}, {"spec", {{"devices", {{"requests", "all"}}}}}},
        json{{"metadata", {{"name", "x"}}}, {"spec", {{"devices", {{"requests", {1, "a", nullptr}}}}}}},
        json{{"metadata", {{"name", "x"}}},
             {"spec", {{"devices", {{"requests", {{{"name", 5}, {"exactly", "gpu"}}}}}}}}}}) {
    INFO(bad.dump());
    const json trimmed = trim_claim(bad);
    CHECK(trimmed["requests"].is_array());
    for (const json& request : trimmed["requests"]) CHECK(request["classes"].empty());
  }
}

TEST_CASE("claim cache: load_list takes claims and templates and counts only those") {
  ClaimCache cache;
  json tmpl = template_event("dra", "t", json::array({exactly("gpu", "gpu.nvidia.com")}));
  tmpl["kind"] = "ResourceClaimTemplate";
  const json list = {{"kind", "List"},
                     {"items",
                      {claim("dra", "c", json::array({exactly("gpu", "gpu.nvidia.com")})),
                       tmpl,
                       {{"kind", "Pod"}, {"metadata", {{"name", "p"}}}}}}};
  CHECK(cache.load_list(list) == 2);
  CHECK(cache.synced());
  CHECK(cache.claim("dra", "c").status == Status::found);
  CHECK(cache.claim_template("dra", "t").status == Status::found);
  CHECK(cache.claim("dra", "t").status == Status::unknown);

  ClaimCache empty;
  CHECK(empty.load_list(json{{"kind", "List"}, {"items", json::array()}}) == 0);
  CHECK(empty.synced());
}

// The fixture table: every case under tests/fixtures/admission is reviewed, its patch applied with an
// independent RFC 6902 implementation (nlohmann::json::patch), the result compared with the expected
// object, and the result reviewed again to prove that reinvocation gives no patch.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>

#include "files.hpp"
#include "gpuguard/admission/base64.hpp"
#include "gpuguard/admission/review.hpp"
#include "gpuguard/claims/claim_cache.hpp"

using gpuguard::admission::review;
using gpuguard::policy::Policy;
using nlohmann::json;
namespace t = gpuguard::test;

namespace {

// Reviews the text as it is: the field order it has is the order the decoder sees.
json review_text(std::string text, const Policy& policy = Policy{},
                 const gpuguard::admission::ClaimLookup* claims = nullptr) {
  const auto outcome = review(std::move(text), policy, claims);
  INFO(outcome.body);
  REQUIRE(outcome.ok);
  return json::parse(outcome.body);
}

json review_json(const json& request, const Policy& policy = Policy{},
                 const gpuguard::admission::ClaimLookup* claims = nullptr) {
  return review_text(request.dump(), policy, claims);
}

// The position of `"key":` in a JSON text, to check that a test sends the order it says it does.
std::size_t position(const std::string& text, const std::string& key) { return text.find("\"" + key + "\":"); }

// A case's policy.json holds the ConfigMap's files as {key: text}; no file means the defaults.
Policy policy_of(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "policy.json")) return Policy{};
  const auto files = t::read_json(dir / "policy.json").get<std::map<std::string, std::string>>();
  auto parsed = gpuguard::policy::parse_policy(files);
  INFO(parsed.error);
  REQUIRE(parsed.policy.has_value());
  return *parsed.policy;
}

// A case's claims.json is the cluster's ResourceClaims and ResourceClaimTemplates, as `kubectl get
// resourceclaims,resourceclaimtemplates -A -o json` lists them; without it, no claim can be looked up.
std::unique_ptr<gpuguard::claims::ClaimCache> claims_of(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "claims.json")) return nullptr;
  auto cache = std::make_unique<gpuguard::claims::ClaimCache>();
  cache->load_list(t::read_json(dir / "claims.json"));
  return cache;
}

json decoded_patch(const json& response) {
  const auto bytes = gpuguard::admission::base64_decode(response["response"]["patch"].get<std::string>());
  REQUIRE(bytes.has_value());
  return json::parse(*bytes);
}

}  // namespace

TEST_CASE("admission fixtures: patch applies, matches the expected object, and is idempotent") {
  for (const auto& dir : t::fixture_cases("admission")) {
    DYNAMIC_SECTION(dir.filename().string()) {
      const json request = t::read_json(dir / "review.json");
      const json expect = t::read_json(dir / "expect.json");
      INFO(expect["about"].get<std::string>());

      const Policy policy = policy_of(dir);
      const auto claims = claims_of(dir);
      const json response = review_json(request, policy, claims.get());
      CHECK(response["apiVersion"] == request["apiVersion"]);
      CHECK(response["kind"] == "AdmissionReview");
      CHECK(response["response"]["uid"] == request["request"]["uid"]);
      const bool allowed = expect.value("allowed", true);
      CHECK(response["response"]["allowed"] == allowed);
      if (allowed) {
        CHECK_FALSE(response["response"].contains("status"));
      } else {
        CHECK(response["response"]["status"]["code"] == 403);
        CHECK_THAT(response["response"]["status"]["message"].get<std::string>(),
                   Catch::Contains(expect["message_contains"].get<std::string>()));
      }
      CHECK(response["response"].value("auditAnnotations", json::object()) ==
            expect.value("auditAnnotations", json::object()));

      const json warnings = response["response"].value("warnings", json::array());
      CHECK(warnings.size() == expect["warnings"].get<std::size_t>());
      for (const auto& warning : warnings) CHECK(warning.get<std::string>().size() <= 120);

      if (!expect["patched"].get<bool>()) {
        CHECK_FALSE(response["response"].contains("patch"));
        CHECK_FALSE(response["response"].contains("patchType"));
        continue;
      }
      REQUIRE(response["response"]["patchType"] == "JSONPatch");
      const json patch = decoded_patch(response);
      const json patched = request["request"]["object"].patch(patch);
      CHECK(patched == t::read_json(dir / "expected-object.json"));

      json again = request;
      again["request"]["object"] = patched;
      const json second = review_json(again, policy, claims.get());
      CHECK(second["response"]["allowed"] == true);
      CHECK_FALSE(second["response"].contains("patch"));
      CHECK_FALSE(second["response"].contains("patchType"));
    }
  }
}

TEST_CASE("invalid reviews are refused with a reason naming the problem") {
  const json reasons = t::read_json(t::fixtures_dir() / "invalid" / "reasons.json");
  REQUIRE(reasons.size() >= 15);
  for (const auto& [name, reason] : reasons.items()) {
    DYNAMIC_SECTION(name) {
      const auto outcome = review(t::read_file(t::fixtures_dir() / "invalid" / (name + ".json")), Policy{});
      CHECK_FALSE(outcome.ok);
      CHECK_THAT(outcome.body, Catch::Contains(reason.get<std::string>()));
    }
  }
}

TEST_CASE("field order does not matter: object before kind, request before apiVersion") {
  const json original = t::read_json(t::fixtures_dir() / "admission" / "user-all" / "review.json");
  nlohmann::ordered_json reordered;
  reordered["request"]["object"] = original["request"]["object"];
  reordered["request"]["operation"] = "CREATE";
  reordered["request"]["uid"] = original["request"]["uid"];
  reordered["request"]["kind"] = original["request"]["kind"];
  reordered["kind"] = "AdmissionReview";
  reordered["apiVersion"] = "admission.k8s.io/v1";

  const std::string text = reordered.dump();
  REQUIRE(position(text, "object") < position(text, "kind"));
  REQUIRE(position(text, "request") < position(text, "apiVersion"));
  const json by_order = review_text(text);
  const json by_fixture = review_json(original);
  CHECK(by_order["response"]["patch"] == by_fixture["response"]["patch"]);
  CHECK(by_order["response"]["uid"] == original["request"]["uid"]);
}

TEST_CASE("warnings stay within 120 characters for the longest container names") {
  json request = t::read_json(t::fixtures_dir() / "admission" / "duplicates" / "review.json");
  request["request"]["object"]["spec"]["containers"][0]["name"] = std::string(63, 'x');
  request["request"]["object"]["spec"]["containers"][0]["securityContext"] = {{"privileged", true}};
  const json response = review_json(request);
  const json warnings = response["response"]["warnings"];
  REQUIRE(warnings.size() == 4);
  for (const auto& warning : warnings) CHECK(warning.get<std::string>().size() <= 120);
}

TEST_CASE("a large pod is reviewed through a parser of its own and still patched correctly") {
  json request = t::read_json(t::fixtures_dir() / "admission" / "other-env" / "review.json");
  json& containers = request["request"]["object"]["spec"]["containers"];
  const json base = containers[0];
  for (int i = 1; i < 400; ++i) {
    json c = base;
    c["name"] = std::string("c").append(std::to_string(i));
    for (int e = 0; e < 40; ++e)
      c["env"].push_back({{"name", std::string("VAR_").append(std::to_string(e))}, {"value", std::string(64, 'v')}});
    containers.push_back(c);
  }
  REQUIRE(request.dump().size() > std::size_t{1024} * 1024);
  const json response = review_json(request);
  const json patched = request["request"]["object"].patch(decoded_patch(response));
  for (const auto& c : patched["spec"]["containers"]) {
    CHECK(c["env"].back() == json({{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "none"}}));
  }
}

TEST_CASE("the response echoes any uid exactly, escaping what JSON requires") {
  json request = t::read_json(t::fixtures_dir() / "admission" / "user-all" / "review.json");
  request["request"]["object"]["spec"]["containers"][0]["name"] = "app \"quoted\" \\ é";
  for (const std::string& uid : {std::string("plain"), std::string("q\"b\\s/\x01\x1f\t\n"), std::string("ünïcødé-✓")}) {
    request["request"]["uid"] = uid;
    const json response = review_json(request);
    CHECK(response["response"]["uid"] == uid);
    CHECK_THAT(response["response"]["warnings"][0].get<std::string>(), Catch::Contains("app \"quoted\" \\ é"));
  }
}

TEST_CASE("duplicate keys: the last one counts, as for the JSON decoders downstream, and the patch applies") {
  // Raw text: a JSON library would collapse the duplicates before the webhook could see them.
  const std::string head =
      R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE",)"
      R"("kind":{"group":"","version":"v1","kind":"Pod"},"namespace":"team-a","object":)";
  const std::string tail = "}}";
  const std::pair<const char*, const char*> cases[] = {
      {"env twice",
       R"({"metadata":{"name":"p"},"spec":{"containers":[{"name":"app","env":[{"name":"NVIDIA_VISIBLE_DEVICES","value":"all"},{"name":"A","value":"1"}],"env":[{"name":"B","value":"2"}]}]}})"},
      {"containers twice",
       R"({"metadata":{"name":"p"},"spec":{"containers":[{"name":"gone"}],"containers":[{"name":"x","env":[]}]}})"},
      {"limits twice",
       R"({"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"},"limits":{"nvidia.com/gpu":"0"}}}]}})"},
      {"one resource twice",
       R"({"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpu":"0"}}}]}})"},
      {"annotations twice",
       R"({"metadata":{"annotations":{"kubernetes.io/config.mirror":"x"},"annotations":{}},"spec":{"containers":[{"name":"c"}]}})"},
      {"value twice",
       R"({"spec":{"containers":[{"name":"c","env":[{"name":"NVIDIA_VISIBLE_DEVICES","value":"none","value":null}]}]}})"},
  };
  for (const auto& [name, object] : cases) {
    DYNAMIC_SECTION(name) {
      const std::string body = std::string(head).append(object).append(tail);
      const auto outcome = review(body, Policy{});
      REQUIRE(outcome.ok);
      REQUIRE(outcome.patched);
      const json response = json::parse(outcome.body);
      const json pod = json::parse(object);  // nlohmann keeps the last duplicate
      const json patched = pod.patch(decoded_patch(response));
      for (const auto& c : patched["spec"]["containers"]) {
        std::size_t entries = 0;
        for (const auto& e : c["env"])
          entries += e["name"] == "NVIDIA_VISIBLE_DEVICES" &&
                     e == json({{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "none"}});
        CHECK(entries == 1);
      }
      json again = json::parse(std::string(head).append("null").append(tail));
      again["request"]["object"] = patched;
      CHECK_FALSE(review_json(again)["response"].contains("patch"));
    }
  }
  // Two requests: the last one is the review.
  const std::string twice =
      R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",)"
      R"("request":{"uid":"first","operation":"DELETE","kind":{"group":"apps","version":"v1","kind":"Deployment"}},)"
      R"("request":{"uid":"second","operation":"CREATE","kind":{"group":"","version":"v1","kind":"Pod"},)"
      R"("object":{"spec":{"containers":[{"name":"c"}]}}}})";
  const auto outcome = review(twice, Policy{});
  REQUIRE(outcome.ok);
  CHECK(outcome.uid == "second");
  CHECK(outcome.patched);
}

TEST_CASE("ephemeral UPDATE with oldObject before object, and the fields that decide after both") {
  const json original = t::read_json(t::fixtures_dir() / "admission" / "ephemeral-update" / "review.json");
  const json expected = review_json(original)["response"]["patch"];
  nlohmann::ordered_json old_first;
  old_first["apiVersion"] = "admission.k8s.io/v1";
  old_first["kind"] = "AdmissionReview";
  old_first["request"]["uid"] = original["request"]["uid"];
  old_first["request"]["oldObject"] = original["request"]["oldObject"];
  old_first["request"]["object"] = original["request"]["object"];
  old_first["request"]["subResource"] = "ephemeralcontainers";  // only now is it a mutable request
  old_first["request"]["operation"] = "UPDATE";
  old_first["request"]["kind"] = original["request"]["kind"];
  const std::string text = old_first.dump();
  REQUIRE(position(text, "oldObject") < position(text, "object"));
  REQUIRE(position(text, "object") < position(text, "subResource"));
  CHECK(review_text(text)["response"]["patch"] == expected);
}

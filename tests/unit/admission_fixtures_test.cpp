// The fixture table: every case under tests/fixtures/admission is reviewed, its patch applied with an
// independent RFC 6902 implementation (nlohmann::json::patch), the result compared with the expected
// object, and the result reviewed again to prove that reinvocation gives no patch.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>

#include "files.hpp"
#include "gpuguard/admission/base64.hpp"
#include "gpuguard/admission/review.hpp"

using gpuguard::admission::Policy;
using gpuguard::admission::review;
using nlohmann::json;
namespace t = gpuguard::test;

namespace {

json review_json(const json& request, const Policy& policy = Policy{}) {
  const auto outcome = review(request.dump(), policy);
  INFO(outcome.body);
  REQUIRE(outcome.ok);
  return json::parse(outcome.body);
}

// A case's policy.json holds the ConfigMap's files as {key: text}; no file means the defaults.
Policy policy_of(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "policy.json")) return Policy{};
  const auto files = t::read_json(dir / "policy.json").get<std::map<std::string, std::string>>();
  auto parsed = gpuguard::admission::parse_policy(files);
  INFO(parsed.error);
  REQUIRE(parsed.policy.has_value());
  return *parsed.policy;
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
      const json response = review_json(request, policy);
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
      const json second = review_json(again, policy);
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

  const json by_order = review_json(json::parse(reordered.dump()));
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
    c["name"] = "c" + std::to_string(i);
    for (int e = 0; e < 40; ++e) c["env"].push_back({{"name", "VAR_" + std::to_string(e)}, {"value", std::string(64, 'v')}});
    containers.push_back(c);
  }
  REQUIRE(request.dump().size() > 1024 * 1024);
  const json response = review_json(request);
  const json patched = request["request"]["object"].patch(decoded_patch(response));
  for (const auto& c : patched["spec"]["containers"]) {
    CHECK(c["env"].back() == json({{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "none"}}));
  }
}

TEST_CASE("the response echoes any uid exactly, escaping what JSON requires") {
  json request = t::read_json(t::fixtures_dir() / "admission" / "user-all" / "review.json");
  request["request"]["object"]["spec"]["containers"][0]["name"] = "app \"quoted\" \\ é";
  for (const std::string uid : {std::string("plain"), std::string("q\"b\\s/\x01\x1f\t\n"), std::string("ünïcødé-✓")}) {
    request["request"]["uid"] = uid;
    const json response = review_json(request);
    CHECK(response["response"]["uid"] == uid);
    CHECK_THAT(response["response"]["warnings"][0].get<std::string>(), Catch::Contains("app \"quoted\" \\ é"));
  }
}

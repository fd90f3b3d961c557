// The arm command's decision (webhook::arming): when a Deployment can answer, and the JSON Patch that
// arms each object, over the shapes the API server serves them in. Each patch is applied here with
// nlohmann's RFC 6902 implementation, an implementation independent of the one that wrote it.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "gpuguard/webhook/arming.hpp"

using namespace gpuguard::webhook;
using nlohmann::json;

TEST_CASE("arming: a Deployment can answer once a replica is available") {
  struct Row {
    json deployment;
    bool available;
    std::string waiting;
  };
  const Row rows[] = {
      {{{"spec", {{"replicas", 3}}}, {"status", {{"availableReplicas", 1}, {"replicas", 3}}}}, true, ""},
      {{{"spec", {{"replicas", 3}}}, {"status", {{"replicas", 3}, {"unavailableReplicas", 3}}}},
       false,
       "0 of 3 replicas available"},
      {{{"spec", {{"replicas", 3}}}}, false, "0 of 3 replicas available"},  // status not written yet
      {{{"spec", {{"replicas", 3}}}, {"status", {{"availableReplicas", "3"}}}}, false, "0 of 3 replicas available"},
  };
  for (const Row& row : rows) {
    INFO(row.deployment.dump());
    const auto result = arming::deployment_availability(row.deployment.dump());
    CHECK(result.available == row.available);
    CHECK(result.waiting == row.waiting);
  }
  CHECK(arming::deployment_availability("not json").waiting == "the Deployment is not a JSON object");
  CHECK(arming::deployment_availability("[]").waiting == "the Deployment is not a JSON object");
}

TEST_CASE("arming: the webhook configuration's webhook is set to Fail, tested by name at its index") {
  const json configuration = {
      {"metadata", {{"name", "gpuguard"}}},
      {"webhooks", json::array({{{"name", "other.example.com"}, {"failurePolicy", "Ignore"}},
                                {{"name", "visible-devices.gpuguard.io"}, {"failurePolicy", "Ignore"}}})}};
  const arming::Step step = arming::webhook_step(configuration.dump(), "visible-devices.gpuguard.io");
  REQUIRE(step.error.empty());
  REQUIRE(step.patch);
  const json armed = configuration.patch(json::parse(*step.patch));
  CHECK(armed["webhooks"][1]["failurePolicy"] == "Fail");
  CHECK(armed["webhooks"][0]["failurePolicy"] == "Ignore");  // another webhook is left alone
  // Armed already: nothing to send.
  CHECK_FALSE(arming::webhook_step(armed.dump(), "visible-devices.gpuguard.io").patch);
  // The configuration changed between read and patch (the webhook moved): the test op refuses the patch.
  json moved = configuration;
  std::swap(moved["webhooks"][0], moved["webhooks"][1]);
  CHECK_THROWS(moved.patch(json::parse(*step.patch)));
  // No such webhook, or not an object: a reason, no patch.
  const arming::Step missing = arming::webhook_step(configuration.dump(), "gone.gpuguard.io");
  CHECK_FALSE(missing.patch);
  CHECK(missing.error == "the MutatingWebhookConfiguration has no webhook named gone.gpuguard.io");
  CHECK_FALSE(arming::webhook_step("{\"webhooks\": 3}", "visible-devices.gpuguard.io").patch);
  CHECK(arming::webhook_step("null", "x").error == "the MutatingWebhookConfiguration is not a JSON object");
}

TEST_CASE("arming: the backstop binding denies, and only denies") {
  for (const json& actions : {json::array({"Warn", "Audit"}), json::array({"Audit"}), json::array({"Deny", "Audit"})}) {
    const json binding = {{"spec", {{"policyName", "gpuguard-visible-devices"}, {"validationActions", actions}}}};
    const arming::Step step = arming::binding_step(binding.dump());
    REQUIRE(step.patch);
    const json armed = binding.patch(json::parse(*step.patch));
    CHECK(armed["spec"]["validationActions"] == json::array({"Deny"}));
    CHECK(armed["spec"]["policyName"] == "gpuguard-visible-devices");
    CHECK_FALSE(arming::binding_step(armed.dump()).patch);
  }
  CHECK(arming::binding_step("[1]").error == "the ValidatingAdmissionPolicyBinding is not a JSON object");
}

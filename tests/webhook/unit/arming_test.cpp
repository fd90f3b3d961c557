// The arm command's decision (webhook::arming): when a Deployment can answer, and the JSON Patch that
// arms each object, over the shapes the API server serves them in. Each patch is applied here with
// nlohmann's RFC 6902 implementation, an implementation independent of the one that wrote it.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "files.hpp"
#include "gpuguard/admission/base64.hpp"
#include "gpuguard/admission/review.hpp"
#include "gpuguard/policy/policy.hpp"
#include "gpuguard/webhook/arming.hpp"

using namespace gpuguard;
using namespace gpuguard::webhook;
using nlohmann::json;

namespace {

// The probe pod as the API server sends it to the webhook: a CREATE review.
json probe_review(const json& pod) {
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", "probe"},
            {"operation", "CREATE"},
            {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
            {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
            {"namespace", "default"},
            {"object", pod}}}};
}

}  // namespace

TEST_CASE("arming: a DaemonSet is rolled out once every node it should run on has a ready pod of it") {
  struct Row {
    json daemonset;
    bool done;
    std::string waiting;
  };
  const auto status = [](int observed, int desired, int updated, int ready) {
    return json{{"metadata", {{"generation", 2}}},
                {"status",
                 {{"observedGeneration", observed},
                  {"desiredNumberScheduled", desired},
                  {"updatedNumberScheduled", updated},
                  {"numberReady", ready}}}};
  };
  const Row rows[] = {
      {status(2, 3, 3, 3), true, ""},
      {status(2, 0, 0, 0), true, ""},  // no node to run on: nothing to wait for
      {status(1, 3, 3, 3), false, "the DaemonSet's controller has not seen its generation 2 yet"},
      {{{"metadata", {{"generation", 1}}}}, false, "the DaemonSet's controller has not seen its generation 1 yet"},
      {status(2, 3, 3, 2), false, "2 of 3 nodes ready"},
      {status(2, 3, 1, 3), false, "1 of 3 nodes ready"},  // ready, but of an older template
  };
  for (const Row& row : rows) {
    INFO(row.daemonset.dump());
    const auto result = arming::daemonset_rollout(row.daemonset.dump());
    CHECK(result.available == row.done);
    CHECK(result.waiting == row.waiting);
  }
  CHECK(arming::daemonset_rollout("[]").waiting == "the DaemonSet is not a JSON object");
}

TEST_CASE("arming: the pods of a DaemonSet that are not ready are named by their node") {
  CHECK(arming::daemonset_pod_selector(
            json{{"spec", {{"selector", {{"matchLabels", {{"app", "x"}, {"tier", "node"}}}}}}}}.dump()) ==
        "app=x,tier=node");
  CHECK(arming::daemonset_pod_selector(
            json{{"spec", {{"selector", {{"matchExpressions", json::array({{{"key", "app"}}})}}}}}}.dump())
            .empty());
  CHECK(arming::daemonset_pod_selector(json{{"spec", {{"selector", {{"matchLabels", {{"app", 1}}}}}}}}.dump()).empty());
  CHECK(arming::daemonset_pod_selector("[]").empty());
  const auto pod = [](const std::string& name, const std::string& node, const std::string& ready) {
    json p = {{"metadata", {{"name", name}}}, {"spec", json::object()}, {"status", json::object()}};
    if (!node.empty()) p["spec"]["nodeName"] = node;
    if (!ready.empty()) {
      p["status"]["conditions"] =
          json::array({{{"type", "PodScheduled"}, {"status", "True"}}, {{"type", "Ready"}, {"status", ready}}});
    }
    return p;
  };
  const json list = {{"kind", "PodList"},
                     {"metadata", {{"continue", "next-page"}}},
                     {"items", json::array({pod("a", "gpu-1", "True"), pod("b", "gpu-2", "False"),
                                            pod("c", "gpu-3", ""), pod("d", "", "")})}};
  const auto page = arming::pods_not_ready(list.dump());
  CHECK(page.error.empty());
  CHECK(page.where == std::vector<std::string>{"gpu-2", "gpu-3", "pod d, on no node"});
  CHECK(page.next == "next-page");
  CHECK(arming::pods_not_ready(json{{"items", json::array()}}.dump()).next.empty());
  CHECK(arming::pods_not_ready("{}").error == "not a PodList");
  CHECK(arming::pods_not_ready("not json").error == "not a PodList");
}

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
  // Rolled out as well (replicas told apart): every replica of the current template, its spec seen.
  const json rolled_out = {
      {"metadata", {{"generation", 4}}},
      {"spec", {{"replicas", 3}}},
      {"status", {{"observedGeneration", 4}, {"replicas", 3}, {"updatedReplicas", 3}, {"availableReplicas", 2}}}};
  json rolling = rolled_out;
  rolling["status"]["replicas"] = 4;  // a surge pod of the new template, three of the old
  rolling["status"]["updatedReplicas"] = 1;
  json unseen = rolled_out;
  unseen["metadata"]["generation"] = 5;
  json none_available = rolled_out;
  none_available["status"]["availableReplicas"] = 0;
  const Row rolled_rows[] = {
      {rolled_out, true, ""},
      {rolling, false, "a rollout is under way: 1 of 4 replicas run the current template"},
      {unseen, false, "the Deployment's controller has not seen its generation 5 yet"},
      {none_available, false, "0 of 3 replicas available"},
  };
  for (const Row& row : rolled_rows) {
    INFO(row.deployment.dump());
    const auto result = arming::deployment_availability(row.deployment.dump(), true);
    CHECK(result.available == row.available);
    CHECK(result.waiting == row.waiting);
    const bool any_available = row.deployment != none_available;
    CHECK(arming::deployment_availability(row.deployment.dump(), false).available == any_available);
  }
}

TEST_CASE("arming: the Deployment's Warning Event names it by its UID, where it has one") {
  CHECK(arming::metadata_uid(R"({"metadata":{"name":"gpuguard-webhook","uid":"5f0c-11"}})") == "5f0c-11");
  CHECK(arming::metadata_uid(R"({"metadata":{"name":"gpuguard-webhook"}})").empty());
  CHECK(arming::metadata_uid(R"({"metadata":{"uid":7}})").empty());
  CHECK(arming::metadata_uid(R"({"metadata":[]})").empty());
  CHECK(arming::metadata_uid("not json").empty());
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

TEST_CASE("arming: the probe shows the API server called the webhook by the webhook's own words alone") {
  const json sent =
      json::parse(arming::probe_pod_json("gpuguard-webhook-arm-probe-", "registry.example.com/gpuguard:0.1.0"));
  // It tolerates every taint, so that with the chart's webhook.gpuNodeTaints it goes to the entry armed
  // (tests/fixtures/outage-scope: every taint, by Exists with no key).
  CHECK(sent["spec"]["tolerations"] == json::array({{{"operator", "Exists"}}}));
  json patched = sent;
  patched["spec"]["containers"][0]["env"] = json::array({{{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "none"}}});
  json patched_void = sent;
  patched_void["spec"]["containers"][0]["env"][0]["value"] = "void";
  // A second entry after the one sent, as a JSON Patch that appends would leave it: the last one counts.
  json appended = sent;
  appended["spec"]["containers"][0]["env"].push_back({{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "void"}});
  json other_env = sent;
  other_env["spec"]["containers"][0]["env"] = json::array({{{"name", "TZ"}, {"value", "UTC"}}});
  // As the API server passes on the webhook's warnings (mode enforce: it replaced the value; mode audit: what
  // enforce would do), and the backstop's (at Warn until armed), which it adds when the webhook was not heard.
  const std::string replaced_warning =
      R"(299 - "container \"probe\": NVIDIA_VISIBLE_DEVICES set in the pod was replaced with \"none\"")";
  const std::string audit_warning = R"(299 - "audit: container \"probe\" would get NVIDIA_VISIBLE_DEVICES=none")";
  const std::string backstop_warning =
      R"(299 - "Validation failed for ValidatingAdmissionPolicy 'gpuguard-visible-devices' with binding )"
      R"('gpuguard-visible-devices': gpuguard: containers that request no GPU must set NVIDIA_VISIBLE_DEVICES=none )"
      R"((the gpuguard webhook adds it; was it unreachable?): probe")";
  const std::string strict_denial =
      R"(HTTP 400: admission webhook "visible-devices.gpuguard.io" denied the request: container "probe" sets )"
      R"(NVIDIA_VISIBLE_DEVICES itself, which policy mode strict does not allow)";
  const std::string other_warning = R"(299 - "image tag latest")";
  // This release's webhook naming itself to the probe pod (its --instance), and another release's.
  const std::string instance = "gpuguard-system/gpuguard-webhook";
  const std::string named = R"(299 - "arm probe answered by gpuguard webhook gpuguard-system/gpuguard-webhook")";
  const std::string other_release = R"(299 - "arm probe answered by gpuguard webhook team-a/gpuguard-webhook")";
  const std::string longer_name =
      R"(299 - "arm probe answered by gpuguard webhook gpuguard-system/gpuguard-webhook-2")";
  struct Row {
    const char* what;
    unsigned status;
    std::string body;
    std::vector<std::string> warnings;
    std::string error;
    bool reached;
    std::string why;
  };
  const Row rows[] = {
      {"replaced, and warned so (mode enforce)",
       201,
       patched.dump(),
       {replaced_warning},
       "",
       true,
       "came back with NVIDIA_VISIBLE_DEVICES=none and the webhook's warning"},
      {"replaced with void, and warned so", 201, patched_void.dump(), {replaced_warning}, "", true, "=void"},
      {"replaced by a merge by name, nothing said (a policy engine)",
       201,
       patched_void.dump(),
       {},
       "",
       false,
       "another mutating webhook or policy sets the variable in the probe namespace"},
      {"a later entry of the same name, nothing said", 201, appended.dump(), {}, "", false, "another mutating"},
      {"replaced, with another webhook's warning only",
       201,
       patched.dump(),
       {other_warning},
       "",
       false,
       "another mutating"},
      {"the warning, but the value as sent", 201, sent.dump(), {replaced_warning}, "", false, "as sent"},
      {"warned about (mode audit)", 201, sent.dump(), {audit_warning}, "", true, "policy mode audit"},
      {"refused for setting the variable (mode strict)", 400, "{}", {}, strict_denial, true, "policy mode strict"},
      {"as sent: the call failed, Ignore admitted it (or a mutator that sets the variable only where it is absent)",
       201,
       sent.dump(),
       {},
       "",
       false,
       "came back with NVIDIA_VISIBLE_DEVICES=all, as sent, and without the webhook's warning"},
      {"the variable removed",
       201,
       other_env.dump(),
       {},
       "",
       false,
       "came back without NVIDIA_VISIBLE_DEVICES, which it was sent with"},
      {"another webhook's warning", 201, sent.dump(), {other_warning}, "", false, "without"},
      {"the backstop's warning: the webhook was not heard",
       201,
       sent.dump(),
       {backstop_warning},
       "",
       false,
       "without the webhook's warning"},
      {"refused by another policy",
       403,
       "{}",
       {},
       "HTTP 403: pods \"x\" is forbidden: quota",
       false,
       "refused the probe pod: HTTP 403"},
      {"refused by another webhook",
       400,
       "{}",
       {},
       R"(HTTP 400: admission webhook "policy.example.com" denied the request: no latest tags)",
       false,
       "refused the probe pod"},
      // kubernetes/kubernetes#130887: an API server that stopped watching ConfigMaps as parameters may find none,
      // and a configuration error refuses whatever the binding's validationActions (Warn before arming too).
      {"refused by the backstop finding no parameter",
       422,
       "{}",
       {},
       "HTTP 422: pods \"x\" is forbidden: ValidatingAdmissionPolicy 'gpuguard-visible-devices' with binding "
       "'gpuguard-visible-devices' denied request: failed to configure binding: no params found for policy binding "
       "with `Deny` parameterNotFoundAction",
       false,
       "stopped watching ConfigMaps as parameters"},
      {"no answer", 0, "", {}, "cannot connect to https://10.0.0.1:443", false, "no answer from the API server"},
      {"not a pod", 201, "[]", {}, "", false, "not a pod with containers"},
      {"containers not a list", 201, R"({"spec":{"containers":{}}})", {}, "", false, "not a pod with containers"},
  };
  for (const Row& row : rows) {
    INFO(row.what);
    // Each answer as this release's webhook named itself in it (or as no webhook did, when none answered).
    std::vector<std::string> warnings = row.warnings;
    if (row.status != 0) warnings.push_back(named);
    const auto result = arming::probe_result(row.status, row.body, warnings, row.error, instance);
    CHECK(result.reached == row.reached);
    CHECK_THAT(result.why, Catch::Contains(row.why));
  }
  // The webhook's words, without this release's webhook naming itself: another release's webhook answered
  // (its name said, or one this name is the start of), or an older webhook that says no name.
  const Row unnamed[] = {
      {"replaced and warned so, by another release's webhook",
       201,
       patched.dump(),
       {replaced_warning, other_release},
       "",
       false,
       "another gpuguard webhook answered, not this release's"},
      {"replaced and warned so, by a webhook whose name this one begins",
       201,
       patched.dump(),
       {replaced_warning, longer_name},
       "",
       false,
       "another gpuguard webhook answered"},
      {"warned about (mode audit), no name said", 201, sent.dump(), {audit_warning}, "", false, "says none answered"},
      // Another warning whose text ends in this name (the API server escapes the quote before it), and the
      // name outside a Warning header's form: neither is the webhook's warning.
      {"the name at the end of another warning",
       201,
       patched.dump(),
       {replaced_warning, R"(299 - "see \"arm probe answered by gpuguard webhook gpuguard-system/gpuguard-webhook")"},
       "",
       false,
       "another gpuguard webhook answered"},
      {"the name, not as a Warning header",
       201,
       patched.dump(),
       {replaced_warning, "arm probe answered by gpuguard webhook gpuguard-system/gpuguard-webhook"},
       "",
       false,
       "another gpuguard webhook answered"},
      {"refused (mode strict) by another release's webhook",
       400,
       "{}",
       {other_release},
       strict_denial,
       false,
       "another gpuguard webhook answered"},
  };
  for (const Row& row : unnamed) {
    INFO(row.what);
    const auto result = arming::probe_result(row.status, row.body, row.warnings, row.error, instance);
    CHECK(result.reached == row.reached);
    CHECK_THAT(result.why, Catch::Contains(row.why));
  }
}

// The words the probe looks for are the admission core's: the probe pod reviewed by it in each mode, its
// answer turned into what the API server would send back (the patch applied, its warnings as Warning headers,
// a refusal as the API server words it), shows the webhook was called; the same pod not reviewed does not.
TEST_CASE("arming: the probe pod as the admission core answers it, in each policy mode, shows the webhook") {
  const std::string pod = arming::probe_pod_json("gpuguard-webhook-arm-probe-", "gpuguard:0.1.0");
  const json request = probe_review(json::parse(pod));
  for (const auto mode : {policy::Mode::enforce, policy::Mode::strict, policy::Mode::audit, policy::Mode::off}) {
    INFO("mode " << policy::mode_name(mode));
    policy::Policy policy;
    policy.mode = mode;
    const auto outcome = admission::review(request.dump(), policy, nullptr, "gpuguard-system/gpuguard-webhook");
    REQUIRE(outcome.ok);
    const json response = json::parse(outcome.body)["response"];
    std::vector<std::string> warnings;
    for (const auto& warning : response.value("warnings", json::array())) {
      warnings.push_back("299 - " + json(warning.get<std::string>()).dump());
    }
    // The mode-off warning is the probe pod's in mode off alone.
    const bool mode_off_said = std::any_of(warnings.begin(), warnings.end(), [](const std::string& warning) {
      return warning.find(admission::kArmProbeModeOffWarning) != std::string::npos;
    });
    CHECK(mode_off_said == (mode == policy::Mode::off));
    arming::ProbeResult result;
    if (!response["allowed"].get<bool>()) {
      result =
          arming::probe_result(400, "{}", warnings,
                               R"(HTTP 400: admission webhook "visible-devices.gpuguard.io" denied the request: )" +
                                   response["status"]["message"].get<std::string>(),
                               "gpuguard-system/gpuguard-webhook");
    } else {
      json answered = json::parse(pod);
      if (response.contains("patch")) {
        const auto patch = admission::base64_decode(response["patch"].get<std::string>());
        REQUIRE(patch);
        answered = answered.patch(json::parse(*patch));
      }
      result = arming::probe_result(201, answered.dump(), warnings, "", "gpuguard-system/gpuguard-webhook");
      // The same answer is not this release's webhook's to another release's hook.
      CHECK_FALSE(arming::probe_result(201, answered.dump(), warnings, "", "team-a/gpuguard-webhook").reached);
    }
    INFO(result.why);
    CHECK(result.reached);
  }
  CHECK_FALSE(arming::probe_result(201, pod, {}, "", "gpuguard-system/gpuguard-webhook").reached);
  // In mode off any other pod, the same pod without the annotation, gets no warning at all.
  json plain = json::parse(pod);
  plain["metadata"].erase("annotations");
  policy::Policy off;
  off.mode = policy::Mode::off;
  const auto outcome = admission::review(probe_review(plain).dump(), off, nullptr, "gpuguard-system/gpuguard-webhook");
  REQUIRE(outcome.ok);
  CHECK(json::parse(outcome.body)["response"].value("warnings", json::array()).empty());
}

TEST_CASE(
    "arming: the probe pod asks for no GPU, sets NVIDIA_VISIBLE_DEVICES=all as a CUDA image does, and meets Pod "
    "Security restricted") {
  const json pod =
      json::parse(arming::probe_pod_json("gpuguard-webhook-arm-probe-", "registry.example.com/gpuguard:0.1.0"));
  CHECK(pod["metadata"]["generateName"] == "gpuguard-webhook-arm-probe-");
  CHECK(pod["spec"]["containers"][0]["image"] == "registry.example.com/gpuguard:0.1.0");
  CHECK_FALSE(pod["metadata"].contains("name"));
  REQUIRE(pod["spec"]["containers"].size() == 1);
  const json& container = pod["spec"]["containers"][0];
  CHECK(container["env"] == json::array({{{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "all"}}}));
  CHECK_FALSE(container.contains("envFrom"));
  for (const char* kind : {"requests", "limits"}) {
    for (const auto& [resource, quantity] : container["resources"][kind].items()) {
      CHECK((resource == "cpu" || resource == "memory"));
    }
  }
  const json& security = container["securityContext"];
  CHECK(security["runAsNonRoot"] == true);
  CHECK(security["allowPrivilegeEscalation"] == false);
  CHECK(security["capabilities"]["drop"] == json::array({"ALL"}));
  CHECK(security["seccompProfile"]["type"] == "RuntimeDefault");
  CHECK(pod["spec"]["automountServiceAccountToken"] == false);
  CHECK_FALSE(pod["spec"].contains("hostNetwork"));
  CHECK_FALSE(pod["spec"].contains("volumes"));
}

// A replica given --replica says its pod's name after this release's; the hook hears it by that name, and
// only in this release's words.
TEST_CASE("arming: a replica that names its pod is heard by that name") {
  const std::string instance = "gpuguard-system/gpuguard-webhook";
  CHECK(arming::replica_identity(instance, "gpuguard-webhook-5d8f9c7b6-x2x9q") ==
        "gpuguard-system/gpuguard-webhook replica gpuguard-webhook-5d8f9c7b6-x2x9q");
  const json sent = json::parse(arming::probe_pod_json("gpuguard-webhook-arm-probe-", "gpuguard:0.1.0"));
  const std::string audit_warning = R"(299 - "audit: container \"probe\" would get NVIDIA_VISIBLE_DEVICES=none")";
  const auto said = [](const std::string& text) { return "299 - " + json(text).dump(); };
  struct Row {
    const char* what;
    std::string warning;
    bool reached;
    std::string replica;
  };
  const Row rows[] = {
      {"a replica named", said("arm probe answered by gpuguard webhook " + instance + " replica gpuguard-webhook-a1"),
       true, "gpuguard-webhook-a1"},
      {"no replica named (an older webhook, or no --replica)",
       said("arm probe answered by gpuguard webhook " + instance), true, ""},
      {"another release's replica", said("arm probe answered by gpuguard webhook team-a/gpuguard-webhook replica a1"),
       false, ""},
      {"an empty replica name", said("arm probe answered by gpuguard webhook " + instance + " replica "), false, ""},
      {"a replica name no pod has", said("arm probe answered by gpuguard webhook " + instance + " replica Not_A_Pod"),
       false, ""},
      {"a second word after the name",
       said("arm probe answered by gpuguard webhook " + instance + " replica gpuguard-webhook-a1 extra"), false, ""},
  };
  for (const Row& row : rows) {
    INFO(row.what);
    const auto result = arming::probe_result(201, sent.dump(), {audit_warning, row.warning}, "", instance);
    CHECK(result.reached == row.reached);
    CHECK(result.replica == row.replica);
  }
  // The admission core says it so, and marks the answer as the probe's (the server then closes the connection).
  const json request = probe_review(sent);
  policy::Policy policy;
  policy.mode = policy::Mode::audit;
  const auto outcome =
      admission::review(request.dump(), policy, nullptr, arming::replica_identity(instance, "gpuguard-webhook-b2"));
  REQUIRE(outcome.ok);
  CHECK(outcome.arm_probe);
  std::vector<std::string> warnings;
  const json response = json::parse(outcome.body)["response"];
  for (const auto& warning : response["warnings"]) {
    warnings.push_back(said(warning.get<std::string>()));
  }
  const auto heard = arming::probe_result(201, sent.dump(), warnings, "", instance);
  INFO(heard.why);
  CHECK(heard.replica == "gpuguard-webhook-b2");
  json plain = request;
  plain["request"]["object"]["metadata"].erase("annotations");
  CHECK_FALSE(admission::review(plain.dump(), policy, nullptr, instance).arm_probe);
}

// The replicas the probe must hear: the ready endpoints of the webhook's Service, by pod, over a list in
// the shape the API server serves (tests/fixtures/arming/endpointslices.json: dual-stack, a terminating pod,
// one starting, one without conditions, one without a pod).
TEST_CASE("arming: the replicas to hear are the ready endpoints of the webhook's Service") {
  const std::string list = test::read_file(test::fixtures_dir() / "arming" / "endpointslices.json");
  const arming::ReadyReplicas ready = arming::ready_replicas(list);
  CHECK(ready.error.empty());
  CHECK(ready.names == std::vector<std::string>{"address 10.0.5.5", "gpuguard-webhook-5d8f9c7b6-nocnd",
                                                "gpuguard-webhook-5d8f9c7b6-x2x9q"});
  struct Row {
    const char* what;
    std::string json;
    std::vector<std::string> names;
    bool error;
  };
  const Row rows[] = {
      {"no slices", R"({"items":[]})", {}, false},
      {"not a list", R"({"kind":"EndpointSliceList"})", {}, true},
      {"not JSON", "{", {}, true},
      {"items not an array", R"({"items":{}})", {}, true},
      {"a slice and endpoints of the wrong types", R"({"items":[3,{"endpoints":{}},{"endpoints":[7]}]})", {}, false},
      {"conditions and a target of the wrong types",
       R"({"items":[{"endpoints":[{"addresses":["10.1.1.2"],"conditions":[],"targetRef":[]},)"
       R"({"addresses":[5],"conditions":{"ready":"no"},"targetRef":{"kind":"Pod","name":7}}]}]})",
       {"address 10.1.1.2", "address unknown"},
       false},
      {"a target that is not a pod",
       R"({"items":[{"endpoints":[{"addresses":["10.1.1.1"],"targetRef":{"kind":"Node","name":"n1"}}]}]})",
       {"address 10.1.1.1"},
       false},
      {"no address at all", R"({"items":[{"endpoints":[{"conditions":{"ready":true}}]}]})", {"address unknown"}, false},
  };
  for (const Row& row : rows) {
    INFO(row.what);
    const arming::ReadyReplicas found = arming::ready_replicas(row.json);
    CHECK(found.names == row.names);
    CHECK(found.error.empty() != row.error);
  }
}

TEST_CASE("arming: the API servers to probe are the ready endpoints of the kubernetes Service, at its https port") {
  const std::string slice = test::read_file(test::fixtures_dir() / "arming" / "kubernetes-endpointslice.json");
  const arming::ApiServers found = arming::api_servers(slice, "10.96.0.1");
  CHECK(found.error.empty());
  CHECK(found.addresses ==
        std::vector<arming::ApiServerAddress>{{"10.0.0.11", "6443"}, {"10.0.0.12", "6443"}, {"10.0.0.14", "6443"}});
  // Checked as a name, either family; as an IPv6 address, only an IPv6 slice.
  CHECK(arming::api_servers(slice, "kubernetes.default.svc").addresses.size() == 3);
  CHECK_THAT(arming::api_servers(slice, "fd00::1").error, Catch::Contains("another address family than fd00::1"));
  struct Row {
    const char* what;
    std::string json;
    std::vector<arming::ApiServerAddress> addresses;
    bool error;
  };
  const std::string v4 = R"("addressType":"IPv4",)";
  std::string many = "{" + v4 + R"("ports":[{"port":443}],"endpoints":[)";
  for (int i = 0; i <= static_cast<int>(arming::kMostApiServers); ++i) {
    many += (i ? "," : "") + std::string(R"({"addresses":["10.9.0.)") + std::to_string(i) + R"("]})";
  }
  many += "]}";
  const Row rows[] = {
      {"no endpoints", "{" + v4 + R"("endpoints":null})", {}, false},
      {"not an object", "[]", {}, true},
      {"not JSON", "{", {}, true},
      {"no address type", R"({"ports":[{"port":443}],"endpoints":[{"addresses":["10.1.1.1"]}]})", {}, true},
      {"FQDN endpoints",
       R"({"addressType":"FQDN","ports":[{"port":443}],"endpoints":[{"addresses":["a.example"]}]})",
       {},
       true},
      {"the only port, unnamed",
       "{" + v4 + R"("ports":[{"port":443}],"endpoints":[{"addresses":["10.1.1.1"]}]})",
       {{"10.1.1.1", "443"}},
       false},
      {"the https port among others",
       "{" + v4 + R"("ports":[{"name":"metrics","port":9000},{"name":"https","port":8443}],)" +
           R"("endpoints":[{"addresses":["10.1.1.1"]}]})",
       {{"10.1.1.1", "8443"}},
       false},
      {"no https port among several",
       "{" + v4 + R"("ports":[{"name":"a","port":1},{"name":"b","port":2}],"endpoints":[{"addresses":["10.1.1.1"]}]})",
       {},
       true},
      {"a port out of range",
       "{" + v4 + R"("ports":[{"port":70000}],"endpoints":[{"addresses":["10.1.1.1"]}]})",
       {},
       true},
      {"a ready endpoint without an address",
       "{" + v4 + R"("ports":[{"port":443}],"endpoints":[{"addresses":[]}]})",
       {},
       true},
      {"an address that is not a string",
       "{" + v4 + R"("ports":[{"port":443}],"endpoints":[{"addresses":[5]}]})",
       {},
       true},
      {"the same server twice, once",
       "{" + v4 + R"("ports":[{"port":443}],"endpoints":[{"addresses":["10.1.1.1"]},{"addresses":["10.1.1.1"]}]})",
       {{"10.1.1.1", "443"}},
       false},
      {"more API servers than a control plane runs", many, {}, true},
  };
  for (const Row& row : rows) {
    INFO(row.what);
    const arming::ApiServers got = arming::api_servers(row.json, "10.96.0.1");
    CHECK(got.addresses == row.addresses);
    CHECK(got.error.empty() != row.error);
  }
}

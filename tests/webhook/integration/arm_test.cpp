// The real `gpuguard-webhook arm` against the fake API server over real TLS: it waits for a replica of the
// webhook and, with --probe-namespace, for a dry-run pod to come back as the webhook answers (with --service,
// from each ready replica of its Service), arms the
// webhook configuration and the backstop's binding with JSON Patches, and when either does not come,
// leaves both as they were, says so, and records a Warning Event. And `await-rollout`, the uninstall's hook,
// waiting for the node cleanup's DaemonSet.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "eventually.hpp"
#include "fake_apiserver.hpp"
#include "server_process.hpp"

using namespace gpuguard::test;
using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr const char* kDeployment = "/apis/apps/v1/namespaces/gpuguard-system/deployments/gpuguard-webhook";
constexpr const char* kDeploymentUid = "6b1f2a7e-0c3d-4e5f-8a9b-1c2d3e4f5a6b";
constexpr const char* kConfiguration = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpuguard";
constexpr const char* kBinding =
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/gpuguard-visible-devices";
constexpr const char* kProbe = "/api/v1/namespaces/default/pods";
constexpr const char* kEvents = "/api/v1/namespaces/gpuguard-system/events";
constexpr const char* kEndpoints = "/apis/discovery.k8s.io/v1/namespaces/gpuguard-system/endpointslices";

// The webhook Service's endpoints: each pod named, ready or not.
json endpoint_slices(const std::vector<std::pair<std::string, bool>>& pods) {
  json endpoints = json::array();
  for (const auto& [name, ready] : pods) {
    endpoints.push_back({{"addresses", json::array({"10.244.0." + std::to_string(endpoints.size() + 2)})},
                         {"conditions", {{"ready", ready}}},
                         {"targetRef", {{"kind", "Pod"}, {"namespace", "gpuguard-system"}, {"name", name}}}});
  }
  return {{"kind", "EndpointSliceList"}, {"items", json::array({{{"endpoints", endpoints}}})}};
}

// `updated`: replicas of the current template (a rollout under way has fewer than 3).
json deployment(int available, int updated = 3) {
  return {
      {"apiVersion", "apps/v1"},
      {"kind", "Deployment"},
      {"metadata",
       {{"name", "gpuguard-webhook"}, {"namespace", "gpuguard-system"}, {"uid", kDeploymentUid}, {"generation", 2}}},
      {"spec", {{"replicas", 3}}},
      {"status",
       {{"replicas", 3}, {"availableReplicas", available}, {"updatedReplicas", updated}, {"observedGeneration", 2}}}};
}

// The probe pod as a gpuguard webhook that names itself `instance` answers it in policy mode enforce.
FakeApiserver::PostAnswer patched_by(const json& pod, const std::string& instance) {
  FakeApiserver::PostAnswer answer{201, pod, {}};
  answer.body["spec"]["containers"][0]["env"][0]["value"] = "none";
  answer.warnings = {R"(container \"probe\": NVIDIA_VISIBLE_DEVICES set in the pod was replaced with \"none\")",
                     "arm probe answered by gpuguard webhook " + instance};
  return answer;
}

struct Install {
  FakeApiserver apiserver{"arm-token"};
  fs::path dir = fs::temp_directory_path() / ("gpuguard-arm-" + std::to_string(getpid()));
  Install() {
    fs::create_directories(dir);
    std::ofstream(dir / "token") << "arm-token";
    apiserver.put_at(kDeployment, deployment(0));
    apiserver.put_at(
        kConfiguration,
        {{"kind", "MutatingWebhookConfiguration"},
         {"metadata", {{"name", "gpuguard"}}},
         {"webhooks", json::array({{{"name", "visible-devices.gpuguard.io"}, {"failurePolicy", "Ignore"}}})}});
    apiserver.put_at(kBinding, {{"kind", "ValidatingAdmissionPolicyBinding"},
                                {"metadata", {{"name", "gpuguard-visible-devices"}}},
                                {"spec", {{"validationActions", json::array({"Warn", "Audit"})}}}});
  }
  ~Install() { fs::remove_all(dir); }
  std::string args(unsigned timeout) const {
    return common_args(timeout) + " --webhook-configuration gpuguard --backstop-binding gpuguard-visible-devices";
  }
  // As the chart runs it on an upgrade of a release armed already.
  std::string verify_args(unsigned timeout) const {
    return common_args(timeout) + " --probe-namespace default --verify-only";
  }
  std::string common_args(unsigned timeout) const {
    return "arm --apiserver-url " + apiserver.url() + " --token-file " + (dir / "token").string() + " --ca-file " +
           certs_dir() + "/ca.crt --namespace gpuguard-system --deployment gpuguard-webhook --timeout " +
           std::to_string(timeout);
  }
  // Every probe pod comes back as this release's webhook answers it, counted in `probes`.
  void answer_as_this_release(std::atomic<int>& probes) {
    apiserver.answer_posts(kProbe, [&probes](const json& pod) {
      ++probes;
      return patched_by(pod, "gpuguard-system/gpuguard-webhook");
    });
  }
  // Both objects as the hook leaves them armed.
  void arm() {
    json configuration = apiserver.at(kConfiguration);
    configuration["webhooks"][0]["failurePolicy"] = "Fail";
    apiserver.put_at(kConfiguration, configuration);
    json binding = apiserver.at(kBinding);
    binding["spec"]["validationActions"] = json::array({"Deny"});
    apiserver.put_at(kBinding, binding);
  }
  std::size_t patches() const { return count("PATCH", ""); }
  // What a hook that armed nothing leaves: exit 1, nothing patched, the webhook configuration at Ignore and
  // the backstop at Warn, and the one Event it recorded (returned).
  json check_left_unarmed(const ExitResult& result) const {
    CHECK(result.status == 1);
    CHECK(patches() == 0);
    CHECK(apiserver.at(kConfiguration)["webhooks"][0]["failurePolicy"] == "Ignore");
    CHECK(apiserver.at(kBinding)["spec"]["validationActions"] == json::array({"Warn", "Audit"}));
    const auto events = apiserver.posts(kEvents);
    REQUIRE(events.size() == 1);
    // On the Deployment by its UID too, so that `kubectl describe deployment` shows it.
    CHECK(events.at(0)["involvedObject"]["uid"] == kDeploymentUid);
    return events.at(0);
  }
  // The requests of a method, to a path when one is given.
  std::size_t count(const std::string& method, const std::string& path) const {
    std::size_t n = 0;
    for (const auto& request : apiserver.requests()) {
      n += request.method == method && (path.empty() || request.path == path) ? 1 : 0;
    }
    return n;
  }
};

}  // namespace

TEST_CASE("arm: once a replica is available, the webhook configuration fails closed and the backstop denies") {
  Install install;
  auto arm = std::async(std::launch::async, [&] { return run_webhook(install.args(30)); });
  // Two looks at the Deployment (one every 2 s) that found no replica: nothing armed, nothing refuses pods.
  REQUIRE(eventually([&] { return install.count("GET", kDeployment) >= 2; }));
  CHECK(install.patches() == 0);
  CHECK(install.apiserver.at(kConfiguration)["webhooks"][0]["failurePolicy"] == "Ignore");
  install.apiserver.put_at(kDeployment, deployment(1));
  const ExitResult result = arm.get();
  INFO(result.output);
  CHECK(result.status == 0);
  CHECK(install.apiserver.at(kConfiguration)["webhooks"][0]["failurePolicy"] == "Fail");
  CHECK(install.apiserver.at(kBinding)["spec"]["validationActions"] == json::array({"Deny"}));
  CHECK_THAT(result.output, Catch::Contains("0 of 3 replicas available") && Catch::Contains("\"msg\":\"armed\""));
  for (const auto& request : install.apiserver.requests()) {
    CHECK(request.authorization == "Bearer arm-token");
    if (request.method == "PATCH") CHECK(request.content_type == "application/json-patch+json");
  }
  CHECK(install.patches() == 2);
  // Run again (a later helm upgrade): armed already, nothing sent.
  CHECK(run_webhook(install.args(5)).status == 0);
  CHECK(install.patches() == 2);
}

TEST_CASE("arm: no replica within the timeout leaves everything admitting, and exits 1 saying why") {
  Install install;
  install.apiserver.collect_posts(kEvents);
  const auto started = std::chrono::steady_clock::now();
  const ExitResult result = run_webhook(install.args(3));
  INFO(result.output);
  const json event = install.check_left_unarmed(result);
  CHECK(std::chrono::steady_clock::now() - started < 10s);
  CHECK_THAT(result.output, Catch::Contains("nothing was armed, so nothing refuses pods for it"));
  CHECK_THAT(event["message"].get<std::string>(), Catch::Contains("no replica of the webhook became available"));
}

TEST_CASE("arm: with --probe-namespace, armed only once a dry-run pod comes back patched or warned about") {
  for (const bool by_warning : {false, true}) {
    INFO((by_warning ? "warned about (policy mode audit)" : "patched"));
    Install install;
    install.apiserver.put_at(kDeployment, deployment(3));
    std::atomic<int> probes{0};
    // The first two come back as sent: the API server did not reach the webhook, and Ignore admitted them.
    install.apiserver.answer_posts(kProbe, [&](const json& pod) {
      FakeApiserver::PostAnswer answer{201, pod, {}};
      if (++probes <= 2) return answer;
      if (by_warning) {
        answer.warnings = {R"(audit: container \"probe\" would get NVIDIA_VISIBLE_DEVICES=none)"};
      } else {
        answer.body["spec"]["containers"][0]["env"][0]["value"] = "none";
        answer.warnings = {R"(container \"probe\": NVIDIA_VISIBLE_DEVICES set in the pod was replaced with \"none\")"};
      }
      // This release's webhook naming itself (--namespace/--deployment), as its --instance has it say.
      answer.warnings.emplace_back("arm probe answered by gpuguard webhook gpuguard-system/gpuguard-webhook");
      return answer;
    });
    const ExitResult result = run_webhook(install.args(30) + " --probe-namespace default");
    INFO(result.output);
    CHECK(result.status == 0);
    CHECK(probes == 2 + 10);  // ten answers in a row arm
    CHECK_THAT(result.output,
               Catch::Contains("NVIDIA_VISIBLE_DEVICES=all, as sent, and without the webhook's warning") &&
                   Catch::Contains("the API server calls the webhook"));
    CHECK(install.apiserver.at(kConfiguration)["webhooks"][0]["failurePolicy"] == "Fail");
    CHECK(install.apiserver.at(kBinding)["spec"]["validationActions"] == json::array({"Deny"}));
    for (const auto& request : install.apiserver.requests()) {
      if (request.path == kProbe) CHECK(request.query == "dryRun=All");
    }
    const json sent = install.apiserver.posts(kProbe).at(0);
    CHECK(sent["metadata"]["generateName"] == "gpuguard-webhook-arm-probe-");
    CHECK(sent["spec"]["containers"][0]["image"] == "gpuguard-arm-probe");  // --probe-image's default
    CHECK(sent["spec"]["containers"][0]["env"] ==
          json::array({{{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "all"}}}));
    CHECK(sent["metadata"]["annotations"] == json({{"gpuguard.io/arm-probe", "true"}}));
  }
}

TEST_CASE(
    "arm: a webhook that answered dry-run pods, then not one, as behind an API server that cannot reach it, is not "
    "armed") {
  Install install;
  install.apiserver.put_at(kDeployment, deployment(3));
  std::atomic<int> probes{0};
  install.apiserver.answer_posts(kProbe, [&](const json& pod) {
    if (++probes % 5 == 0) return FakeApiserver::PostAnswer{201, pod, {}};  // as sent: Ignore admitted it unreviewed
    return patched_by(pod, "gpuguard-system/gpuguard-webhook");
  });
  install.apiserver.collect_posts(kEvents);
  // The timeout is long: four answers in five never make ten in a row, but a hook that retried after the miss
  // would spend all of it.
  const ExitResult result = run_webhook(install.args(60) + " --probe-namespace default");
  INFO(result.output);
  const json event = install.check_left_unarmed(result);
  CHECK(probes == 5);  // stopped at the first miss after an answer
  CHECK_THAT(result.output,
             Catch::Contains("the webhook answered 4 dry-run pod(s) in namespace default in a row, then not the next: "
                             "the probe pod came back with NVIDIA_VISIBLE_DEVICES=all, as sent") &&
                 Catch::Contains("some of the API server's calls may not reach it"));
  CHECK_THAT(event["message"].get<std::string>(), Catch::Contains("the webhook answered 4 dry-run pod(s)"));
}

// The API server keeps its connection to one replica, and the webhook closes it after a probe pod, so the
// replicas answer by turns; here the second ready one answers only from the 13th probe on.
TEST_CASE("arm: with --service, armed only once every ready replica of the webhook has answered") {
  Install install;
  // A rollout under way: the older version's replicas name no pod, so the probe waits until it is done.
  install.apiserver.put_at(kDeployment, deployment(3, 1));
  install.apiserver.put_at(
      kEndpoints,
      endpoint_slices({{"gpuguard-webhook-a", true}, {"gpuguard-webhook-b", true}, {"gpuguard-webhook-old", false}}));
  std::atomic<int> probes{0};
  install.apiserver.answer_posts(kProbe, [&probes](const json& pod) {
    const char* replica = ++probes <= 12 ? "gpuguard-webhook-a" : "gpuguard-webhook-b";
    return patched_by(pod, std::string("gpuguard-system/gpuguard-webhook replica ") + replica);
  });
  auto arm = std::async(std::launch::async, [&] {
    return run_webhook(install.args(30) + " --probe-namespace default --service gpuguard-webhook");
  });
  REQUIRE(eventually([&] { return install.count("GET", kDeployment) >= 2; }));
  CHECK(probes == 0);
  install.apiserver.put_at(kDeployment, deployment(3, 3));
  const ExitResult result = arm.get();
  INFO(result.output);
  CHECK(result.status == 0);
  CHECK_THAT(result.output, Catch::Contains("a rollout is under way: 1 of 3 replicas run the current template"));
  CHECK(probes == 13);
  CHECK_THAT(result.output,
             Catch::Contains("ready replicas of Service gpuguard-webhook not heard from yet: gpuguard-webhook-b") &&
                 Catch::Contains("\"replicas_heard\":2"));
  CHECK(install.apiserver.at(kConfiguration)["webhooks"][0]["failurePolicy"] == "Fail");
  for (const auto& request : install.apiserver.requests()) {
    if (request.path == kEndpoints)
      CHECK(request.query == "labelSelector=kubernetes.io%2Fservice-name%3Dgpuguard-webhook");
  }
  CHECK(install.count("GET", kEndpoints) == 4);  // after the 10th, 11th, 12th and 13th answers
}

TEST_CASE("arm: a ready replica of the webhook that never answers leaves it unarmed, naming the replica") {
  Install install;
  install.apiserver.put_at(kDeployment, deployment(2));
  install.apiserver.put_at(kEndpoints, endpoint_slices({{"gpuguard-webhook-a", true}, {"gpuguard-webhook-b", true}}));
  install.apiserver.answer_posts(kProbe, [](const json& pod) {
    return patched_by(pod, "gpuguard-system/gpuguard-webhook replica gpuguard-webhook-a");
  });
  install.apiserver.collect_posts(kEvents);
  const ExitResult result = run_webhook(install.args(5) + " --probe-namespace default --service gpuguard-webhook");
  INFO(result.output);
  const json event = install.check_left_unarmed(result);
  const std::string said = "with ready replicas of Service gpuguard-webhook not heard from yet: gpuguard-webhook-b";
  CHECK_THAT(result.output, Catch::Contains(said) && Catch::Contains("may not reach those replicas"));
  CHECK_THAT(event["message"].get<std::string>(), Catch::Contains(said));
  // Endpoints the API server will not list (here: none at that path, 404) stop it at once, saying so.
  Install unlisted;
  unlisted.apiserver.put_at(kDeployment, deployment(3));
  unlisted.apiserver.answer_posts(kProbe, [](const json& pod) {
    return patched_by(pod, "gpuguard-system/gpuguard-webhook replica gpuguard-webhook-a");
  });
  unlisted.apiserver.collect_posts(kEvents);
  const ExitResult refused = run_webhook(unlisted.args(60) + " --probe-namespace default --service gpuguard-webhook");
  INFO(refused.output);
  unlisted.check_left_unarmed(refused);
  CHECK(unlisted.apiserver.posts(kProbe).size() == 10);
  CHECK_THAT(refused.output, Catch::Contains("cannot list the endpoints of Service gpuguard-webhook: 404") &&
                                 Catch::Contains("list EndpointSlices"));
}

TEST_CASE("arm: a timeout before the webhook has answered ten dry-run pods in a row leaves it unarmed, saying so") {
  Install install;
  install.apiserver.put_at(kDeployment, deployment(3));
  std::atomic<int> probes{0};
  install.answer_as_this_release(probes);
  install.apiserver.collect_posts(kEvents);
  // Ten answers, 0.3 s apart, take 2.7 s at the least: more than a 1 s timeout leaves.
  const ExitResult result = run_webhook(install.args(1) + " --probe-namespace default");
  INFO(result.output);
  const json event = install.check_left_unarmed(result);
  CHECK(probes >= 1);
  CHECK(probes < 10);
  const std::string said =
      "the timeout came after " + std::to_string(probes.load()) + " of the 10 answers in a row the webhook must give";
  CHECK_THAT(result.output, Catch::Contains(said) && Catch::Contains("webhook.armTimeoutSeconds"));
  CHECK_THAT(event["message"].get<std::string>(), Catch::Contains(said));
}

TEST_CASE("arm: a dry-run pod patched by another gpuguard release's webhook does not arm this one") {
  Install install;
  install.apiserver.put_at(kDeployment, deployment(3));
  // Another release's webhook answers in the probe namespace, while this release's is not reached.
  install.apiserver.answer_posts(kProbe, [](const json& pod) { return patched_by(pod, "team-a/gpuguard-webhook"); });
  install.apiserver.collect_posts(kEvents);
  const ExitResult result = run_webhook(install.args(3) + " --probe-namespace default");
  INFO(result.output);
  install.check_left_unarmed(result);
  CHECK_THAT(result.output, Catch::Contains("another gpuguard webhook answered, not this release's"));
}

TEST_CASE("arm: a dry-run pod that never comes back patched leaves everything admitting, exits 1, and records why") {
  Install install;
  install.apiserver.put_at(kDeployment, deployment(3));
  // Answered as sent, every time, with the backstop's warning (at Warn until armed) about the missing variable.
  install.apiserver.answer_posts(kProbe, [](const json& pod) {
    return FakeApiserver::PostAnswer{201,
                                     pod,
                                     {"Validation failed for ValidatingAdmissionPolicy 'gpuguard-visible-devices' "
                                      "with binding 'gpuguard-visible-devices': gpuguard: containers that request no "
                                      "GPU must set NVIDIA_VISIBLE_DEVICES=none: probe"}};
  });
  install.apiserver.collect_posts(kEvents);
  const ExitResult result = run_webhook(install.args(3) + " --probe-namespace default");
  INFO(result.output);
  const json event = install.check_left_unarmed(result);
  CHECK(install.apiserver.posts(kProbe).size() >= 1);
  CHECK_THAT(result.output, Catch::Contains("the API server was not shown to call the webhook: nothing was armed"));
  CHECK(event["type"] == "Warning");
  CHECK(event["reason"] == "NotArmed");
  CHECK(event["involvedObject"] == json({{"apiVersion", "apps/v1"},
                                         {"kind", "Deployment"},
                                         {"namespace", "gpuguard-system"},
                                         {"name", "gpuguard-webhook"},
                                         {"uid", kDeploymentUid}}));
  CHECK_THAT(event["message"].get<std::string>(), Catch::Contains("nothing refuses pods for it") &&
                                                      Catch::Contains("did not come back as the webhook answers"));
}

TEST_CASE("arm --verify-only: an armed release whose webhook answers the probe is left as it is, and exits 0") {
  Install install;
  install.arm();
  install.apiserver.put_at(kDeployment, deployment(3));
  std::atomic<int> probes{0};
  install.answer_as_this_release(probes);
  install.apiserver.collect_posts(kEvents);
  const ExitResult result = run_webhook(install.verify_args(30));
  INFO(result.output);
  CHECK(result.status == 0);
  CHECK(probes == 10);
  CHECK_THAT(result.output,
             Catch::Contains("the API server calls the webhook") &&
                 Catch::Contains("armed already, and the API server calls the webhook: nothing changed"));
  // It reads the Deployment and sends dry-run pods, nothing else: it has no right to more (the chart grants it
  // none once armed).
  CHECK(install.patches() == 0);
  CHECK(install.count("GET", kConfiguration) + install.count("GET", kBinding) == 0);
  CHECK(install.apiserver.posts(kEvents).empty());
  CHECK(install.apiserver.at(kConfiguration)["webhooks"][0]["failurePolicy"] == "Fail");
}

TEST_CASE(
    "arm --verify-only: an armed release whose webhook the API server no longer reaches fails the upgrade, "
    "saying so, and stays armed") {
  // What the API server answers the probe pod with, and what the Event then says.
  struct Case {
    const char* what;
    int available;
    unsigned status;  // of the answer to the probe pod
    const char* why;
  };
  for (const Case& c : {Case{"a replica; failurePolicy Fail and the call fails: refused", 3, 500,
                             "the API server refused the probe pod: HTTP 500"},
                        Case{"a replica; the backstop alone armed and the call fails: admitted as sent", 3, 201,
                             "did not come back as the webhook answers"},
                        Case{"no replica", 0, 201, "no replica of the webhook became available"}}) {
    INFO(c.what);
    Install install;
    install.arm();
    install.apiserver.put_at(kDeployment, deployment(c.available));
    install.apiserver.answer_posts(kProbe, [&c](const json& pod) {
      if (c.status == 201) return FakeApiserver::PostAnswer{201, pod, {}};
      return FakeApiserver::PostAnswer{
          c.status,
          {{"kind", "Status"},
           {"status", "Failure"},
           {"message",
            "Internal error occurred: failed calling webhook \"visible-devices.gpuguard.io\": failed to call "
            "webhook: connect: connection refused"},
           {"code", c.status}},
          {}};
    });
    install.apiserver.collect_posts(kEvents);
    const ExitResult result = run_webhook(install.verify_args(3));
    INFO(result.output);
    CHECK(result.status == 1);
    CHECK(install.patches() == 0);
    CHECK(install.apiserver.at(kConfiguration)["webhooks"][0]["failurePolicy"] == "Fail");
    CHECK(install.apiserver.at(kBinding)["spec"]["validationActions"] == json::array({"Deny"}));
    CHECK_THAT(result.output,
               Catch::Contains("it was armed already and is left so: until the API server reaches the webhook, the "
                               "pods it should review are refused") &&
                   !Catch::Contains("nothing was armed"));
    const auto events = install.apiserver.posts(kEvents);
    REQUIRE(events.size() == 1);
    CHECK(events.at(0)["type"] == "Warning");
    CHECK(events.at(0)["reason"] == "NotReached");
    CHECK(events.at(0)["involvedObject"]["name"] == "gpuguard-webhook");
    CHECK(events.at(0)["involvedObject"]["uid"] == kDeploymentUid);
    CHECK_THAT(events.at(0)["message"].get<std::string>(),
               Catch::Contains("gpuguard is armed, but the API server was not shown to call its webhook") &&
                   Catch::Contains(c.why));
  }
}

namespace {

constexpr const char* kApiServers = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes";

// The EndpointSlice the API servers write for the kubernetes Service: these addresses, at `port` (the API
// servers of a control plane share theirs).
json api_server_slice(const std::vector<std::string>& addresses, unsigned short port,
                      const std::string& family = "IPv4") {
  json endpoints = json::array();
  for (const std::string& address : addresses) {
    endpoints.push_back({{"addresses", json::array({address})}, {"conditions", {{"ready", true}}}});
  }
  return {{"kind", "EndpointSlice"},
          {"metadata", {{"name", "kubernetes"}, {"namespace", "default"}}},
          {"addressType", family},
          {"endpoints", endpoints},
          {"ports", json::array({{{"name", "https"}, {"port", port}, {"protocol", "TCP"}}})}};
}

// Certificates from another CA (certs/generate.sh --new-ca), for a server the hook must not trust.
struct ForeignCerts {
  fs::path dir = fs::temp_directory_path() / ("gpuguard-arm-foreign-" + std::to_string(getpid()));
  ForeignCerts() {
    const std::string command =
        std::string(GPUGUARD_SOURCE_DIR) + "/certs/generate.sh --new-ca --out " + dir.string() + " > /dev/null";
    REQUIRE(std::system(command.c_str()) == 0);
  }
  ~ForeignCerts() { fs::remove_all(dir); }
};

}  // namespace

TEST_CASE("arm: with --each-apiserver, armed only once each API server has passed dry-run pods to the webhook") {
  Install install;
  install.apiserver.put_at(kDeployment, deployment(3));
  // At 127.0.0.2, with the test certificate, which names 127.0.0.1 and not 127.0.0.2: trusted only when checked
  // as the API's host (--apiserver-url's, 127.0.0.1), not as the address dialled.
  FakeApiserver other("arm-token", "127.0.0.2", "", install.apiserver.port());
  std::atomic<int> probes{0}, other_probes{0};
  install.answer_as_this_release(probes);
  other.answer_posts(kProbe, [&other_probes](const json& pod) {
    ++other_probes;
    return patched_by(pod, "gpuguard-system/gpuguard-webhook");
  });
  install.apiserver.put_at(kApiServers, api_server_slice({"127.0.0.2", "127.0.0.1"}, install.apiserver.port()));
  const ExitResult result = run_webhook(install.args(30) + " --probe-namespace default --each-apiserver");
  INFO(result.output);
  CHECK(result.status == 0);
  CHECK(install.patches() == 2);
  // Ten answers in a row, in turn: five through each, each at its own address.
  CHECK(probes == 5);
  CHECK(other_probes == 5);
  CHECK_THAT(result.output, Catch::Contains("probing through each API server") &&
                                Catch::Contains(install.apiserver.url()) && Catch::Contains(other.url()));
  // Armed, an upgrade's --verify-only probes through each as well, and arms nothing.
  const ExitResult verified = run_webhook(install.verify_args(30) + " --each-apiserver");
  INFO(verified.output);
  CHECK(verified.status == 0);
  CHECK(install.patches() == 2);
  CHECK(probes == 10);
  CHECK(other_probes == 10);
}

TEST_CASE(
    "arm: with --each-apiserver, an API server that does not pass the probe to the webhook leaves it unarmed, "
    "naming it") {
  Install install;
  install.apiserver.put_at(kDeployment, deployment(3));
  install.apiserver.collect_posts(kEvents);
  FakeApiserver other("arm-token", "127.0.0.2", "", install.apiserver.port());
  std::atomic<int> probes{0};
  install.answer_as_this_release(probes);
  // As an API server that cannot reach the webhook under failurePolicy Ignore: the pod back as sent.
  other.answer_posts(kProbe, [](const json& pod) { return FakeApiserver::PostAnswer{201, pod, {}}; });
  install.apiserver.put_at(kApiServers, api_server_slice({"127.0.0.1", "127.0.0.2"}, install.apiserver.port()));
  const ExitResult result = run_webhook(install.args(30) + " --probe-namespace default --each-apiserver");
  INFO(result.output);
  const json event = install.check_left_unarmed(result);
  CHECK(probes == 1);
  CHECK_THAT(result.output,
             Catch::Contains("then not the next") && Catch::Contains("(through API server " + other.url() + ")"));
  CHECK_THAT(event["message"].get<std::string>(), Catch::Contains("through API server " + other.url()));
}

TEST_CASE("arm: with --each-apiserver, an address whose certificate is not the API's gets no token and no probe") {
  Install install;
  install.apiserver.put_at(kDeployment, deployment(3));
  install.apiserver.collect_posts(kEvents);
  const ForeignCerts foreign;
  // A server the slice names whose certificate another CA signed: the handshake fails, before any request.
  FakeApiserver other("arm-token", "127.0.0.2", foreign.dir.string(), install.apiserver.port());
  std::atomic<int> probes{0};
  install.answer_as_this_release(probes);
  install.apiserver.put_at(kApiServers, api_server_slice({"127.0.0.1", "127.0.0.2"}, install.apiserver.port()));
  const ExitResult result = run_webhook(install.args(30) + " --probe-namespace default --each-apiserver");
  INFO(result.output);
  install.check_left_unarmed(result);
  CHECK(probes == 1);
  CHECK(other.requests().empty());
  CHECK_THAT(result.output, Catch::Contains("then not the next") && Catch::Contains(other.url()));
}

TEST_CASE(
    "arm: with --each-apiserver, no EndpointSlice default/kubernetes probes through the Service alone, and one "
    "it cannot use leaves it unarmed") {
  {
    Install install;
    install.apiserver.put_at(kDeployment, deployment(3));
    std::atomic<int> probes{0};
    install.answer_as_this_release(probes);
    const ExitResult result = run_webhook(install.args(30) + " --probe-namespace default --each-apiserver");
    INFO(result.output);
    CHECK(result.status == 0);
    CHECK(probes == 10);
    CHECK_THAT(result.output,
               Catch::Contains("no EndpointSlice default/kubernetes: probing through the Service alone"));
  }
  struct Row {
    const char* what;
    std::function<json(unsigned short)> slice;
    const char* says;
  };
  const Row rows[] = {
      {"another address family than the API's host",
       [](unsigned short port) { return api_server_slice({"::1"}, port, "IPv6"); },
       "the EndpointSlice is of another address family than 127.0.0.1"},
      {"no endpoint ready", [](unsigned short port) { return api_server_slice({}, port); }, "none is ready"},
  };
  for (const Row& row : rows) {
    INFO(row.what);
    Install install;
    install.apiserver.put_at(kDeployment, deployment(3));
    install.apiserver.collect_posts(kEvents);
    std::atomic<int> probes{0};
    install.answer_as_this_release(probes);
    install.apiserver.put_at(kApiServers, row.slice(install.apiserver.port()));
    const ExitResult result = run_webhook(install.args(30) + " --probe-namespace default --each-apiserver");
    INFO(result.output);
    install.check_left_unarmed(result);
    CHECK(probes == 0);
    CHECK_THAT(result.output, Catch::Contains("cannot read the API servers, EndpointSlice default/kubernetes: ") &&
                                  Catch::Contains(row.says));
  }
}

TEST_CASE("arm: a configuration without the webhook, or bad flags, are refused") {
  Install install;
  install.apiserver.put_at(kDeployment, deployment(3));
  install.apiserver.put_at(kConfiguration, {{"webhooks", json::array({{{"name", "someone-else.example.com"}}})}});
  const ExitResult missing = run_webhook(install.args(5));
  CHECK(missing.status == 1);
  CHECK_THAT(missing.output, Catch::Contains("has no webhook named visible-devices.gpuguard.io"));
  // The binding is armed all the same: each object on its own.
  CHECK(install.apiserver.at(kBinding)["spec"]["validationActions"] == json::array({"Deny"}));
  CHECK(run_webhook("arm --namespace gpuguard-system").status == 2);
  CHECK(run_webhook("arm --namespace gpuguard-system --deployment gpuguard-webhook").status == 2);  // nothing to arm
  // Each name goes into a request's path: one that is not a name of its kind is refused before any request
  // (run_webhook runs the command line through the shell, hence the quotes).
  const std::string named = "arm --namespace gpuguard-system --deployment gpuguard-webhook ";
  for (const auto& [flags, refused] : std::vector<std::pair<std::string, std::string>>{
           {named + "--webhook-configuration gpuguard --probe-namespace ../../apis",
            "--probe-namespace \"../../apis\" is not a namespace's name"},
           {"arm --namespace ../kube-system --deployment gpuguard-webhook --webhook-configuration gpuguard",
            "--namespace \"../kube-system\" is not a namespace's name"},
           {"arm --namespace gpuguard.system --deployment gpuguard-webhook --webhook-configuration gpuguard",
            "--namespace \"gpuguard.system\" is not a namespace's name"},
           {"arm --namespace gpuguard-system --deployment " + std::string(64, 'w') +
                " --webhook-configuration gpuguard",
            "--deployment \"" + std::string(64, 'w') + "\" is not a Deployment's name"},
           {named + "--webhook-configuration 'gpuguard?dryRun=All'",
            "--webhook-configuration \"gpuguard?dryRun=All\" is not a MutatingWebhookConfiguration's name"},
           {named + "--webhook-configuration gpuguard/../x",
            "--webhook-configuration \"gpuguard/../x\" is not a MutatingWebhookConfiguration's name"},
           {named + "--webhook-configuration \"\" --backstop-binding gpuguard-visible-devices",
            "--webhook-configuration \"\" is not a MutatingWebhookConfiguration's name"},
           {named + "--backstop-binding \"\"",
            "--backstop-binding \"\" is not a ValidatingAdmissionPolicyBinding's name"},
           {named + "--webhook-configuration gpuguard --probe-namespace " + std::string(64, 'p'),
            "--probe-namespace \"" + std::string(64, 'p') + "\" is not a namespace's name"},
           {named + "--backstop-binding Gpuguard",
            "--backstop-binding \"Gpuguard\" is not a ValidatingAdmissionPolicyBinding's name"},
           {named + "--verify-only --probe-namespace default --webhook-configuration gpuguard",
            "--verify-only arms nothing: give it without --webhook-configuration and --backstop-binding"},
           {named + "--verify-only --probe-namespace default --backstop-binding gpuguard-visible-devices",
            "--verify-only arms nothing"},
           {named + "--verify-only", "--verify-only needs --probe-namespace"},
           {named + "--webhook-configuration gpuguard --service gpuguard-webhook", "--service needs --probe-namespace"},
           {named + "--webhook-configuration gpuguard --probe-namespace default --service ../pods",
            "--service \"../pods\" is not a Service's name"},
           {named + "--verify-only --probe-namespace \"\"", "--verify-only needs --probe-namespace"},
           {named + "--webhook-configuration gpuguard --each-apiserver", "--each-apiserver needs --probe-namespace"}}) {
    INFO(flags);
    const ExitResult result = run_webhook(flags);
    CHECK(result.status == 2);
    CHECK_THAT(result.output, Catch::Contains(refused));
  }
  // A Deployment's name of 63 is one it takes: refused here only for having nothing to arm.
  CHECK_THAT(run_webhook("arm --namespace gpuguard-system --deployment " + std::string(63, 'w')).output,
             Catch::Contains("nothing to arm"));
  CHECK(run_webhook("arm --help").status == 0);
}

TEST_CASE("await-rollout: the uninstall's hook waits until the node cleanup is ready on every node, or says not") {
  constexpr const char* kCleanup = "/apis/apps/v1/namespaces/gpuguard-system/daemonsets/gpuguard-node-cleanup";
  const auto cleanup = [](int desired, int ready, int observed) {
    return json{{"kind", "DaemonSet"},
                {"metadata", {{"name", "gpuguard-node-cleanup"}, {"generation", 1}}},
                {"status",
                 {{"observedGeneration", observed},
                  {"desiredNumberScheduled", desired},
                  {"updatedNumberScheduled", desired},
                  {"numberReady", ready}}}};
  };
  Install install;
  const std::string flags = "await-rollout --apiserver-url " + install.apiserver.url() + " --token-file " +
                            (install.dir / "token").string() + " --ca-file " + certs_dir() + "/ca.crt";
  const std::string args = flags + " --namespace gpuguard-system --daemonset gpuguard-node-cleanup --timeout ";
  // Not there yet, then its controller not caught up, then one of two nodes clean: it waits through each.
  auto waited = std::async(std::launch::async, [&] { return run_webhook(args + "30"); });
  REQUIRE(eventually([&] { return install.count("GET", kCleanup) >= 2; }));
  install.apiserver.put_at(kCleanup, cleanup(0, 0, 0));
  REQUIRE(eventually([&] { return install.count("GET", kCleanup) >= 4; }));
  install.apiserver.put_at(kCleanup, cleanup(2, 1, 1));
  REQUIRE(eventually([&] { return install.count("GET", kCleanup) >= 6; }));
  CHECK(waited.wait_for(0s) == std::future_status::timeout);
  install.apiserver.put_at(kCleanup, cleanup(2, 2, 1));
  const ExitResult done = waited.get();
  INFO(done.output);
  CHECK(done.status == 0);
  CHECK_THAT(done.output, Catch::Contains("1 of 2 nodes ready"));
  CHECK_THAT(done.output, Catch::Contains("the DaemonSet is ready on every node"));
  // A node whose pod is never ready: exit 1 at the timeout, naming it (Helm deletes the DaemonSet after a
  // failed hook: the Job's log is what is left), its pods listed by the DaemonSet's selector.
  json unready = cleanup(2, 1, 1);
  unready["spec"]["selector"]["matchLabels"] = {{"app.kubernetes.io/name", "gpuguard-node-cleanup"}};
  install.apiserver.put_at(kCleanup, unready);
  install.apiserver.put_at(
      "/api/v1/namespaces/gpuguard-system/pods",
      {{"kind", "PodList"},
       {"items",
        json::array({{{"metadata", {{"name", "a"}}},
                      {"spec", {{"nodeName", "gpu-1"}}},
                      {"status", {{"conditions", json::array({{{"type", "Ready"}, {"status", "True"}}})}}}},
                     {{"metadata", {{"name", "b"}}},
                      {"spec", {{"nodeName", "gpu-2"}}},
                      {"status", {{"conditions", json::array({{{"type", "Ready"}, {"status", "False"}}})}}}}})}});
  const ExitResult left = run_webhook(args + "3");
  CHECK(left.status == 1);
  CHECK_THAT(left.output, Catch::Contains("the DaemonSet is not ready on every node"));
  CHECK_THAT(left.output, Catch::Contains("1 not ready: gpu-2"));
  bool listed = false;
  for (const auto& r : install.apiserver.requests()) {
    listed = listed || (r.path == "/api/v1/namespaces/gpuguard-system/pods" &&
                        r.query == "labelSelector=app.kubernetes.io%2Fname%3Dgpuguard-node-cleanup&limit=100");
  }
  CHECK(listed);
  CHECK(run_webhook(flags + " --namespace gpuguard-system --daemonset ../pods").status == 2);
  CHECK(run_webhook(flags + " --namespace Bad_NS --daemonset gpuguard-node-cleanup").status == 2);
  CHECK(run_webhook(flags + " --daemonset gpuguard-node-cleanup").status == 2);
}

// The real `gpuguard-webhook arm` against the fake API server over real TLS: it waits for a replica of the
// webhook, arms the webhook configuration and the backstop's binding with JSON Patches, and when no
// replica comes, leaves both as they were and says so.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

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
constexpr const char* kConfiguration = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpuguard";
constexpr const char* kBinding =
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/gpuguard-visible-devices";

json deployment(int available) {
  return {{"apiVersion", "apps/v1"},
          {"kind", "Deployment"},
          {"metadata", {{"name", "gpuguard-webhook"}, {"namespace", "gpuguard-system"}}},
          {"spec", {{"replicas", 3}}},
          {"status", {{"replicas", 3}, {"availableReplicas", available}}}};
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
    return "arm --apiserver-url " + apiserver.url() + " --token-file " + (dir / "token").string() + " --ca-file " +
           certs_dir() +
           "/ca.crt --namespace gpuguard-system --deployment gpuguard-webhook "
           "--webhook-configuration gpuguard --backstop-binding gpuguard-visible-devices --timeout " +
           std::to_string(timeout);
  }
  std::size_t patches() const { return count("PATCH", ""); }
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
  const auto started = std::chrono::steady_clock::now();
  const ExitResult result = run_webhook(install.args(3));
  INFO(result.output);
  CHECK(result.status == 1);
  CHECK(std::chrono::steady_clock::now() - started < 10s);
  CHECK_THAT(result.output, Catch::Contains("nothing was armed, so nothing refuses pods for it"));
  CHECK(install.patches() == 0);
  CHECK(install.apiserver.at(kConfiguration)["webhooks"][0]["failurePolicy"] == "Ignore");
  CHECK(install.apiserver.at(kBinding)["spec"]["validationActions"] == json::array({"Warn", "Audit"}));
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
  CHECK(run_webhook("arm --help").status == 0);
}

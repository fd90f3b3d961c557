// The real webhook against the fake API server, for each resource.k8s.io version a cluster may serve
// (v1 from Kubernetes 1.34, v1beta2 on 1.33, v1beta1 on 1.32, none before): it reads claims through the
// newest served, with no flag, and a container claiming a GPU class keeps its GPUs; with none served,
// claims are off and /readyz says so.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "eventually.hpp"
#include "fake_apiserver.hpp"
#include "gpuguard/admission/base64.hpp"
#include "http_client.hpp"
#include "server_process.hpp"
#include "tls_client.hpp"
#include "webhook_cluster.hpp"

using namespace gpuguard::test;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A claim for one GPU in the shape of `version`: v1 and v1beta2 name the class under `exactly`, v1beta1
// at the request's top.
json gpu_claim(const std::string& version) {
  json request = {{"name", "gpu"}};
  if (version == "v1beta1") {
    request["deviceClassName"] = "gpu.nvidia.com";
  } else {
    request["exactly"] = {{"deviceClassName", "gpu.nvidia.com"}, {"allocationMode", "ExactCount"}, {"count", 1}};
  }
  return {{"apiVersion", "resource.k8s.io/" + version},
          {"kind", "ResourceClaim"},
          {"metadata", {{"namespace", "team-a"}, {"name", "one-gpu"}}},
          {"spec", {{"devices", {{"requests", json::array({request})}}}}}};
}

// A pod whose `train` container claims one-gpu and whose `sidecar` claims nothing.
std::string review() {
  const json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"namespace", "team-a"}, {"name", "trainer"}}},
      {"spec",
       {{"containers",
         json::array({{{"name", "train"}, {"image", "cuda"}, {"resources", {{"claims", {{{"name", "gpu"}}}}}}},
                      {{"name", "sidecar"}, {"image", "busybox"}}})},
        {"resourceClaims", json::array({{{"name", "gpu"}, {"resourceClaimName", "one-gpu"}}})}}}};
  return json{{"apiVersion", "admission.k8s.io/v1"},
              {"kind", "AdmissionReview"},
              {"request",
               {{"uid", "claims-1"},
                {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
                {"operation", "CREATE"},
                {"namespace", "team-a"},
                {"object", pod}}}}
      .dump();
}

// The containers the webhook's patch gives NVIDIA_VISIBLE_DEVICES, by index, from the base64 JSON Patch.
std::string patched_containers(const std::string& answer) {
  const json response = json::parse(answer)["response"];
  if (!response.contains("patch")) return "";
  const auto decoded = gpuguard::admission::base64_decode(response["patch"].get<std::string>());
  REQUIRE(decoded);
  std::string containers;
  for (const json& op : json::parse(*decoded)) {
    const std::string path = op["path"];
    for (const char* index : {"0", "1"}) {
      if (path.starts_with(std::string("/spec/containers/") + index + "/env")) {
        if (containers.find(index) == std::string::npos) containers += index;
      }
    }
  }
  return containers;
}

struct Cluster : WebhookCluster {
  Cluster() : WebhookCluster("claims") {}
  std::unique_ptr<WebhookProcess> webhook() { return std::make_unique<WebhookProcess>(flags()); }
};

}  // namespace

TEST_CASE("a GPU claim is read through the newest resource.k8s.io version served, v1, v1beta2 or v1beta1") {
  struct Row {
    std::vector<std::string> served;
    std::string read;
  };
  const Row rows[] = {
      {{"v1", "v1beta2", "v1beta1"}, "v1"}, {{"v1beta2", "v1beta1"}, "v1beta2"}, {{"v1beta1"}, "v1beta1"}};
  for (const Row& row : rows) {
    INFO("read through " << row.read);
    Cluster cluster;
    cluster.apiserver.serve_claims(row.served);
    cluster.apiserver.put("resourceclaims", gpu_claim(row.read));
    auto webhook = cluster.webhook();
    TlsClient client(webhook->port());
    // Until the claim is listed its container gets none too; then only the sidecar does.
    REQUIRE(eventually([&] {
      return patched_containers(client.request("POST", "/mutate", review(), "application/json").body) == "1";
    }));
    CHECK(cluster.apiserver.count("resourceclaims", false, 200) >= 1);
    for (const auto& request : cluster.apiserver.requests()) {
      if (request.path.find("/resourceclaim") != std::string::npos) {
        CHECK(request.path.starts_with("/apis/resource.k8s.io/" + row.read + "/"));
      }
    }
    // Ready once the templates are listed too, which may come after the claims.
    CHECK(eventually([&] { return client.request("GET", "/readyz").status == 200; }));
    CHECK(client.request("GET", "/readyz").body == "ok\n");
  }
}

TEST_CASE("with no resource.k8s.io version served, claims are off and /readyz says so") {
  for (const std::vector<std::string>& served : {std::vector<std::string>{}, std::vector<std::string>{"v1alpha3"}}) {
    INFO("served: " << served.size());
    Cluster cluster;
    cluster.apiserver.serve_claims(served);
    auto webhook = cluster.webhook();
    TlsClient client(webhook->port());
    HttpReply ready;
    // Not ready until discovery has answered; then ready, with claims off (an empty list counts as listed).
    REQUIRE(eventually([&] {
      ready = client.request("GET", "/readyz");
      return ready.status == 200;
    }));
    CHECK(ready.status == 200);
    CHECK(
        ready.body.starts_with("ok\nDRA claims off: the API server serves no resource.k8s.io version gpuguard reads"));
    CHECK(ready.body.find(served.empty() ? "served: none)" : "served: v1alpha3)") != std::string::npos);
    // Both containers get none: a claim cannot hand out GPUs on a cluster without the API.
    CHECK(patched_containers(client.request("POST", "/mutate", review(), "application/json").body) == "01");
    CHECK(cluster.apiserver.count("resourceclaims", false) == 0);
  }
}

TEST_CASE("a cluster that starts serving resource.k8s.io is read without a restart") {
  Cluster cluster;
  auto webhook = cluster.webhook();
  TlsClient client(webhook->port());
  REQUIRE(eventually([&] { return client.request("GET", "/readyz").body.starts_with("ok\nDRA claims off"); }));
  CHECK(patched_containers(client.request("POST", "/mutate", review(), "application/json").body) == "01");
  cluster.apiserver.serve_claims({"v1"});
  cluster.apiserver.put("resourceclaims", gpu_claim("v1"));
  CHECK(eventually(
      [&] { return patched_containers(client.request("POST", "/mutate", review(), "application/json").body) == "1"; }));
  CHECK(client.request("GET", "/readyz").body == "ok\n");
}

TEST_CASE("with claims read, /readyz is 503 until they have been listed, and says why") {
  Cluster cluster;
  cluster.apiserver.serve_claims({"v1"});
  cluster.apiserver.put("resourceclaims", gpu_claim("v1"));
  cluster.apiserver.hold_lists(true);
  auto webhook = cluster.webhook();
  TlsClient client(webhook->port());
  // Discovery is answered, the lists are held: a review now would give the claiming container none.
  HttpReply ready = client.request("GET", "/readyz");
  CHECK(ready.status == 503);
  CHECK(ready.body.starts_with("not ready\nDRA claims not listed yet"));
  CHECK(client.request("GET", "/healthz").status == 200);
  cluster.apiserver.hold_lists(false);
  REQUIRE(eventually([&] { return client.request("GET", "/readyz").status == 200; }));
  CHECK(client.request("GET", "/readyz").body == "ok\n");
  CHECK(patched_containers(client.request("POST", "/mutate", review(), "application/json").body) == "1");
}

// The kernel gives a process-directed SIGTERM to any thread that does not block it. The webhook holds both
// stop signals blocked from the start of serving, before any thread exists, so every thread it starts (here
// the informers', the certificate watcher's, the connections' loops) blocks them, and releases them in the
// main thread just before the server's signal loop runs there: a stop during start-up waits for the drain,
// and none is given to a thread asleep where it may never be seen.
TEST_CASE("SIGTERM and SIGINT reach the signal loop's thread alone: every other thread blocks them") {
  Cluster cluster;
  cluster.apiserver.serve_claims({"v1"});
  auto webhook = cluster.webhook();
  CHECK(eventually(
      [&] { return webhook->main_thread_alone_takes(SIGTERM) && webhook->main_thread_alone_takes(SIGINT); }));
  INFO(webhook->threads().size() << " threads");
  CHECK(webhook->threads().size() >= 5);  // beside the main thread: informers, the watcher, two connection loops
  CHECK(webhook->terminate() == 0);
}

// A pod's pids limit (the kubelet's podPidsLimit) that leaves the webhook fewer threads than it starts: at
// each limit it serves or exits 1 saying why. Its connections' loops started last used to leave it waiting
// for ever on the loop that did start.
TEST_CASE("at each limit on its threads the webhook serves, or exits 1 saying why") {
  Cluster cluster;
  cluster.apiserver.serve_claims({"v1"});
  // Its certificate, with a key the user it runs as may read.
  fs::copy_file(certs_dir() + "/tls.crt", cluster.dir / "tls.crt");
  fs::copy_file(certs_dir() + "/tls.key", cluster.dir / "tls.key");
  REQUIRE(::chown((cluster.dir / "tls.key").c_str(), own_test_user(), own_test_user()) == 0);
  std::vector<std::string> flags = cluster.flags();
  flags.insert(flags.end(), {"--tls-cert-file", (cluster.dir / "tls.crt").string(), "--tls-private-key-file",
                             (cluster.dir / "tls.key").string()});
  const int served = serves_or_says_why_at_each_task_limit(webhook_argv(flags), 10);
  CHECK(served >= 1);  // the last limits leave room for every thread
  CHECK(served < 10);  // and the first do not
}

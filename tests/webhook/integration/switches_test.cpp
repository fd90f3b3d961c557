// The real webhook against the fake API server: the admission switches it cannot see in its reviews (a
// namespace labelled gpuguard.io/ignore, the webhook configuration or the backstop's binding deleted) are
// watched and said on /metrics, as the alerts GPUGuardAdmissionBreakGlass and GPUGuardAdmissionObjectMissing
// read them, and whether each watch works; the namespaces are selected by the label on the server, each object
// by its name.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "eventually.hpp"
#include "fake_apiserver.hpp"
#include "http_client.hpp"
#include "promtool.hpp"
#include "series.hpp"
#include "server_process.hpp"
#include "tls_client.hpp"
#include "webhook_cluster.hpp"

using namespace gpuguard::test;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json named(const std::string& kind, const std::string& name, json labels = json::object()) {
  return {{"kind", kind}, {"metadata", {{"name", name}, {"labels", std::move(labels)}}}};
}

constexpr const char* kBreakGlass = "gpuguard_ignored_namespaces{value=\"break-glass\"}";
constexpr const char* kOther = "gpuguard_ignored_namespaces{value=\"other\"}";
constexpr const char* kConfiguration = "gpuguard_admission_object_present{object=\"webhook-configuration\"}";
constexpr const char* kBinding = "gpuguard_admission_object_present{object=\"backstop-binding\"}";
constexpr const char* kPolicy = "gpuguard_admission_object_present{object=\"backstop-policy\"}";
constexpr const char* kKeeperPolicy = "gpuguard_admission_object_present{object=\"keeper-policy\"}";
constexpr const char* kKeeperBinding = "gpuguard_admission_object_present{object=\"keeper-binding\"}";
constexpr const char* kKeeper = "gpuguard-keep-configmap-params";
constexpr const char* kWatched[] = {
    "gpuguard_admission_switches_watched{resource=\"namespaces\"}",
    "gpuguard_admission_switches_watched{resource=\"mutatingwebhookconfigurations\"}",
    "gpuguard_admission_switches_watched{resource=\"validatingadmissionpolicybindings\"}",
    "gpuguard_admission_switches_watched{resource=\"validatingadmissionpolicies\"}"};

struct Cluster : WebhookCluster {
  Cluster() : WebhookCluster("switches") { apiserver.serve_claims({}); }
};

}  // namespace

TEST_CASE("the namespaces labelled gpuguard.io/ignore and the admission objects deleted are said on /metrics") {
  Cluster cluster;
  cluster.apiserver.put("namespaces", named("Namespace", "team-a"));
  cluster.apiserver.put("namespaces", named("Namespace", "granted", {{"gpuguard.io/ignore", "true"}}));
  cluster.apiserver.put("mutatingwebhookconfigurations", named("MutatingWebhookConfiguration", "gpuguard"));
  cluster.apiserver.put("mutatingwebhookconfigurations", named("MutatingWebhookConfiguration", "someone-else"));
  cluster.apiserver.put("validatingadmissionpolicybindings",
                        named("ValidatingAdmissionPolicyBinding", "gpuguard-visible-devices"));
  cluster.apiserver.put("validatingadmissionpolicies", named("ValidatingAdmissionPolicy", "gpuguard-visible-devices"));
  cluster.apiserver.put("validatingadmissionpolicybindings", named("ValidatingAdmissionPolicyBinding", kKeeper));
  cluster.apiserver.put("validatingadmissionpolicies", named("ValidatingAdmissionPolicy", kKeeper));
  WebhookProcess webhook(
      cluster.flags({"--webhook-configuration", "gpuguard", "--backstop-binding", "gpuguard-visible-devices",
                     "--backstop-policy", "gpuguard-visible-devices", "--parameter-keeper", kKeeper}));
  TlsClient client(webhook.port());
  auto page = [&] { return client.request("GET", "/metrics").body; };
  auto reads = [&](std::vector<std::pair<const char*, long long>> want) {
    return eventually([&] {
      const std::string now = page();
      for (const auto& [series, value] : want) {
        if (series_value(now, series) != value) return false;
      }
      return true;
    });
  };

  REQUIRE(reads({{kBreakGlass, 0},
                 {kOther, 1},
                 {kConfiguration, 1},
                 {kBinding, 1},
                 {kPolicy, 1},
                 {kKeeperPolicy, 1},
                 {kKeeperBinding, 1},
                 {kWatched[0], 1},
                 {kWatched[1], 1},
                 {kWatched[2], 1},
                 {kWatched[3], 1}}));
  check_promtool_clean(page());
  // Selected on the server: the label for namespaces, the name for each object (the backstop's or the
  // keeper's, each by its own list and watch).
  bool namespaces_selected = false;
  std::set<std::string> named_lists;
  for (const auto& request : cluster.apiserver.requests()) {
    if (request.path == "/api/v1/namespaces") {
      CHECK(request.query.find("labelSelector=gpuguard.io%2Fignore") != std::string::npos);
      namespaces_selected = true;
    }
    if (request.path.ends_with("/mutatingwebhookconfigurations")) {
      CHECK((request.query + "&").find("fieldSelector=metadata.name%3Dgpuguard&") != std::string::npos);
    }
    for (const char* resource : {"/validatingadmissionpolicies", "/validatingadmissionpolicybindings"}) {
      if (!request.path.ends_with(resource)) continue;
      for (const std::string name : {"gpuguard-visible-devices", kKeeper}) {
        if ((request.query + "&").find("fieldSelector=metadata.name%3D" + name + "&") != std::string::npos) {
          named_lists.insert(resource + (" " + name));
        }
      }
      CHECK(request.query.find("fieldSelector=metadata.name%3D") != std::string::npos);
    }
  }
  CHECK(namespaces_selected);
  CHECK(named_lists.size() == 4);

  // The break glass: every namespace labelled, then taken off by its value; the granted one is kept.
  cluster.apiserver.put("namespaces", named("Namespace", "team-a", {{"gpuguard.io/ignore", "break-glass"}}));
  cluster.apiserver.put("namespaces", named("Namespace", "team-b", {{"gpuguard.io/ignore", "break-glass"}}));
  CHECK(reads({{kBreakGlass, 2}, {kOther, 1}}));
  cluster.apiserver.put("namespaces", named("Namespace", "team-a"));  // the label taken off
  cluster.apiserver.remove("namespaces", "team-b");
  CHECK(reads({{kBreakGlass, 0}, {kOther, 1}}));

  // The keeper's pair deleted (the next break glass would leave the backstop reading a stale parameter).
  cluster.apiserver.remove("validatingadmissionpolicybindings", kKeeper);
  cluster.apiserver.remove("validatingadmissionpolicies", kKeeper);
  CHECK(reads({{kKeeperPolicy, 0}, {kKeeperBinding, 0}, {kPolicy, 1}, {kBinding, 1}}));

  // The other break glass: the binding and the configuration deleted; another's configuration changes nothing.
  // The policy deleted without its binding turns the backstop off as well.
  cluster.apiserver.remove("validatingadmissionpolicies", "gpuguard-visible-devices");
  CHECK(reads({{kPolicy, 0}, {kBinding, 1}}));
  cluster.apiserver.remove("validatingadmissionpolicybindings", "gpuguard-visible-devices");
  CHECK(reads({{kConfiguration, 1}, {kBinding, 0}}));
  cluster.apiserver.remove("mutatingwebhookconfigurations", "someone-else");
  cluster.apiserver.remove("mutatingwebhookconfigurations", "gpuguard");
  CHECK(reads({{kConfiguration, 0}, {kBinding, 0}}));
  // Made again (helm upgrade): present once more, and still after a re-list.
  cluster.apiserver.put("mutatingwebhookconfigurations", named("MutatingWebhookConfiguration", "gpuguard"));
  cluster.apiserver.compact();
  cluster.apiserver.drop_watches();
  cluster.apiserver.put("validatingadmissionpolicybindings",
                        named("ValidatingAdmissionPolicyBinding", "gpuguard-visible-devices"), false);
  CHECK(reads({{kConfiguration, 1}, {kBinding, 1}, {kPolicy, 0}}));

  // The watches refused (a token the API server no longer takes): each said not watched, so that the alerts
  // that read these series are known to be silent; taken again, watched, once a list succeeds.
  cluster.apiserver.set_token("another-token");
  cluster.apiserver.drop_watches();
  CHECK(reads({{kWatched[0], 0}, {kWatched[1], 0}, {kWatched[2], 0}, {kWatched[3], 0}}));
  cluster.apiserver.set_token("webhook-token");
  cluster.apiserver.compact();  // the watches resumed from where they were get 410, and list again
  cluster.apiserver.drop_watches();
  CHECK(reads({{kWatched[0], 1}, {kWatched[1], 1}, {kWatched[2], 1}, {kWatched[3], 1}}));
}

TEST_CASE("without the objects' names only the namespaces are watched, and off or with no API nothing is") {
  Cluster cluster;
  cluster.apiserver.put("namespaces", named("Namespace", "lab", {{"gpuguard.io/ignore", "break-glass"}}));
  {
    WebhookProcess webhook(cluster.flags({"--resource-claims", "off"}));
    TlsClient client(webhook.port());
    REQUIRE(eventually([&] { return series_value(client.request("GET", "/metrics").body, kBreakGlass) == 1; }));
    const std::string page = client.request("GET", "/metrics").body;
    CHECK(page.find("gpuguard_admission_object_present") == std::string::npos);
    CHECK(page.find("gpuguard_admission_switches_watched{resource=\"mutatingwebhookconfigurations\"}") ==
          std::string::npos);
    CHECK(page.find("gpuguard_resource_claims_synced") == std::string::npos);  // claims off: not watched
    CHECK(cluster.apiserver.count("mutatingwebhookconfigurations", false) == 0);
    CHECK(cluster.apiserver.count("resourceclaims", false) == 0);
  }
  {
    // Off, with claims off too: the webhook uses no Kubernetes API at all.
    const std::size_t before = cluster.apiserver.requests().size();
    WebhookProcess webhook(cluster.flags(
        {"--resource-claims", "off", "--admission-switches", "off", "--webhook-configuration", "gpuguard"}));
    TlsClient client(webhook.port());
    REQUIRE(eventually([&] { return client.request("GET", "/readyz").status == 200; }));
    const std::string page = client.request("GET", "/metrics").body;
    for (const char* series :
         {"gpuguard_admission_switches_watched", "gpuguard_ignored_namespaces", "gpuguard_admission_object_present"}) {
      CHECK(page.find(series) == std::string::npos);
    }
    CHECK(cluster.apiserver.requests().size() == before);
  }
  WebhookProcess alone;
  TlsClient client(alone.port());
  REQUIRE(eventually([&] { return client.request("GET", "/readyz").status == 200; }));
  CHECK(client.request("GET", "/metrics").body.find("gpuguard_ignored_namespaces") == std::string::npos);
}

TEST_CASE("an object's name that is not one, or a switches mode that is not watch or off, is refused at start") {
  for (const char* flag :
       {"--webhook-configuration", "--backstop-binding", "--backstop-policy", "--parameter-keeper"}) {
    INFO(flag);
    const ExitResult result = run_webhook("--tls-cert-file " + certs_dir() + "/tls.crt --tls-private-key-file " +
                                          certs_dir() + "/tls.key " + flag + " Not_A_Name");
    CHECK(result.status == 2);
    CHECK(result.output.find(std::string("gpuguard-webhook: ") + flag + " 'Not_A_Name' is not an object's name") !=
          std::string::npos);
  }
  const ExitResult mode = run_webhook("--tls-cert-file " + certs_dir() + "/tls.crt --tls-private-key-file " +
                                      certs_dir() + "/tls.key --admission-switches auto");
  CHECK(mode.status == 2);
  CHECK(mode.output.find("gpuguard-webhook: --admission-switches must be watch or off") != std::string::npos);
}

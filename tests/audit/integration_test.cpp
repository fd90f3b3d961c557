// The real `gpuguard-webhook audit-controller` against the fake Kubernetes API server over real TLS: its
// PolicyReports and metrics follow the pods, a new policy, and the Lease; with two replicas one writes, the
// other takes over when the leader dies, and what is already true is not written again.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "eventually.hpp"
#include "fake_apiserver.hpp"
#include "files.hpp"
#include "http_client.hpp"
#include "promtool.hpp"
#include "series.hpp"
#include "server_process.hpp"

using namespace gpuguard::test;
using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kLease = "gpuguard-system/gpuguard-audit";

json pod(const std::string& ns, const std::string& name, bool protected_by_none) {
  json env = json::array();
  if (protected_by_none) env.push_back({{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "none"}});
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"namespace", ns}, {"name", name}, {"uid", "uid-" + name}, {"creationTimestamp", "2026-11-25T10:00:00Z"}}},
      {"spec", {{"nodeName", "n1"}, {"containers", json::array({{{"name", "app"}, {"image", "cuda"}, {"env", env}}})}}},
      {"status", {{"phase", "Running"}}}};
}

json node(const std::string& name) {
  return {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}}}, {"status", json::object()}};
}

struct Cluster {
  FakeApiserver apiserver{"audit-token"};
  fs::path dir = fs::temp_directory_path() / ("gpuguard-audit-" + std::to_string(getpid()));
  Cluster() {
    fs::create_directories(dir / "policy");
    std::ofstream(dir / "token") << "audit-token";
    std::ofstream(dir / "policy" / "mode") << "enforce";
    apiserver.put("nodes", node("n1"));
    apiserver.put("pods", pod("team-a", "leaky", false));
    apiserver.put("pods", pod("team-a", "fine", true));
    apiserver.put("pods", pod("tools", "debug", false));
  }
  ~Cluster() { fs::remove_all(dir); }

  std::vector<std::string> controller_argv(const std::string& identity) const {
    return {GPUGUARD_WEBHOOK_BIN, "audit-controller",
            "--apiserver-url",    apiserver.url(),
            "--token-file",       (dir / "token").string(),
            "--ca-file",          certs_dir() + "/ca.crt",
            "--listen-address",   "127.0.0.1:0",
            "--lease-namespace",  "gpuguard-system",
            "--identity",         identity,
            "--resource-claims",  "off",
            "--policy-dir",       (dir / "policy").string(),
            "--lease-duration",   "4",
            "--renew-deadline",   "3",
            "--retry-period",     "1"};
  }
  std::unique_ptr<ServerProcess> controller(const std::string& identity) {
    return std::make_unique<ServerProcess>(controller_argv(identity));
  }
};

// A series' value from /metrics; -1 when absent.
long long series(const ServerProcess& process, const std::string& name) {
  const Reply reply = http_request(process.port(), "GET", "/metrics");
  return reply.status == 200 ? series_value(reply.body, name) : -1;
}

std::string result_of(const json& report) { return report["results"][0]["result"]; }

}  // namespace

TEST_CASE("reports and metrics follow the pods and the policy, and the Lease is released") {
  Cluster cluster;
  auto controller = cluster.controller("replica-a");
  REQUIRE(eventually([&] { return http_request(controller->port(), "GET", "/readyz").status == 200; }));
  REQUIRE(eventually([&] { return cluster.apiserver.policy_reports().size() == 2; }));
  auto reports = cluster.apiserver.policy_reports();
  REQUIRE(reports.count("team-a"));
  const json& team_a = reports["team-a"];
  CHECK(team_a["metadata"]["name"] == "gpuguard-gpu-exposure");
  CHECK(team_a["summary"]["fail"] == 1);
  REQUIRE(team_a["results"].size() == 1);
  CHECK(team_a["results"][0]["resources"][0]["name"] == "leaky");
  CHECK(team_a["results"][0]["properties"]["reasons"] == "image-default");
  CHECK(cluster.apiserver.lease(kLease)["spec"]["holderIdentity"] == "replica-a");
  CHECK(series(*controller, "gpuguard_audit_leader") == 1);
  CHECK(series(*controller,
               "gpuguard_audit_exposed_pods{namespace=\"team-a\",reason=\"image-default\",result=\"fail\"}") == 1);
  CHECK(series(*controller, "gpuguard_audit_pods") == 3);
  check_promtool_clean(http_request(controller->port(), "GET", "/metrics").body);
  CHECK(series(*controller, "gpuguard_audit_nodes{verdict=\"no-gpu\"}") == 1);  // n1 has no GPU, nor the condition
  CHECK(series(*controller, "gpuguard_audit_policy_reports_available") == 1);

  // A pod created while the webhook was down appears; a deleted one leaves its report.
  cluster.apiserver.put("pods", pod("late", "created-unpatched", false));
  CHECK(eventually([&] { return cluster.apiserver.policy_reports().count("late") == 1; }));
  cluster.apiserver.remove("pods", "debug");
  CHECK(eventually([&] { return cluster.apiserver.policy_reports().count("tools") == 0; }));
  CHECK(eventually([&] {
    return series(*controller,
                  "gpuguard_audit_exposed_pods{namespace=\"tools\",reason=\"image-default\",result=\"fail\"}") == -1;
  }));

  // Policy mode audit: the pods are listed again, and the same exposure is a warning.
  std::ofstream(cluster.dir / "policy" / "mode") << "audit";
  CHECK(eventually([&] { return result_of(cluster.apiserver.policy_reports()["team-a"]) == "warn"; }));

  CHECK(controller->terminate() == 0);
  const json lease = cluster.apiserver.lease(kLease);
  CHECK(lease["spec"]["holderIdentity"] == "");
  CHECK(lease["spec"]["leaseDurationSeconds"] == 1);
}

TEST_CASE("a pass over 1,000 pods in 100 namespaces: its Lease and 100 reports over kept connections") {
  Cluster cluster;
  for (int n = 0; n < 100; ++n) {
    for (int p = 0; p < 10; ++p) {
      // Unique names: the fake keeps pods by name alone.
      cluster.apiserver.put("pods", pod("ns-" + std::to_string(n), "pod-" + std::to_string(n * 10 + p), p != 0));
    }
  }
  auto controller = cluster.controller("replica-a");
  const bool all_written = eventually([&] { return cluster.apiserver.policy_reports().size() == 102; }, 30s);
  INFO(cluster.apiserver.policy_reports().size() << " reports");
  REQUIRE(all_written);
  const auto lease_requests = [&] {
    const auto requests = cluster.apiserver.requests();
    return std::count_if(requests.begin(), requests.end(), [](const FakeApiserver::Request& r) {
      return r.path.starts_with("/apis/coordination.k8s.io/");
    });
  };
  // Three more rounds of the Lease after the reports, each on the connection the reports were written on.
  const long long rounds = series(*controller, "gpuguard_audit_lease_rounds_total");
  REQUIRE(rounds >= 1);
  CHECK(eventually([&] { return series(*controller, "gpuguard_audit_lease_rounds_total") >= rounds + 3; }));
  const auto requests = cluster.apiserver.requests().size();
  INFO(requests << " requests, " << lease_requests() << " of them for the Lease");
  CHECK(lease_requests() >= 4);
  // The pod and node informers (a list and a watch each) and the one kept connection of the Lease and
  // the reports: a handshake per request would be more than 100.
  CHECK(cluster.apiserver.handshakes() <= 6);

  // The API server closes every connection (a restart): the next request goes out on a new one, and a
  // new namespace's report is written as before.
  const std::size_t before = cluster.apiserver.handshakes();
  cluster.apiserver.cut_connections();
  cluster.apiserver.put("pods", pod("after-cut", "leaky", false));
  CHECK(eventually([&] { return cluster.apiserver.policy_reports().count("after-cut") == 1; }));
  CHECK(cluster.apiserver.handshakes() > before);
  CHECK(cluster.apiserver.lease(kLease)["spec"]["holderIdentity"] == "replica-a");
  CHECK(controller->terminate() == 0);
}

TEST_CASE("two replicas, one writer, and the other takes over when the leader dies") {
  Cluster cluster;
  auto a = cluster.controller("replica-a");
  REQUIRE(eventually([&] { return series(*a, "gpuguard_audit_leader") == 1; }));
  REQUIRE(eventually([&] { return cluster.apiserver.policy_reports().size() == 2; }));
  auto b = cluster.controller("replica-b");
  REQUIRE(eventually([&] { return http_request(b->port(), "GET", "/readyz").status == 200; }));
  // Two rounds of the Lease after the follower became ready, in which it did not take the Lease.
  const long long rounds = series(*b, "gpuguard_audit_lease_rounds_total");
  REQUIRE(rounds >= 0);
  REQUIRE(eventually([&] { return series(*b, "gpuguard_audit_lease_rounds_total") >= rounds + 2; }));
  CHECK(series(*b, "gpuguard_audit_leader") == 0);
  // The follower exports no view of the cluster, so a sum over the replicas counts each pod once.
  CHECK(series(*b, "gpuguard_audit_pods") == -1);
  CHECK(series(*a, "gpuguard_audit_pods") == 3);
  const auto writes = cluster.apiserver.report_writes();
  CHECK(writes == std::map<std::string, unsigned>{{"team-a", 1}, {"tools", 1}});

  // The leader dies without giving the Lease up: the other leads within the lease duration (4 s) and two
  // retry periods, and writes nothing that is already true.
  const auto killed = std::chrono::steady_clock::now();
  kill(a->pid(), SIGKILL);
  a->wait_exit(10s);
  REQUIRE(eventually([&] { return series(*b, "gpuguard_audit_leader") == 1; }, 20s));
  const auto took = std::chrono::steady_clock::now() - killed;
  CHECK(took < std::chrono::seconds(9));
  CHECK(cluster.apiserver.lease(kLease)["spec"]["holderIdentity"] == "replica-b");
  CHECK(cluster.apiserver.lease(kLease)["spec"]["leaseTransitions"] == 1);
  CHECK(eventually([&] { return series(*b, "gpuguard_audit_pods") == 3; }));
  // A new pod makes the new leader pass over every namespace: it writes the new one's report, and none of
  // those the old leader wrote, which are already true. Reports are written in namespace order, and this one
  // sorts last: a rewrite of the others would have come before it.
  cluster.apiserver.put("pods", pod("zz-late", "created-unpatched", false));
  CHECK(eventually([&] { return cluster.apiserver.report_writes()["zz-late"] == 1; }));
  auto after = cluster.apiserver.report_writes();
  after.erase("zz-late");
  CHECK(after == writes);
  CHECK(b->terminate() == 0);
}

TEST_CASE("without the PolicyReport API the metrics go on") {
  Cluster cluster;
  cluster.apiserver.serve_policy_reports(false);
  auto controller = cluster.controller("replica-a");
  REQUIRE(eventually([&] { return series(*controller, "gpuguard_audit_leader") == 1; }));
  CHECK(eventually([&] {
    return series(*controller,
                  "gpuguard_audit_exposed_pods{namespace=\"team-a\",reason=\"image-default\",result=\"fail\"}") == 1;
  }));
  CHECK(series(*controller, "gpuguard_audit_policy_reports_available") == 0);
  CHECK(cluster.apiserver.policy_reports().empty());
  CHECK(http_request(controller->port(), "GET", "/readyz").status == 200);
  CHECK(controller->terminate() == 0);
}

TEST_CASE("bad flags are refused") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"audit-controller --resource-claims maybe --apiserver-url https://127.0.0.1:1", "--resource-claims"},
      {"audit-controller --lease-duration 5 --renew-deadline 5 --apiserver-url https://127.0.0.1:1",
       "--lease-duration"},
      {"audit-controller --retry-period 0 --apiserver-url https://127.0.0.1:1", "--retry-period"},
      {"audit-controller --apiserver-url https://127.0.0.1:1 --lease-namespace ''", "--lease-namespace"},
      {"audit-controller --apiserver-url ftp://x --lease-namespace n", "ftp"},
      {"audit-controller --no-such-flag", "no-such-flag"}};
  for (const auto& [args, named] : cases) {
    const ExitResult result = run_webhook(args);
    INFO(args << ": " << result.output);
    CHECK(result.output.find(named) != std::string::npos);
    CHECK(result.status == 2);
  }
}

// As for the webhook: the stop signals are held from the start of serving, so the audit loop's, its
// informers' and the status port's threads block them, and only the server's signal loop is given them; on
// SIGTERM the Lease is still given up (the first case).
TEST_CASE("SIGTERM and SIGINT reach the signal loop's thread alone: every other thread blocks them") {
  Cluster cluster;
  auto controller = cluster.controller("replica-a");
  CHECK(eventually(
      [&] { return controller->main_thread_alone_takes(SIGTERM) && controller->main_thread_alone_takes(SIGINT); }));
  INFO(controller->threads().size() << " threads");
  CHECK(controller->threads().size() >= 3);  // beside the main thread: the audit loop, informers, a loop
  CHECK(controller->terminate() == 0);
}

// As for the webhook: at each limit on its threads the audit controller serves, or exits 1 saying why. Its
// audit loop's thread, refused, used to be joined all the same, which aborted it.
TEST_CASE("at each limit on its threads the audit controller serves, or exits 1 saying why") {
  Cluster cluster;
  const int served = serves_or_says_why_at_each_task_limit(cluster.controller_argv("replica-a"), 10);
  CHECK(served >= 1);
  CHECK(served < 10);
}

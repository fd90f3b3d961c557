// The in-cluster audit's pure parts. Its decision, reached through its caches as the informers feed them,
// must be the `audit` command's on every pod of tests/fixtures/audit (whose expected.json audit_test.sh
// holds the command to); its PolicyReports must be valid, stable and complete; its Lease must be taken,
// kept and lost as client-go's would be.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "audit/audit_stores.hpp"
#include "files.hpp"
#include "gpuguard/audit/policy_report.hpp"
#include "gpuguard/claims/claim_cache.hpp"
#include "gpuguard/kube/leader_election.hpp"
#include "gpuguard/policy/policy.hpp"
#include "stores.hpp"

using namespace gpuguard;
using nlohmann::json;

namespace {

std::shared_ptr<const policy::Policy> fixture_policy() {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(test::fixtures_dir() / "audit" / "policy")) {
    files[entry.path().filename().string()] = test::read_file(entry.path());
  }
  auto parsed = policy::parse_policy(files);
  REQUIRE(parsed.policy);
  return std::make_shared<const policy::Policy>(std::move(*parsed.policy));
}

// One exposure as expected.json writes it.
json exposure_json(const std::string& ns, const std::string& pod, const admission::Exposure& e) {
  return {{"namespace", ns}, {"pod", pod},         {"container", e.container}, {"list", e.list},
          {"door", e.door},  {"detail", e.detail}, {"webhook", e.webhook}};
}

// The pods of the fixture, listed into a PodStore as the informer lists them.
struct Loop {
  std::shared_ptr<const policy::Policy> policy = fixture_policy();
  claims::ClaimCache claims;
  audit::AuditMetrics metrics{"test"};
  audit::PodStore pods{[this] { return policy; }, &claims, metrics};
  audit::NodeStore nodes;

  Loop() {
    claims.load_list(test::read_json(test::fixtures_dir() / "audit" / "claims.json"));
    test::list(pods, test::read_json(test::fixtures_dir() / "audit" / "pods.json")["items"].get<std::vector<json>>());
  }
  std::vector<audit::Offender> offenders(std::size_t& count) {
    std::map<std::string, std::size_t> verdicts;
    return pods.offenders(nodes.snapshot(verdicts), count);
  }
};

json pod(const std::string& ns, const std::string& name, const std::string& node, json containers) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata",
           {{"namespace", ns}, {"name", name}, {"uid", "uid-" + name}, {"creationTimestamp", "2026-11-25T10:00:00Z"}}},
          {"spec", {{"nodeName", node}, {"containers", std::move(containers)}}},
          {"status", {{"phase", "Running"}}}};
}

json container(const std::string& name, json env = json::array()) {
  return {{"name", name}, {"image", "cuda"}, {"env", std::move(env)}};
}

json node(const std::string& name, const std::string& status, const std::string& reason) {
  json n = {{"apiVersion", "v1"},
            {"kind", "Node"},
            {"metadata", {{"name", name}}},
            {"status", {{"conditions", json::array()}}}};
  n["status"]["conditions"].push_back({{"type", "Ready"}, {"status", "True"}});
  if (!status.empty()) {
    n["status"]["conditions"].push_back({{"type", "GPUIsolation"}, {"status", status}, {"reason", reason}});
  }
  return n;
}

}  // namespace

TEST_CASE("audit loop: its decision is the audit command's on every fixture pod") {
  Loop loop;
  std::size_t count = 0;
  const auto offenders = loop.offenders(count);
  const json expected = test::read_json(test::fixtures_dir() / "audit" / "expected.json");
  CHECK(count == expected["pods"].get<std::size_t>());
  CHECK(offenders.size() == expected["exposedPods"].get<std::size_t>());
  json seen = json::array();
  for (const auto& o : offenders) {
    for (const auto& e : o.pod->exposures()) seen.push_back(exposure_json(o.pod->namespace_, o.pod->name, e));
    CHECK(o.from_node.empty());  // the fixture's nodes report nothing
  }
  // The store keeps pods by name, the command in list order: compare as sets of whole exposures.
  std::multiset<std::string> want, got;
  for (const json& e : expected["exposures"]) want.insert(e.dump());
  for (const json& e : seen) got.insert(e.dump());
  CHECK(got == want);
  CHECK(want.size() >= 30);  // the fixture is what it claims to be: many doors, many pods
}

TEST_CASE("audit loop: watch events add, change and remove a pod's exposures") {
  Loop loop;
  std::size_t count = 0;
  const std::size_t before = loop.offenders(count).size();
  const std::uint64_t changes = loop.pods.changes();
  const json fresh = pod("late", "created-while-webhook-down", "gpu-a", json::array({container("app")}));
  test::event(loop.pods, "ADDED", fresh);
  CHECK(loop.pods.changes() > changes);
  auto offenders = loop.offenders(count);
  REQUIRE(offenders.size() == before + 1);
  const auto added =
      std::find_if(offenders.begin(), offenders.end(), [](const auto& o) { return o.pod->namespace_ == "late"; });
  REQUIRE(added != offenders.end());
  CHECK(added->pod->uid == "uid-created-while-webhook-down");
  CHECK(added->pod->created == 1795600800);
  REQUIRE(added->pod->exposures().size() == 1);
  CHECK(added->pod->exposures()[0].door == "image default");

  // A second replica of the same shape shares the first one's findings: one copy for a whole workload.
  json replica = fresh;
  replica["metadata"]["name"] = "created-while-webhook-down-2";
  test::event(loop.pods, "ADDED", replica);
  offenders = loop.offenders(count);
  std::vector<const audit::PodFindings*> late;
  for (const auto& o : offenders) {
    if (o.pod->namespace_ == "late") late.push_back(o.pod->findings.get());
  }
  REQUIRE(late.size() == 2);
  CHECK(late[0] == late[1]);
  test::event(loop.pods, "DELETED", replica);

  json patched = fresh;
  patched["spec"]["containers"][0]["env"] = json::array({{{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "none"}}});
  test::event(loop.pods, "MODIFIED", patched);
  CHECK(loop.offenders(count).size() == before);
  test::event(loop.pods, "ADDED", fresh);
  test::event(loop.pods, "DELETED", fresh);
  CHECK(loop.offenders(count).size() == before);
}

TEST_CASE("audit loop: a node whose GPUIsolation is not True exposes its GPU-less containers") {
  claims::ClaimCache claims;
  audit::AuditMetrics metrics{"test"};
  auto policy = std::make_shared<const policy::Policy>();
  audit::PodStore pods{[&] { return policy; }, &claims, metrics};
  audit::NodeStore nodes;
  json none = json::array({{{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "none"}}});
  json gpu = container("train");
  gpu["resources"] = {{"limits", {{"nvidia.com/gpu", "1"}}}};
  test::list(pods, {pod("a", "on-leaky", "leaky", json::array({container("app", none), gpu})),
                    pod("a", "on-good", "good", json::array({container("app", none)})),
                    pod("a", "on-cpu", "cpu", json::array({container("app", none)}))});
  json unjudged = node("unjudged", "", "");  // GPUs (Node Feature Discovery says so), and no gpuguard plugin
  unjudged["metadata"]["labels"] = {{"feature.node.kubernetes.io/pci-10de.present", "true"}};
  json operator_node = node("operator", "", "");  // GPUs in its capacity, served by another plugin
  operator_node["status"]["capacity"] = {{"cpu", "8"}, {"nvidia.com/gpu", "2"}};
  test::list(nodes, {node("leaky", "False", "Leaks"), node("good", "True", "Honoured"), node("cpu", "", ""), unjudged,
                     operator_node});
  std::map<std::string, std::size_t> verdicts;
  std::size_t count = 0;
  const auto offenders = pods.offenders(nodes.snapshot(verdicts), count);
  CHECK(verdicts ==
        std::map<std::string, std::size_t>{{"honoured", 1}, {"leaks", 1}, {"no-gpu", 1}, {"unreported", 2}});
  REQUIRE(offenders.size() == 1);
  CHECK(offenders[0].pod->name == "on-leaky");
  CHECK(offenders[0].pod->exposures().empty());
  REQUIRE(offenders[0].from_node.size() == 1);  // the GPU container sees what it asked for
  CHECK(offenders[0].from_node[0].container == "app");
  CHECK(offenders[0].from_node[0].door == audit::kNodeDoor);
  CHECK(offenders[0].from_node[0].detail == "node leaky: GPUIsolation False (Leaks)");

  // A heartbeat is not a change; a new verdict is.
  const auto changes = nodes.changes();
  test::event(nodes, "MODIFIED", node("leaky", "False", "Leaks"));
  CHECK(nodes.changes() == changes);
  test::event(nodes, "MODIFIED", node("leaky", "True", "Honoured"));
  CHECK(nodes.changes() > changes);
  verdicts.clear();
  CHECK(pods.offenders(nodes.snapshot(verdicts), count).empty());
}

TEST_CASE("audit loop: a pod that cannot be read is counted and left out, never a crash") {
  claims::ClaimCache claims;
  audit::AuditMetrics metrics{"test"};
  auto policy = std::make_shared<const policy::Policy>();
  audit::PodStore pods{[&] { return policy; }, &claims, metrics};
  json bad = pod("a", "bad", "n", json::array({container("app")}));
  bad["spec"]["containers"][0]["env"] = "not a list";
  test::list(pods, {bad, pod("a", "good", "n", json::array({container("app")}))});
  pods.apply("ADDED", kube::PaddedText("[1, 2").view());
  std::size_t count = 0;
  CHECK(pods.offenders({}, count).size() == 1);
  CHECK(count == 1);
  CHECK(metrics.render(true).find("gpuguard_audit_unreadable_pods_total 2\n") != std::string::npos);
  // The good pod changed into one that cannot be read is no longer reported as it was.
  bad["metadata"]["name"] = "good";
  test::event(pods, "MODIFIED", bad);
  CHECK(pods.offenders({}, count).empty());
  CHECK(count == 0);
}

TEST_CASE("audit loop: a new policy applies once the pods are listed again under it") {
  claims::ClaimCache claims;
  audit::AuditMetrics metrics{"test"};
  auto policy = std::make_shared<const policy::Policy>();
  audit::PodStore pods{[&] { return policy; }, &claims, metrics};
  const json exempt_later = pod("tools", "p", "n", json::array({container("app")}));
  test::list(pods, {exempt_later});
  std::size_t count = 0;
  REQUIRE(pods.offenders({}, count).size() == 1);
  CHECK_FALSE(pods.offenders({}, count)[0].pod->exempt);
  const auto first = pods.judged_under();
  policy::Policy changed;
  changed.exempt_namespaces = {"tools"};
  policy = std::make_shared<const policy::Policy>(changed);
  CHECK(pods.judged_under() == first);  // until the list
  test::list(pods, {exempt_later});
  CHECK(pods.judged_under() == policy);
  const auto offenders = pods.offenders({}, count);
  REQUIRE(offenders.size() == 1);
  CHECK(offenders[0].pod->exempt);  // reported as exempt, not hidden
  CHECK(audit::result_of(*offenders[0].pod, policy->mode) == "skip");
}

TEST_CASE("audit loop: PolicyReports are valid, complete and the same bytes for the same findings") {
  Loop loop;
  std::size_t count = 0;
  const auto offenders = loop.offenders(count);
  std::map<std::string, std::vector<audit::PodExposures>> by_namespace;
  for (const auto& o : offenders) by_namespace[o.pod->namespace_].push_back({o.pod.get(), o.from_node});
  REQUIRE(by_namespace.size() > 3);
  std::size_t results = 0;
  for (const auto& [ns, entries] : by_namespace) {
    const audit::NamespaceReport report = audit::policy_report(ns, entries, policy::Mode::enforce);
    auto reversed = entries;
    std::reverse(reversed.begin(), reversed.end());
    CHECK(audit::policy_report(ns, reversed, policy::Mode::enforce).body == report.body);
    const json body = json::parse(report.body);
    CHECK(body["apiVersion"] == "wgpolicyk8s.io/v1alpha2");
    CHECK(body["kind"] == "PolicyReport");
    CHECK(body["metadata"]["name"] == "gpuguard-gpu-exposure");
    CHECK(body["metadata"]["namespace"] == ns);
    CHECK(body["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpuguard");
    CHECK(body["metadata"]["annotations"]["gpuguard.io/content-hash"] == report.hash);
    CHECK(body["results"].size() == entries.size());
    const json& summary = body["summary"];
    CHECK(summary["fail"].get<std::size_t>() + summary["warn"].get<std::size_t>() +
              summary["skip"].get<std::size_t>() ==
          entries.size());
    for (const json& r : body["results"]) {
      // What the CRD's schema requires: a policy, severity and result from its enums, whole timestamps.
      CHECK(r["policy"] == "gpu-isolation");
      CHECK(r["source"] == "gpuguard");
      CHECK(std::set<std::string>{"fail", "warn", "skip"}.count(r["result"].get<std::string>()) == 1);
      CHECK(r["severity"] == "high");
      CHECK(r["timestamp"].contains("seconds"));
      CHECK(r["timestamp"].contains("nanos"));
      REQUIRE(r["resources"].size() == 1);
      CHECK(r["resources"][0]["kind"] == "Pod");
      CHECK(r["resources"][0]["namespace"] == ns);
      CHECK_FALSE(r["properties"]["reasons"].get<std::string>().empty());
      for (const auto& [key, value] : r["properties"].items()) CHECK(value.is_string());
      ++results;
    }
    // Exempt namespaces' pods are reported, as skip.
    if (ns == "gpu-operator") CHECK(summary["skip"].get<std::size_t>() == entries.size());
  }
  CHECK(results == offenders.size());
}

TEST_CASE("audit loop: the report's result follows the policy's mode, and its size is bounded") {
  audit::PodAudit pod;
  pod.namespace_ = "a";
  pod.name = "p";
  pod.findings = std::make_shared<const audit::PodFindings>(
      audit::PodFindings{{{"app", "containers", "image default", "", "sets none"}}, {}});
  CHECK(audit::result_of(pod, policy::Mode::enforce) == "fail");
  CHECK(audit::result_of(pod, policy::Mode::strict) == "fail");
  CHECK(audit::result_of(pod, policy::Mode::audit) == "warn");
  CHECK(audit::result_of(pod, policy::Mode::off) == "warn");
  pod.mirror = true;
  CHECK(audit::result_of(pod, policy::Mode::enforce) == "skip");

  std::vector<audit::PodAudit> many(audit::kMaxResults + 5, pod);
  std::vector<audit::PodExposures> entries;
  for (std::size_t i = 0; i < many.size(); ++i) {
    many[i].name = std::to_string(i);  // (GCC 12 warns falsely on "p" + to_string here)
    many[i].findings = std::make_shared<const audit::PodFindings>(
        audit::PodFindings{{{"app", "containers", "image default", std::string(5000, 'x'), "sets none"}}, {}});
    entries.push_back({&many[i], {}});
  }
  const auto report = audit::policy_report("a", entries, policy::Mode::enforce);
  const json body = json::parse(report.body);
  CHECK(body["results"].size() == audit::kMaxResults);
  CHECK(body["summary"]["skip"] == audit::kMaxResults + 5);
  CHECK(body["results"][0]["message"].get<std::string>().size() <= 1024);
  CHECK(report.body.size() < std::size_t{1536} * 1024);
}

TEST_CASE("audit loop: RFC 3339 times as the API writes them") {
  CHECK(audit::unix_seconds("1970-01-01T00:00:00Z") == 0);
  CHECK(audit::unix_seconds("2026-11-25T10:00:00Z") == 1795600800);
  CHECK(audit::unix_seconds("2026-11-25T10:00:00.123456Z") == 1795600800);
  CHECK(audit::unix_seconds("2026-11-25T11:00:00+01:00") == 1795600800);
  CHECK(audit::unix_seconds("2000-02-29T00:00:00Z") == 951782400);
  for (const char* bad : {"", "2026-11-25", "2026-13-01T00:00:00Z", "2026-11-25T10:00:00", "2026-11-25T10:00:00.Z",
                          "2026-11-25T10:00:00Zjunk", "2026-11-25 10:00:00Z", "yyyy-11-25T10:00:00Z"}) {
    CHECK_FALSE(audit::unix_seconds(bad));
  }
}

// client-go's leaderelection, step by step, on made-up Leases and a made-up clock.
TEST_CASE("leader election: create, renew, wait, take over, lose, release") {
  using kube::LeaderElection;
  using Write = LeaderElection::Write;
  using std::chrono::seconds;
  const kube::LeaseTiming timing{seconds(15), seconds(10), seconds(2)};
  const LeaderElection::Clock::time_point t0{};
  LeaderElection a("a", timing), b("b", timing);

  // No Lease: create it, and lead at once.
  auto d = a.decide(std::nullopt, t0, "2026-11-25T10:00:00.000000Z");
  REQUIRE(d.write == Write::create);
  CHECK(d.record.holder == "a");
  CHECK(d.record.duration_seconds == 15);
  CHECK(d.record.transitions == 0);
  CHECK_FALSE(a.leading(t0));
  a.written(true, t0);
  CHECK(a.leading(t0 + seconds(9)));
  CHECK_FALSE(a.leading(t0 + seconds(10)));  // renew_deadline: stops before anyone may take over

  kube::LeaseRecord held = d.record;
  held.resource_version = "1";
  // Renewal keeps acquireTime and transitions, and updates on the resourceVersion read.
  d = a.decide(held, t0 + seconds(2), "2026-11-25T10:00:02.000000Z");
  REQUIRE(d.write == Write::update);
  CHECK(d.record.acquire_time == "2026-11-25T10:00:00.000000Z");
  CHECK(d.record.renew_time == "2026-11-25T10:00:02.000000Z");
  CHECK(d.record.transitions == 0);
  CHECK(d.record.resource_version == "1");
  a.written(true, t0 + seconds(2));
  CHECK(a.leading(t0 + seconds(11)));

  // Another candidate waits a whole lease duration from when it first saw the Lease, whatever its times say.
  held = d.record;
  held.resource_version = "2";
  held.renew_time = "1999-01-01T00:00:00.000000Z";
  CHECK(b.decide(held, t0 + seconds(3), "x").write == Write::none);
  CHECK(b.decide(held, t0 + seconds(17), "x").write == Write::none);
  CHECK_FALSE(b.leading(t0 + seconds(17)));
  // ...and each change it sees starts the wait again.
  kube::LeaseRecord renewed = held;
  renewed.renew_time = "1999-01-01T00:00:04.000000Z";
  renewed.resource_version = "3";
  CHECK(b.decide(renewed, t0 + seconds(17), "x").write == Write::none);
  CHECK(b.decide(renewed, t0 + seconds(31), "x").write == Write::none);
  d = b.decide(renewed, t0 + seconds(32), "2026-11-25T10:00:32.000000Z");
  REQUIRE(d.write == Write::update);
  CHECK(d.record.holder == "b");
  CHECK(d.record.transitions == 1);
  CHECK(d.record.acquire_time == "2026-11-25T10:00:32.000000Z");
  CHECK(d.record.resource_version == "3");
  b.written(false, t0 + seconds(32));  // a conflict: another got there first
  CHECK_FALSE(b.leading(t0 + seconds(32)));
  b.written(true, t0 + seconds(32));
  CHECK(b.leading(t0 + seconds(33)));

  // The old leader reads the Lease held by b: it stops leading at once, deadline or not.
  kube::LeaseRecord taken = d.record;
  taken.resource_version = "4";
  a.written(true, t0 + seconds(31));
  CHECK(a.leading(t0 + seconds(32)));
  CHECK(a.decide(taken, t0 + seconds(32), "x").write == Write::none);
  CHECK_FALSE(a.leading(t0 + seconds(32)));
  CHECK(a.holder() == "b");
  CHECK_FALSE(a.release(taken, "x"));  // nothing to give up

  // b gives it up: nobody holds it, for 1 s; a takes it at once, as a takeover.
  const auto released = b.release(taken, "2026-11-25T10:00:40.000000Z");
  REQUIRE(released);
  CHECK(released->holder.empty());
  CHECK(released->duration_seconds == 1);
  CHECK(released->transitions == 1);
  CHECK(released->resource_version == "4");
  CHECK_FALSE(b.leading(t0 + seconds(40)));
  kube::LeaseRecord free = *released;
  free.resource_version = "5";
  d = a.decide(free, t0 + seconds(40), "2026-11-25T10:00:40.500000Z");
  REQUIRE(d.write == Write::update);
  CHECK(d.record.holder == "a");
  CHECK(d.record.transitions == 2);
}

TEST_CASE("leader election: the Lease's JSON both ways, and MicroTime") {
  const kube::LeaseRecord record{"a_1", 15, "2026-11-25T10:00:00.000000Z", "2026-11-25T10:00:02.000000Z", 3, "77"};
  const std::string body = kube::lease_body("gpuguard-system", "gpuguard-audit", record);
  const json lease = json::parse(body);
  CHECK(lease["apiVersion"] == "coordination.k8s.io/v1");
  CHECK(lease["metadata"] ==
        json{{"name", "gpuguard-audit"}, {"namespace", "gpuguard-system"}, {"resourceVersion", "77"}});
  CHECK(lease["spec"]["leaseDurationSeconds"] == 15);
  const auto parsed = kube::parse_lease(body);
  REQUIRE(parsed);
  CHECK(parsed->holder == "a_1");
  CHECK(parsed->transitions == 3);
  CHECK(parsed->renew_time == "2026-11-25T10:00:02.000000Z");
  CHECK(parsed->resource_version == "77");
  CHECK_FALSE(kube::parse_lease("{\"kind\":\"Pod\"}"));
  CHECK_FALSE(kube::parse_lease("not json"));
  // Exactly six digits of fraction, in UTC: the API refuses any other.
  CHECK(kube::micro_time(std::chrono::system_clock::time_point(std::chrono::microseconds(1795600800123456LL))) ==
        "2026-11-25T10:00:00.123456Z");
  CHECK(kube::micro_time(std::chrono::system_clock::time_point(std::chrono::seconds(1795600800))) ==
        "2026-11-25T10:00:00.000000Z");
}

// The extender's pure parts: quantities, pod requests, the cluster state, filter and prioritize (driven by
// tests/fixtures/extender), and the Kubernetes client's pieces that need no network.
#include <catch2/catch.hpp>

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "files.hpp"
#include "gpuguard/extender/cluster_state.hpp"
#include "gpuguard/extender/scheduling.hpp"
#include "gpuguard/k8s/quantity.hpp"
#include "gpuguard/kube/informer.hpp"
#include "gpuguard/kube/json_object_splitter.hpp"
#include "stores.hpp"

using namespace gpuguard;
using nlohmann::json;

namespace {

json container(const json& requests, const json& limits = nullptr) {
  json resources = json::object();
  if (!requests.is_null()) resources["requests"] = requests;
  if (!limits.is_null()) resources["limits"] = limits;
  return {{"name", "c"}, {"resources", resources}};
}

json pod(const std::string& name, const std::string& node, const std::string& phase, const json& requests) {
  return {{"metadata", {{"name", name}, {"namespace", "default"}, {"uid", "uid-" + name}}},
          {"spec", {{"nodeName", node}, {"containers", json::array({container(requests)})}}},
          {"status", {{"phase", phase}}}};
}

json node(const std::string& name, const json& allocatable) {
  return {{"metadata", {{"name", name}}}, {"status", {{"allocatable", allocatable}, {"capacity", allocatable}}}};
}

policy::Policy policy_of(const json& table_case) {
  if (!table_case.contains("policy")) return {};
  auto parsed = policy::parse_policy(table_case["policy"].get<std::map<std::string, std::string>>());
  REQUIRE(parsed.policy);
  return *parsed.policy;
}

}  // namespace

TEST_CASE("quantity_count rounds a quantity up to a whole number, as Quantity.Value() does") {
  const std::vector<std::pair<std::string, std::optional<std::int64_t>>> table = {
      {"0", 0},
      {"1", 1},
      {"2", 2},
      {"+3", 3},
      {"007", 7},
      {"1.0", 1},
      {"1.5", 2},
      {"0.1", 1},
      {"1500m", 2},
      {"1000m", 1},
      {"1k", 1000},
      {"1Ki", 1024},
      {"2Mi", 2097152},
      {"1e3", 1000},
      {"1E2", 100},
      {"5e-1", 1},
      {"1e-100", 1},
      {"0e9", 0},
      {"1.25Ki", 1280},
      {"0.5Ki", 512},
      {"1n", 1},
      {"1G", 1000000000},
      {"4611686018427387904", 4611686018427387904},
      {"4611686018427387905", 4611686018427387904},
      {"8Ei", 4611686018427387904},
      {"1e100", 4611686018427387904},
      {"", std::nullopt},
      {"-1", std::nullopt},
      {"-0", 0},
      {"1.2.3", std::nullopt},
      {"1x", std::nullopt},
      {"gpu", std::nullopt},
      {".", std::nullopt},
      {"1 ", std::nullopt},
      {"1e", std::nullopt}};
  for (const auto& [text, expected] : table) {
    INFO("quantity '" << text << "'");
    CHECK(k8s::quantity_count(text) == expected);
  }
}

TEST_CASE("pod_requests counts extended resources the way the scheduler does") {
  SECTION("containers add up; a missing request falls back to the limit; cpu and memory are not kept") {
    json p = pod("p", "n1", "Running", {{"nvidia.com/gpu", "1"}, {"cpu", "2"}});
    p["spec"]["containers"].push_back(container(nullptr, {{"nvidia.com/gpu", 2}, {"memory", "1Gi"}}));
    CHECK(extender::pod_requests(p) == extender::ResourceCounts{{"nvidia.com/gpu", 3}});
  }
  SECTION("an init container alone counts when it asks for more than the app containers together") {
    json p = pod("p", "n1", "Running", {{"nvidia.com/gpu", "1"}});
    p["spec"]["initContainers"] = {container({{"nvidia.com/gpu", "4"}}), container({{"nvidia.com/gpu", "2"}})};
    CHECK(extender::pod_requests(p) == extender::ResourceCounts{{"nvidia.com/gpu", 4}});
  }
  SECTION("sidecars (restartPolicy Always) run beside the app containers and beside later init containers") {
    json p = pod("p", "n1", "Running", {{"nvidia.com/gpu", "1"}});
    json sidecar = container({{"nvidia.com/gpu", "1"}});
    sidecar["restartPolicy"] = "Always";
    p["spec"]["initContainers"] = {sidecar, container({{"nvidia.com/gpu", "2"}})};
    // app 1 + sidecar 1 = 2, init 2 + sidecar 1 = 3: the peak is 3.
    CHECK(extender::pod_requests(p) == extender::ResourceCounts{{"nvidia.com/gpu", 3}});
  }
  SECTION("a zero request and a pod without spec hold nothing") {
    CHECK(extender::pod_requests(pod("p", "n1", "Running", {{"nvidia.com/gpu", "0"}})).empty());
    CHECK(extender::pod_requests(json{{"metadata", json::object()}}).empty());
    CHECK(extender::pod_requests(json("not an object")).empty());
  }
}

TEST_CASE("decode_pod and decode_node read from text what the DOM readers read") {
  json p = pod("p", "n1", "Running", {{"nvidia.com/gpu", "1"}});
  json sidecar = container({{"nvidia.com/gpu", "1"}}, {{"nvidia.com/gpu", "1"}});
  sidecar["restartPolicy"] = "Always";
  sidecar["env"] = json::array({{{"name", "BIG"}, {"value", std::string(1000, 'x')}}});
  p["spec"]["initContainers"] = {sidecar, container(nullptr, {{"example.com/fpga", 2.5}}), "not a container"};
  p["metadata"]["annotations"] = {{"a", std::string(1000, 'y')}};
  const auto decoded = extender::decode_pod(kube::PaddedText(p.dump()).view());
  REQUIRE(decoded);
  CHECK(decoded->key == "uid-p");
  CHECK(decoded->node == "n1");
  CHECK(decoded->occupies_node);
  CHECK(decoded->requests == extender::pod_requests(p));
  CHECK(decoded->requests == extender::ResourceCounts{{"nvidia.com/gpu", 2}, {"example.com/fpga", 3}});

  SECTION("the last of duplicate keys wins, as in a DOM") {
    const std::string text =
        R"({"metadata":{"uid":"x"},"spec":{"nodeName":"n1","containers":[{"resources":{"limits":{"a/b":"3","a/b":"0"}},)"
        R"("resources":{"requests":{"c/d":"1"}}}]},"spec":{"nodeName":"n2","containers":[{"resources":)"
        R"({"requests":{"e/f":"2","e/f":"4"}}}]},"status":{"phase":"Failed"},"status":{"phase":"Running"}})";
    const auto twice = extender::decode_pod(kube::PaddedText(text).view());
    REQUIRE(twice);
    CHECK(twice->node == "n2");
    CHECK(twice->occupies_node);
    CHECK(twice->requests == extender::pod_requests(json::parse(text)));
    CHECK(twice->requests == extender::ResourceCounts{{"e/f", 4}});
  }
  SECTION("numbers: negative, fractional, beyond 64 bits; a pod without uid is keyed by namespace/name") {
    const std::string text =
        R"({"metadata":{"name":"n","namespace":"ns"},"status":{"phase":"Succeeded"},"spec":{"containers":[)"
        R"({"resources":{"requests":{"a/b":-3,"c/d":0.5,"e/f":123456789012345678901234567890,"g/h":-1e30}}}]}})";
    const auto odd = extender::decode_pod(kube::PaddedText(text).view());
    REQUIRE(odd);
    CHECK(odd->key == "ns/n");
    CHECK_FALSE(odd->occupies_node);
    CHECK(odd->requests == extender::pod_requests(json::parse(text)));
    CHECK(odd->requests == extender::ResourceCounts{{"c/d", 1}, {"e/f", std::int64_t{1} << 40}});
  }
  SECTION("not an object: nothing") {
    CHECK_FALSE(extender::decode_pod(kube::PaddedText("[1]").view()));
    CHECK_FALSE(extender::decode_pod(kube::PaddedText("{\"a\":").view()));
    CHECK_FALSE(extender::decode_node(kube::PaddedText("\"n1\"").view()));
  }
  const json n = node("n1", {{"nvidia.com/gpu", "8"}, {"cpu", "64"}});
  const auto capacity = extender::decode_node(kube::PaddedText(n.dump()).view());
  REQUIRE(capacity);
  CHECK(capacity->name == "n1");
  CHECK(capacity->allocatable == extender::node_allocatable(n));
}

TEST_CASE("ClusterState follows lists and watch events") {
  extender::ClusterState state;
  test::list(state.nodes(),
             {node("n1", {{"nvidia.com/gpu", "2"}, {"cpu", "8"}}), node("n2", {{"nvidia.com/gpu", "2"}})});
  test::list(state.pods(),
             {pod("a", "n1", "Running", {{"nvidia.com/gpu", "1"}}), pod("cpu-only", "n1", "Running", {{"cpu", "1"}}),
              pod("unbound", "", "Pending", {{"nvidia.com/gpu", "1"}})});
  CHECK(state.node_count() == 2);
  CHECK(state.pod_count() == 1);  // only bound pods holding extended resources are kept
  CHECK(state.node("n1").allocatable == extender::ResourceCounts{{"nvidia.com/gpu", 2}});
  CHECK(state.node("n1").allocated == extender::ResourceCounts{{"nvidia.com/gpu", 1}});

  SECTION("a pod bound later (MODIFIED with nodeName) starts to count, on its node") {
    test::event(state.pods(), "MODIFIED", pod("unbound", "n2", "Pending", {{"nvidia.com/gpu", "1"}}));
    CHECK(state.node("n2").allocated == extender::ResourceCounts{{"nvidia.com/gpu", 1}});
  }
  SECTION("a pod that finishes or is deleted stops counting; a repeated event changes nothing") {
    test::event(state.pods(), "MODIFIED", pod("a", "n1", "Running", {{"nvidia.com/gpu", "1"}}));
    CHECK(state.node("n1").allocated == extender::ResourceCounts{{"nvidia.com/gpu", 1}});
    test::event(state.pods(), "MODIFIED", pod("a", "n1", "Succeeded", {{"nvidia.com/gpu", "1"}}));
    CHECK(state.node("n1").allocated.empty());
    test::event(state.pods(), "ADDED", pod("b", "n1", "Running", {{"nvidia.com/gpu", "2"}}));
    test::event(state.pods(), "DELETED", pod("b", "n1", "Running", {{"nvidia.com/gpu", "2"}}));
    test::event(state.pods(), "DELETED", pod("b", "n1", "Running", {{"nvidia.com/gpu", "2"}}));
    CHECK(state.node("n1").allocated.empty());
    CHECK(state.pod_count() == 0);
  }
  SECTION("a re-list replaces everything: what was missed in between is gone") {
    test::list(state.pods(), {pod("c", "n2", "Running", {{"nvidia.com/gpu", "2"}})});
    CHECK(state.node("n1").allocated.empty());
    CHECK(state.node("n2").allocated == extender::ResourceCounts{{"nvidia.com/gpu", 2}});
  }
  SECTION("absurd quantities are capped at 2^40 each, so sums never overflow and deletions restore them") {
    const extender::ResourceCounts before = state.node("n2").allocated;
    test::event(state.pods(), "ADDED", pod("huge", "n2", "Running", {{"nvidia.com/gpu", "9e18"}}));
    test::event(state.pods(), "ADDED", pod("huger", "n2", "Running", {{"nvidia.com/gpu", "4611686018427387904"}}));
    CHECK(state.node("n2").allocated == extender::ResourceCounts{{"nvidia.com/gpu", std::int64_t{2} << 40}});
    test::event(state.pods(), "DELETED", pod("huge", "n2", "Running", {}));
    test::event(state.pods(), "DELETED", pod("huger", "n2", "Running", {}));
    CHECK(state.node("n2").allocated == before);
  }
  SECTION("a uid listed twice counts once, as the later copy says") {
    test::list(state.pods(), {pod("e", "n1", "Running", {{"nvidia.com/gpu", "1"}}),
                              pod("e", "n2", "Running", {{"nvidia.com/gpu", "2"}})});
    CHECK(state.pod_count() == 1);
    CHECK(state.node("n1").allocated.empty());
    CHECK(state.node("n2").allocated == extender::ResourceCounts{{"nvidia.com/gpu", 2}});
  }
  SECTION("a list that fails partway changes nothing") {
    state.pods().list_begin();
    state.pods().list_item(kube::PaddedText(pod("d", "n2", "Running", {{"nvidia.com/gpu", "2"}}).dump()).view());
    state.pods().list_end(false);
    CHECK(state.node("n2").allocated.empty());
    CHECK(state.node("n1").allocated == extender::ResourceCounts{{"nvidia.com/gpu", 1}});
    CHECK(state.pod_count() == 1);
  }
  SECTION("a re-list of nodes forgets the nodes it lacks; their pods still count until they go") {
    test::list(state.nodes(), {node("n2", {{"nvidia.com/gpu", "4"}})});
    CHECK(state.node_count() == 1);
    CHECK_FALSE(state.node("n1").known);
    CHECK(state.node("n1").allocated == extender::ResourceCounts{{"nvidia.com/gpu", 1}});
    CHECK(state.node("n2").allocatable == extender::ResourceCounts{{"nvidia.com/gpu", 4}});
    test::list(state.pods(), {});
    CHECK(state.node("n1").allocated.empty());
  }
  SECTION("node events") {
    test::event(state.nodes(), "MODIFIED", node("n1", {{"nvidia.com/gpu", "1"}}));
    CHECK(state.node("n1").allocatable == extender::ResourceCounts{{"nvidia.com/gpu", 1}});
    test::event(state.nodes(), "DELETED", node("n1", {}));
    CHECK_FALSE(state.node("n1").known);
    CHECK(state.node("n2").known);
  }
}

TEST_CASE("NameTable: a name keeps its number while referenced, and the number is reused once it is free") {
  extender::NameTable names;
  const std::uint32_t a = names.acquire("node-a");
  CHECK(names.acquire("node-a") == a);
  const std::uint32_t b = names.acquire("node-b");
  CHECK(b != a);
  CHECK_FALSE(names.release(a));
  CHECK(names.find("node-a") == a);
  CHECK(names.release(a));
  CHECK_FALSE(names.find("node-a"));
  const std::uint32_t c = names.acquire("node-c");
  CHECK(c == a);
  CHECK(names.name(c) == "node-c");
  CHECK(names.name(b) == "node-b");
  CHECK(names.capacity() == 2);
}

TEST_CASE("ClusterState reports a node when its allocatable becomes unreadable, and a pod when first kept") {
  std::vector<std::string> reports;
  extender::ClusterState state([&](std::string_view resource, std::string_view name, std::string_view why) {
    reports.push_back(std::string(resource) + " " + std::string(name) + ": " + std::string(why));
  });
  test::list(state.nodes(), {node("n1", {{"nvidia.com/gpu", "8"}})});
  CHECK_FALSE(state.node("n1").unreadable.any());
  test::event(state.nodes(), "MODIFIED", node("n1", {{"nvidia.com/gpu", "-1"}}));
  test::event(state.nodes(), "MODIFIED", node("n1", {{"nvidia.com/gpu", "-1"}}));  // a heartbeat: no new report
  CHECK(state.node("n1").unreadable.any());
  test::event(state.nodes(), "MODIFIED", node("n1", {{"nvidia.com/gpu", "8"}}));
  CHECK_FALSE(state.node("n1").unreadable.any());
  test::event(state.nodes(), "MODIFIED", node("n1", {{"example.com/x", json::array()}}));
  test::event(state.pods(), "ADDED", pod("p", "n1", "Running", {{"nvidia.com/gpu", "1e19"}}));
  test::event(state.pods(), "MODIFIED", pod("p", "n1", "Running", {{"nvidia.com/gpu", "1e19"}}));
  test::event(state.nodes(), "DELETED", node("n1", {}));
  test::list(state.nodes(), {node("n1", {{"nvidia.com/gpu", "1e19"}})});  // unlisted, then seen again
  CHECK(reports == std::vector<std::string>{"nodes n1: nvidia.com/gpu: not a non-negative quantity",
                                            "nodes n1: example.com/x: not a quantity",
                                            "pods uid-p: nvidia.com/gpu: beyond the 2^40 the extender counts",
                                            "nodes n1: nvidia.com/gpu: beyond the 2^40 the extender counts"});
  CHECK(state.unreadable_count("nodes") == 3);
  CHECK(state.unreadable_count("pods") == 1);
}

TEST_CASE("a list cut short and retried reports its unreadable pods once, and names at most 64 of them") {
  std::vector<std::string> reports;
  extender::ClusterState state([&](std::string_view resource, std::string_view name, std::string_view why) {
    reports.push_back(std::string(resource) + " " + std::string(name) + ": " + std::string(why));
  });
  const std::vector<json> pods = {pod("a", "n1", "Running", {{"nvidia.com/gpu", "1e30"}}),
                                  pod("b", "n1", "Running", {{"nvidia.com/gpu", "2"}}),
                                  pod("c", "n1", "Running", {{"nvidia.com/gpu", "9223372036854775807"}})};
  state.pods().list_begin();  // a list whose continue token expired after its first page: nothing reported
  for (const json& p : pods) state.pods().list_item(kube::PaddedText(p.dump()).view());
  state.pods().list_end(false);
  CHECK(reports.empty());
  test::list(state.pods(), pods);  // the retry, complete
  CHECK(reports == std::vector<std::string>{"pods uid-a: nvidia.com/gpu: beyond the 2^40 the extender counts",
                                            "pods uid-c: nvidia.com/gpu: beyond the 2^40 the extender counts"});
  test::list(state.pods(), pods);  // a re-list: already known
  CHECK(reports.size() == 2);

  std::vector<json> many(70);
  for (std::size_t i = 0; i < many.size(); ++i) {
    many[i] = pod(std::string("q").append(std::to_string(i)), "n1", "Running", {{"nvidia.com/gpu", "1e30"}});
  }
  test::list(state.pods(), many);
  REQUIRE(reports.size() == 2 + 64 + 1);
  CHECK(reports.back() == "pods : 6 more pods in this list, not named one by one");
  CHECK(state.unreadable_count("pods") == 72);
}

TEST_CASE("filter and prioritize: the fixture table (tests/fixtures/extender/cases.json)") {
  const json table = test::read_json(test::fixtures_dir() / "extender" / "cases.json");
  REQUIRE(table.size() >= 10);
  for (const json& c : table) {
    const std::string name = c["name"];
    DYNAMIC_SECTION(name) {
      const policy::Policy policy = policy_of(c);
      json reported = json::object();
      extender::ClusterState state([&](std::string_view resource, std::string_view object, std::string_view why) {
        CHECK_FALSE(reported[std::string(resource)].contains(std::string(object)));  // once each
        reported[std::string(resource)][std::string(object)] = why;
      });
      std::vector<json> nodes, pods;
      for (const auto& [node_name, allocatable] : c["nodes"].items()) nodes.push_back(node(node_name, allocatable));
      for (const json& p : c["pods"]) pods.push_back(pod(p["name"], p["node"], p["phase"], p["requests"]));
      for (int round = 0; round < 2; ++round) {  // a relist reports nothing again
        test::list(state.nodes(), nodes);
        test::list(state.pods(), pods);
      }
      CHECK(reported == c.value("unreadable", json::object()));

      json args = {{"Pod", pod("incoming", "", "Pending", c["request"])}, {"Nodes", nullptr}, {"NodeNames", nullptr}};
      const bool full_nodes = c.value("form", "NodeNames") == "Nodes";
      const json sent = c.value("sentNodes", c["nodes"]);
      if (full_nodes) {
        args["Nodes"] = {{"items", json::array()}};
        for (const json& n : c["nodeNames"]) args["Nodes"]["items"].push_back(node(n, sent[n.get<std::string>()]));
      } else {
        args["NodeNames"] = c["nodeNames"];
      }

      const extender::VerbResult filtered = extender::filter(args.dump(), state, policy, true);
      REQUIRE(filtered.status == 200);
      const json result = json::parse(filtered.body);
      CHECK(result["Error"] == "");
      CHECK(result["FailedNodes"] == c["failed"]);
      CHECK(result["FailedAndUnresolvableNodes"] == json::object());
      if (full_nodes) {
        CHECK(result["NodeNames"].is_null());
        json expected_items = json::array();
        for (const json& n : c["passing"]) expected_items.push_back(node(n, sent[n.get<std::string>()]));
        CHECK(result["Nodes"]["items"] == expected_items);
      } else {
        CHECK(result["Nodes"].is_null());
        CHECK(result["NodeNames"] == c["passing"]);
      }

      const extender::VerbResult prioritized = extender::prioritize(args.dump(), state, policy, true);
      REQUIRE(prioritized.status == 200);
      json expected_scores = json::array();
      for (const json& n : c["nodeNames"])
        expected_scores.push_back({{"Host", n}, {"Score", c["scores"][n.get<std::string>()]}});
      CHECK(json::parse(prioritized.body) == expected_scores);
    }
  }
}

TEST_CASE("filter and prioritize refuse malformed ExtenderArgs with the reason (fixtures/extender/invalid.json)") {
  const json table = test::read_json(test::fixtures_dir() / "extender" / "invalid.json");
  extender::ClusterState state;
  for (const json& c : table) {
    const std::string body = c["body"];
    INFO("body: " << body);
    for (auto verb : {&extender::filter, &extender::prioritize}) {
      const extender::VerbResult result = verb(body, state, policy::Policy{}, true);
      CHECK(result.status == 400);
      CHECK(result.body == c["reason"].get<std::string>());
    }
  }
}

TEST_CASE("before the first list, filter errs for GPU pods only and prioritize is neutral") {
  extender::ClusterState state;
  const json gpu_pod = pod("p", "", "Pending", {{"nvidia.com/gpu", "1"}});
  const json args = {{"Pod", gpu_pod}, {"NodeNames", {"n1"}}};
  const json filtered = json::parse(extender::filter(args.dump(), state, {}, false).body);
  CHECK_THAT(filtered["Error"].get<std::string>(), Catch::Contains("has not listed pods and nodes"));
  CHECK(json::parse(extender::prioritize(args.dump(), state, {}, false).body) ==
        json::parse(R"([{"Host":"n1","Score":0}])"));
  const json plain = {{"Pod", pod("p", "", "Pending", json::object())}, {"NodeNames", {"n1"}}};
  CHECK(json::parse(extender::filter(plain.dump(), state, {}, false).body)["NodeNames"] == json::array({"n1"}));
}

TEST_CASE("JsonObjectSplitter finds whole objects in a watch stream, however it is chunked") {
  const std::string stream =
      "{\"type\":\"ADDED\",\"object\":{\"s\":\"a } in a string, an escaped \\\" quote and a \\\\\"}}\n"
      "{\"type\":\"BOOKMARK\",\"object\":{\"a\":[1,{\"b\":[]}]}}{\"type\":\"DELETED\",\"object\":{}}\r\n";
  for (std::size_t step : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{64}, stream.size()}) {
    INFO("chunks of " << step);
    kube::JsonObjectSplitter splitter;
    std::vector<json> objects;
    for (std::size_t i = 0; i < stream.size(); i += step) {
      REQUIRE(splitter.feed(std::string_view(stream).substr(i, step),
                            [&](std::string_view text) { objects.push_back(json::parse(text)); }));
    }
    REQUIRE(objects.size() == 3);
    CHECK(objects[0]["object"]["s"] == "a } in a string, an escaped \" quote and a \\");
    CHECK(objects[1]["type"] == "BOOKMARK");
    CHECK(objects[2]["type"] == "DELETED");
    CHECK(splitter.buffered() == 0);
  }
  kube::JsonObjectSplitter broken;
  CHECK_FALSE(broken.feed("[1]", [](std::string_view) {}));
  kube::JsonObjectSplitter closing;
  CHECK_FALSE(closing.feed("{}}", [](std::string_view) {}));
  kube::JsonObjectSplitter mismatched;  // found by fuzz/extender_fuzz.cpp
  CHECK_FALSE(mismatched.feed(R"({"Pod": {"spec": {}}, "NodeName\ud800"]})", [](std::string_view) {}));
}

TEST_CASE("ApiServer::in_cluster reads the service environment and the service account's files") {
  setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "6443", 1);
  const auto server = kube::ApiServer::in_cluster();
  CHECK(server.url() == "https://[fd00::1]:6443");
  CHECK(server.token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token");
  CHECK(server.ca_file == "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt");
  unsetenv("KUBERNETES_SERVICE_PORT");
  CHECK_THROWS_WITH(kube::ApiServer::in_cluster(), Catch::Contains("KUBERNETES_SERVICE_HOST/PORT are not set"));
  unsetenv("KUBERNETES_SERVICE_HOST");
}

TEST_CASE("ApiServer::from_url takes https URLs only and names what is wrong") {
  const auto plain = kube::ApiServer::from_url("https://kube.example:6443");
  CHECK(plain.host == "kube.example");
  CHECK(plain.port == "6443");
  CHECK(plain.url() == "https://kube.example:6443");
  const auto v6 = kube::ApiServer::from_url("https://[fd00::1]/k8s/clusters/c-1/");
  CHECK(v6.host == "fd00::1");
  CHECK(v6.port == "443");
  CHECK(v6.path_prefix == "/k8s/clusters/c-1");
  for (const char* bad : {"http://kube:6443", "kube:6443", "https://", "https://:443", "https://kube:0",
                          "https://kube:99999", "https://kube:port", "https://[fd00::1", "https://[fd00::1]x"}) {
    INFO(bad);
    CHECK_THROWS_AS(kube::ApiServer::from_url(bad), std::invalid_argument);
  }
}

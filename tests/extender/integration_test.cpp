// The real gpuguard-scheduler-extender against a fake Kubernetes API server (fake_apiserver.hpp), over
// real TLS to the apiserver and plain HTTP (or TLS) from the "scheduler" side.
#include <catch2/catch.hpp>

#include <csignal>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <nlohmann/json.hpp>

#include "eventually.hpp"
#include "fake_apiserver.hpp"
#include "files.hpp"
#include "http_client.hpp"
#include "promtool.hpp"
#include "server_process.hpp"
#include "tls_client.hpp"

using namespace gpuguard::test;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json gpu_node(const std::string& name, int gpus) {
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata", {{"name", name}, {"uid", "node-" + name}}},
          {"status", {{"allocatable", {{"cpu", "16"}, {"nvidia.com/gpu", std::to_string(gpus)}}}}}};
}

json gpu_pod(const std::string& name, int gpus, const std::string& node = "") {
  json limits = {{"cpu", "1"}};
  if (gpus > 0) limits["nvidia.com/gpu"] = std::to_string(gpus);
  json spec = {{"containers",
                {{{"name", "main"}, {"image", "cuda"}, {"resources", {{"limits", limits}, {"requests", limits}}}}}}};
  if (!node.empty()) spec["nodeName"] = node;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"uid", "pod-" + name}}},
          {"spec", spec},
          {"status", {{"phase", node.empty() ? "Pending" : "Running"}}}};
}

// A token file the test can rotate the way the kubelet does: a new file renamed over the old one.
struct TokenFile {
  fs::path path;
  explicit TokenFile(const std::string& token) {
    path = fs::temp_directory_path() / (std::string("gpuguard-token-").append(std::to_string(getpid())) +
                                        std::string("-").append(std::to_string(rand())));
    write(token);
  }
  ~TokenFile() { fs::remove(path); }
  void write(const std::string& token) const {
    const fs::path next = path.string() + ".next";
    std::ofstream(next) << token << "\n";
    fs::rename(next, path);
  }
};

struct Extender {
  FakeApiserver& apiserver;
  ServerProcess process;
  Extender(FakeApiserver& fake, const TokenFile& token, std::vector<std::string> extra = {})
      : apiserver(fake), process(argv(fake, token, std::move(extra))) {}

  static std::vector<std::string> argv(FakeApiserver& fake, const TokenFile& token, std::vector<std::string> extra) {
    std::vector<std::string> args = {GPUGUARD_EXTENDER_BIN,
                                     "--apiserver-url",
                                     fake.url(),
                                     "--token-file",
                                     token.path.string(),
                                     "--ca-file",
                                     certs_dir() + "/ca.crt",
                                     "--threads",
                                     "2",
                                     "--shutdown-delay",
                                     "0.1"};
    if (std::find(extra.begin(), extra.end(), "--tls-cert-file") == extra.end()) {
      args.insert(args.end(), {"--insecure-listen-address", "127.0.0.1:0"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  unsigned short port() const { return process.port(); }
  Reply post(const std::string& verb, const json& args) const {
    return http_request(port(), "POST", "/scheduler/" + verb, args.dump());
  }
  bool ready() const { return http_request(port(), "GET", "/readyz").status == 200; }
  std::string metrics() const { return http_request(port(), "GET", "/metrics").body; }
  bool metrics_show(const std::string& line) const { return metrics().find(line) != std::string::npos; }
};

json names_args(const json& pod, const std::vector<std::string>& nodes) {
  return {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", nodes}};
}

std::map<std::string, int> scores_of(const Reply& reply) {
  REQUIRE(reply.status == 200);
  std::map<std::string, int> scores;
  for (const json& entry : json::parse(reply.body)) scores[entry["Host"]] = entry["Score"];
  return scores;
}

// What kube-scheduler does with the extender alone: filter, then the best score among the nodes that
// passed; a tie goes to the first candidate.
std::string schedule(const Extender& extender, const json& pod, const std::vector<std::string>& candidates) {
  const Reply filtered = extender.post("filter", names_args(pod, candidates));
  REQUIRE(filtered.status == 200);
  const json result = json::parse(filtered.body);
  REQUIRE(result["Error"] == "");
  const std::vector<std::string> passing = result["NodeNames"];
  if (passing.empty()) return "";
  const auto scores = scores_of(extender.post("prioritize", names_args(pod, passing)));
  std::string best = passing.front();
  for (const auto& node : passing) {
    if (scores.at(node) > scores.at(best)) best = node;
  }
  return best;
}

// Binds the pod through the apiserver, then waits until the extender's cache has it.
void bind_pod(FakeApiserver& apiserver, const Extender& extender, const std::string& name, int gpus,
              const std::string& node, std::size_t cached_pods) {
  apiserver.put("pods", gpu_pod(name, gpus, node));
  REQUIRE(eventually([&] {
    return extender.metrics_show(std::string("gpuguard_extender_cached_objects{resource=\"pods\"} ")
                                     .append(std::to_string(cached_pods))
                                     .append("\n"));
  }));
}

struct Cluster {
  TokenFile token{"token-1"};
  FakeApiserver apiserver{"token-1"};
  Cluster() {
    apiserver.put("nodes", gpu_node("n1", 2));
    apiserver.put("nodes", gpu_node("n2", 2));
    apiserver.put("nodes", gpu_node("cpu-only", 0));
  }
};

}  // namespace

TEST_CASE("2 x 2 GPUs: pods asking 1, 1 and 2 GPUs all find a place, because the first two are packed") {
  Cluster cluster;
  Extender extender(cluster.apiserver, cluster.token);
  REQUIRE(eventually([&] { return extender.ready(); }));

  // A tie on two empty nodes: the first candidate wins.
  const std::string first = schedule(extender, gpu_pod("one", 1), {"n1", "n2"});
  CHECK(first == "n1");
  bind_pod(cluster.apiserver, extender, "one", 1, first, 1);

  // The emptier node comes first among the candidates, as a spreading scheduler would rank it; the
  // extender's scores still send the pod next to the first one.
  CHECK(scores_of(extender.post("prioritize", names_args(gpu_pod("two", 1), {"n2", "n1"}))) ==
        std::map<std::string, int>{{"n1", 10}, {"n2", 5}});
  const std::string second = schedule(extender, gpu_pod("two", 1), {"n2", "n1"});
  CHECK(second == "n1");
  bind_pod(cluster.apiserver, extender, "two", 1, second, 2);

  const Reply filtered = extender.post("filter", names_args(gpu_pod("three", 2), {"n1", "n2", "cpu-only"}));
  REQUIRE(filtered.status == 200);
  const json result = json::parse(filtered.body);
  CHECK(result["NodeNames"] == json::array({"n2"}));
  CHECK(result["FailedNodes"]["n1"] ==
        "insufficient nvidia.com/gpu: pod requests 2, node has 0 free (2 allocatable, 2 allocated)");
  CHECK(result["FailedNodes"]["cpu-only"] ==
        "insufficient nvidia.com/gpu: pod requests 2, node has 0 free (0 allocatable, 0 allocated)");
  CHECK(schedule(extender, gpu_pod("three", 2), {"n1", "n2", "cpu-only"}) == "n2");

  // The same through full Node objects (an extender without nodeCacheCapable).
  const json full = {{"Pod", gpu_pod("three", 2)}, {"Nodes", {{"items", {gpu_node("n1", 2), gpu_node("n2", 2)}}}}};
  const json by_objects = json::parse(extender.post("filter", full).body);
  CHECK(by_objects["Nodes"]["items"] == json::array({gpu_node("n2", 2)}));
  CHECK(scores_of(extender.post("prioritize", full)) == std::map<std::string, int>{{"n1", 10}, {"n2", 10}});

  // A pod without GPUs is not the extender's business: everything passes, nothing is preferred.
  const json plain = json::parse(extender.post("filter", names_args(gpu_pod("web", 0), {"n1", "n2", "cpu-only"})).body);
  CHECK(plain["NodeNames"] == json::array({"n1", "n2", "cpu-only"}));
  CHECK(scores_of(extender.post("prioritize", names_args(gpu_pod("web", 0), {"n1", "cpu-only"}))) ==
        std::map<std::string, int>{{"n1", 0}, {"cpu-only", 0}});

  // The list asked the apiserver for bound, unfinished pods only.
  bool selector_sent = false;
  for (const auto& request : cluster.apiserver.requests()) {
    if (request.path == "/api/v1/pods" &&
        request.query.find(
            "fieldSelector=spec.nodeName%21%3D%2Cstatus.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed") !=
            std::string::npos) {
      selector_sent = true;
    }
  }
  CHECK(selector_sent);

  // Finishing frees the GPUs (the apiserver would send DELETED for a selector-filtered watch; a
  // MODIFIED with the phase is handled the same way).
  json done = gpu_pod("one", 1, "n1");
  done["status"]["phase"] = "Succeeded";
  cluster.apiserver.put("pods", done);
  CHECK(eventually([&] { return extender.metrics_show("gpuguard_extender_cached_objects{resource=\"pods\"} 1\n"); }));
  CHECK(extender.process.terminate() == 0);
}

TEST_CASE("a large collection is listed in pages of 500, and every page counts") {
  Cluster cluster;
  cluster.apiserver.put("nodes", gpu_node("big", 2000));
  for (int i = 0; i < 1200; ++i)
    cluster.apiserver.put("pods", gpu_pod(std::string("p").append(std::to_string(i)), 1, "big"));
  Extender extender(cluster.apiserver, cluster.token);
  REQUIRE(eventually([&] { return extender.ready(); }));
  CHECK(extender.metrics_show("gpuguard_extender_cached_objects{resource=\"pods\"} 1200\n"));
  std::vector<std::string> pages;
  for (const auto& request : cluster.apiserver.requests()) {
    if (request.path == "/api/v1/pods" && request.query.find("watch=1") == std::string::npos)
      pages.push_back(request.query);
  }
  REQUIRE(pages.size() == 3);
  CHECK(pages[0].find("limit=500") != std::string::npos);
  CHECK(pages[1].find("continue=500") != std::string::npos);
  CHECK(pages[2].find("continue=1000") != std::string::npos);
  // (1 + 1200) / 2000 x 10 = 6.005
  CHECK(scores_of(extender.post("prioritize", names_args(gpu_pod("x", 1), {"big"}))).at("big") == 6);
}

TEST_CASE("a dropped watch resumes from the last resourceVersion, without a new list") {
  Cluster cluster;
  Extender extender(cluster.apiserver, cluster.token);
  REQUIRE(eventually([&] { return extender.ready(); }));
  bind_pod(cluster.apiserver, extender, "one", 1, "n1", 1);
  const std::string seen_version = cluster.apiserver.resource_version();

  cluster.apiserver.drop_watches();
  cluster.apiserver.put("pods", gpu_pod("two", 1, "n1"));  // sent only to the resumed watch
  CHECK(eventually([&] { return extender.metrics_show("gpuguard_extender_cached_objects{resource=\"pods\"} 2\n"); }));
  CHECK(scores_of(extender.post("prioritize", names_args(gpu_pod("x", 1), {"n1"}))).at("n1") == 10);

  CHECK(cluster.apiserver.count("pods", false) == 1);
  bool resumed = false;
  for (const auto& request : cluster.apiserver.requests()) {
    resumed = resumed || (request.path == "/api/v1/pods" &&
                          request.query.find("resourceVersion=" + seen_version + "&") != std::string::npos);
  }
  CHECK(resumed);
  CHECK(extender.metrics_show("gpuguard_kube_informer_outcomes_total{resource=\"pods\",outcome=\"watch_error\"}"));
  CHECK(extender.ready());
}

TEST_CASE("410 Gone: the extender lists again and forgets what it missed") {
  Cluster cluster;
  Extender extender(cluster.apiserver, cluster.token);
  REQUIRE(eventually([&] { return extender.ready(); }));
  bind_pod(cluster.apiserver, extender, "one", 2, "n1", 1);
  const json filter_one = names_args(gpu_pod("x", 1), {"n1", "n3"});

  SECTION("as an ERROR event in the watch stream") {
    // The deletion happens while history the extender would resume from is compacted away.
    cluster.apiserver.remove("pods", "one", false);
    cluster.apiserver.compact();
    cluster.apiserver.drop_watches();
    CHECK(eventually([&] { return extender.metrics_show("gpuguard_extender_cached_objects{resource=\"pods\"} 0\n"); }));
    CHECK(cluster.apiserver.count("pods", false) == 2);
    CHECK(extender.metrics_show("gpuguard_kube_informer_outcomes_total{resource=\"pods\",outcome=\"watch_gone\"} 1"));
    CHECK(json::parse(extender.post("filter", filter_one).body)["NodeNames"] == json::array({"n1"}));
  }
  SECTION("as an HTTP 410 answer to the watch request") {
    cluster.apiserver.put("nodes", gpu_node("n3", 4), false);
    cluster.apiserver.compact(true);
    cluster.apiserver.drop_watches();
    CHECK(
        eventually([&] { return extender.metrics_show("gpuguard_extender_cached_objects{resource=\"nodes\"} 4\n"); }));
    CHECK(cluster.apiserver.count("nodes", true, 410) >= 1);
    CHECK(json::parse(extender.post("filter", filter_one).body)["NodeNames"] == json::array({"n3"}));
  }
  CHECK(extender.ready());
}

TEST_CASE("a rotated token file is read again: the next connection uses the new token") {
  Cluster cluster;
  Extender extender(cluster.apiserver, cluster.token);
  REQUIRE(eventually([&] { return extender.ready(); }));
  cluster.apiserver.set_token("token-2");  // the old token is refused from now on
  cluster.token.write("token-2");
  cluster.apiserver.drop_watches();
  cluster.apiserver.put("pods", gpu_pod("one", 1, "n2"));
  CHECK(eventually([&] { return extender.metrics_show("gpuguard_extender_cached_objects{resource=\"pods\"} 1\n"); }));
  const auto requests = cluster.apiserver.requests();
  REQUIRE_FALSE(requests.empty());
  CHECK(requests.back().authorization == "Bearer token-2");
  CHECK(cluster.apiserver.count("pods", false) == 1);
}

TEST_CASE("/readyz fails and filter errs for GPU pods until pods and nodes have been listed") {
  Cluster cluster;
  cluster.apiserver.hold_lists(true);
  Extender extender(cluster.apiserver, cluster.token);
  // Its lists of pods and of nodes are both asked for, and wait.
  REQUIRE(eventually([&] { return cluster.apiserver.held_lists() == 2; }));
  CHECK(http_request(extender.port(), "GET", "/readyz").status == 503);
  CHECK(http_request(extender.port(), "GET", "/healthz").status == 200);
  const json waiting = json::parse(extender.post("filter", names_args(gpu_pod("x", 1), {"n1"})).body);
  CHECK_THAT(waiting["Error"].get<std::string>(), Catch::Contains("has not listed"));
  CHECK(extender.metrics_show("gpuguard_extender_synced 0\n"));
  cluster.apiserver.hold_lists(false);
  CHECK(eventually([&] { return extender.ready(); }));
  CHECK(extender.metrics_show("gpuguard_extender_synced 1\n"));
  CHECK(json::parse(extender.post("filter", names_args(gpu_pod("x", 1), {"n1"})).body)["Error"] == "");
}

TEST_CASE("malformed extender requests get 400 (or 404/405/413/415) and the extender serves on") {
  Cluster cluster;
  Extender extender(cluster.apiserver, cluster.token);
  REQUIRE(eventually([&] { return extender.ready(); }));
  const json table = read_json(fixtures_dir() / "extender" / "invalid.json");
  for (const json& c : table) {
    for (const char* verb : {"/scheduler/filter", "/scheduler/prioritize"}) {
      const Reply reply = http_request(extender.port(), "POST", verb, c["body"].get<std::string>());
      INFO(verb << " " << c["body"]);
      CHECK(reply.status == 400);
      CHECK_THAT(reply.body, Catch::Contains(c["reason"].get<std::string>()));
    }
  }
  CHECK(http_request(extender.port(), "GET", "/scheduler/filter").status == 405);
  CHECK(http_request(extender.port(), "POST", "/scheduler/filter", "{}", "text/plain").status == 415);
  CHECK(http_request(extender.port(), "POST", "/scheduler/bind", "{}").status == 404);
  CHECK(http_request(extender.port(), "POST", "/scheduler/filter", std::string(8 << 20, ' ')).status == 413);
  // Deep nesting (a recursive parser or destructor would overflow the stack), binary junk, a huge node
  // list: answered, never a crash.
  const std::string deep = R"({"Pod":{"spec":{},"deep":)" + std::string(100000, '[') + std::string(100000, ']') + "}}";
  const Reply nested = http_request(extender.port(), "POST", "/scheduler/filter", deep);
  CHECK(nested.status == 400);
  CHECK_THAT(nested.body, Catch::Contains("names no nodes"));
  CHECK(http_request(extender.port(), "POST", "/scheduler/prioritize", std::string("\x00\xff{\"Pod\"", 8)).status ==
        400);
  json many = names_args(gpu_pod("x", 1), {});
  for (int i = 0; i < 20000; ++i) many["NodeNames"].push_back(std::string("node-").append(std::to_string(i)));
  const Reply big = extender.post("prioritize", many);
  CHECK(big.status == 200);
  CHECK(json::parse(big.body).size() == 20000);

  CHECK(extender.process.running());
  CHECK(http_request(extender.port(), "GET", "/healthz").status == 200);
  // The table, and the deep nesting.
  CHECK(extender.metrics_show("gpuguard_extender_requests_total{verb=\"filter\",result=\"invalid\"} " +
                              std::to_string(table.size() + 1)));
}

TEST_CASE("over TLS with the webhook's certificate flags") {
  Cluster cluster;
  Extender extender(cluster.apiserver, cluster.token,
                    {"--listen-address", "127.0.0.1:0", "--tls-cert-file", certs_dir() + "/tls.crt",
                     "--tls-private-key-file", certs_dir() + "/tls.key", "--url-prefix", "/gpu/"});
  TlsClient client(extender.port());
  REQUIRE(eventually([&] { return client.request("GET", "/readyz").status == 200; }));
  const HttpReply reply = client.request("POST", "/gpu/prioritize", names_args(gpu_pod("x", 1), {"n1"}).dump());
  CHECK(reply.status == 200);
  CHECK(json::parse(reply.body) == json::parse(R"([{"Host":"n1","Score":5}])"));
  const std::string page = client.request("GET", "/metrics").body;
  CHECK_THAT(page, Catch::Contains("gpuguard_tls_certificate_expiry_timestamp_seconds"));
  check_promtool_clean(page);
  CHECK(client.request("POST", "/scheduler/prioritize", "{}").status == 404);
}

TEST_CASE("bad flags and a missing cluster are reported, not crashed on") {
  const std::string bin = GPUGUARD_EXTENDER_BIN;
  const std::string certs =
      " --tls-cert-file " + certs_dir() + "/tls.crt --tls-private-key-file " + certs_dir() + "/tls.key";
  auto run = [&](const std::string& args) { return run_binary(bin, args); };
  CHECK(run("--apiserver-url https://127.0.0.1:1").status == 2);  // neither TLS nor --insecure-listen-address
  const auto both = run("--insecure-listen-address 127.0.0.1:0 --apiserver-url https://127.0.0.1:1" + certs);
  CHECK(both.status == 2);
  CHECK_THAT(both.output, Catch::Contains("either --insecure-listen-address or both"));
  const auto http_url = run("--insecure-listen-address 127.0.0.1:0 --apiserver-url http://127.0.0.1:8080");
  CHECK(http_url.status == 2);
  CHECK_THAT(http_url.output, Catch::Contains("must start with https://"));
  CHECK(run("--insecure-listen-address 127.0.0.1:0 --apiserver-url https://x --url-prefix nope").status == 2);
  const auto outside = run("--insecure-listen-address 127.0.0.1:0 < /dev/null");
  CHECK(outside.status == 1);
  CHECK_THAT(outside.output, Catch::Contains("KUBERNETES_SERVICE_HOST"));
  CHECK(run("--insecure-listen-address nowhere --apiserver-url https://127.0.0.1:1").status == 1);
  CHECK(run("--version").status == 0);
}

// As for the webhook: the stop signals are held from the start of serving, so the informers' and the
// connections' threads block them, and only the server's signal loop is given them.
TEST_CASE("SIGTERM and SIGINT reach the signal loop's thread alone: every other thread blocks them") {
  Cluster cluster;
  Extender extender(cluster.apiserver, cluster.token);
  CHECK(eventually([&] {
    return extender.process.main_thread_alone_takes(SIGTERM) && extender.process.main_thread_alone_takes(SIGINT);
  }));
  INFO(extender.process.threads().size() << " threads");
  CHECK(extender.process.threads().size() >= 4);  // beside the main thread: informers, two connection loops
  CHECK(extender.process.terminate() == 0);
}

// As for the webhook: at each limit on its threads the extender serves, or exits 1 saying why.
TEST_CASE("at each limit on its threads the extender serves, or exits 1 saying why") {
  Cluster cluster;
  const int served = serves_or_says_why_at_each_task_limit(Extender::argv(cluster.apiserver, cluster.token, {}), 10);
  CHECK(served >= 1);
  CHECK(served < 10);
}

// The real gpuguard-device-plugin keeping its Node's GPUIsolation condition through a fake API server
// over real TLS: the verdict for the policy's value, its change when the policy's value changes, a
// restart that keeps lastTransitionTime, a failure counted and logged once, bad flags refused, and a policy the
// webhook would refuse never stopping the GPUs being served; and forget-node, at an uninstall, removing it.
#include <nlohmann/json.hpp>

#include "fake_apiserver.hpp"
#include "plugin_harness.hpp"
#include "server_process.hpp"

using namespace gpuguard::test;
using nlohmann::json;

namespace {

json node_object(const std::string& name) {
  return {
      {"apiVersion", "v1"},
      {"kind", "Node"},
      {"metadata", {{"name", name}}},
      {"status", {{"conditions", json::array({{{"type", "Ready"}, {"status", "True"}, {"reason", "KubeletReady"}}})}}}};
}

// The same, with a GPUIsolation condition a plugin left (for forget-node to remove).
json node_with_isolation(const std::string& name) {
  json object = node_object(name);
  object["status"]["conditions"].push_back({{"type", "GPUIsolation"}, {"status", "True"}, {"reason", "Honoured"}});
  return object;
}

// The GPUIsolation condition on the fake's Node once `pred` holds for it (null when it never did in 20 s).
template <typename Pred>
json condition_when(const FakeApiserver& apiserver, const std::string& node, Pred pred) {
  json found = nullptr;
  eventually(
      [&] {
        json object = apiserver.object("nodes", node);
        for (const json& c : object["status"]["conditions"]) {
          if (c.value("type", "") == "GPUIsolation" && pred(c)) found = c;
        }
        return !found.is_null();
      },
      20s);
  return found;
}

struct ConditionNode : Node {
  fs::path policy = host.root() / "policy";
  fs::path token = host.root() / "token";
  ConditionNode() {
    // cdi mode with no device none (and no CDI root for the plugin to add one): none breaks pods, void
    // is honoured.
    host.write("etc/containerd/config.toml",
               "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\ndefault_runtime_name = 'nvidia'\n"
               "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]\n"
               "BinaryName = '/usr/bin/nvidia-container-runtime'\n");
    host.write("etc/nvidia-container-runtime/config.toml", "[nvidia-container-runtime]\nmode = 'cdi'\n");
    host.write("policy/visibleDevicesValue", "none\n");
    host.write("token", "node-token\n");
  }
  // `forget-node --wait` for node gpu-1 through `apiserver`, writing `ready` once done.
  std::vector<std::string> forget_node_waiting(const FakeApiserver& apiserver, const fs::path& ready,
                                               std::vector<std::string> extra = {}) const {
    std::vector<std::string> argv = {GPUGUARD_DEVICE_PLUGIN_BIN,
                                     "forget-node",
                                     "--wait",
                                     "--host-root",
                                     host.root().string(),
                                     "--ready-file",
                                     ready.string(),
                                     "--node-name",
                                     "gpu-1",
                                     "--apiserver-url",
                                     apiserver.url(),
                                     "--token-file",
                                     token.string(),
                                     "--ca-file",
                                     certs_dir() + "/ca.crt"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  std::vector<std::string> flags(const FakeApiserver& apiserver) const {
    return {"--cdi-root",      "",
            "--node-name",     "gpu-1",
            "--apiserver-url", apiserver.url(),
            "--token-file",    token.string(),
            "--ca-file",       certs_dir() + "/ca.crt",
            "--policy-dir",    policy.string()};
  }
};

}  // namespace

TEST_CASE("node condition: GPUIsolation follows the policy's value, keeps its transition time across restarts") {
  FakeApiserver apiserver("node-token");
  apiserver.put("nodes", node_object("gpu-1"));
  ConditionNode node;
  std::string transition;
  {
    PluginProcess plugin(node.plugin_dir, node.host.root(), node.flags(apiserver));
    const json broken = condition_when(apiserver, "gpu-1", [](const json& c) { return c["status"] == "False"; });
    REQUIRE(broken.is_object());
    CHECK(broken["reason"] == "BreaksPods");
    CHECK_THAT(broken["message"].get<std::string>(), Catch::StartsWith("NVIDIA_VISIBLE_DEVICES=none: "));
    CHECK(broken["lastHeartbeatTime"].get<std::string>().ends_with("Z"));
    // Merged by type: the kubelet's condition is still there.
    json object = apiserver.object("nodes", "gpu-1");
    CHECK(object["status"]["conditions"].size() == 2);
    CHECK(object["status"]["conditions"][0]["type"] == "Ready");
    // Every write is a strategic merge patch of the Node's status, with the node's token.
    for (const auto& r : apiserver.requests()) {
      if (r.method != "PATCH") continue;
      CHECK(r.path == "/api/v1/nodes/gpu-1/status");
      CHECK(r.content_type == "application/strategic-merge-patch+json");
      CHECK(r.authorization == "Bearer node-token");
    }
    // The write is counted once its answer is read, which may come after the API server stored it.
    const int port = plugin.status_port();
    const std::string counted = "gpuguard_device_plugin_node_condition_writes_total{result=\"success\"} 1\n";
    std::string metrics;
    eventually([&] {
      metrics = http_get(port, "/metrics").second;
      return metrics.find(counted) != std::string::npos;
    });
    CHECK_THAT(metrics, Catch::Contains(counted));

    // The admin sets visibleDevicesValue: void in the ConfigMap: the condition judges void from the next
    // re-read on (the policy within 1 s, the node every 10 s).
    // The transition time is in whole seconds: the next one begins before the change, so that it differs.
    std::this_thread::sleep_until(std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now()) +
                                  std::chrono::seconds(1));
    node.host.write("policy/visibleDevicesValue", "void\n");
    const json honoured = condition_when(apiserver, "gpu-1", [](const json& c) { return c["status"] == "True"; });
    REQUIRE(honoured.is_object());
    CHECK(honoured["reason"] == "Honoured");
    CHECK_THAT(honoured["message"].get<std::string>(), Catch::StartsWith("NVIDIA_VISIBLE_DEVICES=void: "));
    CHECK(honoured["lastTransitionTime"] != broken["lastTransitionTime"]);
    transition = honoured["lastTransitionTime"];
    CHECK_THAT(plugin.log(), Catch::Contains(R"("msg":"node condition written")"));
    CHECK(plugin.terminate() == 0);
  }
  // Started again on the same node: the condition it writes is the same, so lastTransitionTime stays.
  const std::size_t patches_before = apiserver.requests().size();
  PluginProcess again(node.plugin_dir, node.host.root(), node.flags(apiserver));
  REQUIRE(eventually(
      [&] { return apiserver.requests().size() >= patches_before + 2; }));  // the empty patch, then the condition
  CHECK(apiserver.requests()[patches_before].body == "{}");
  const json kept = apiserver.object("nodes", "gpu-1")["status"]["conditions"][1];
  CHECK(kept["status"] == "True");
  CHECK(kept["lastTransitionTime"] == transition);
  CHECK(again.terminate() == 0);
}

TEST_CASE("node condition: a refused write is counted, logged once, and tried again") {
  FakeApiserver apiserver("another-token");  // the plugin's token is not accepted
  apiserver.put("nodes", node_object("gpu-1"));
  ConditionNode node;
  PluginProcess plugin(node.plugin_dir, node.host.root(), node.flags(apiserver));
  const int port = plugin.status_port();
  std::string metrics;
  eventually(
      [&] {
        metrics = http_get(port, "/metrics").second;
        return metrics.find("writes_total{result=\"failure\"} 2") != std::string::npos;
      },
      15s);
  CHECK_THAT(metrics, Catch::Contains("gpuguard_device_plugin_node_condition_writes_total{result=\"failure\"} 2\n"));
  const std::string log = plugin.log();
  const std::string line = R"("msg":"cannot write the node condition")";
  CHECK(log.find(line) != std::string::npos);
  CHECK(log.find(line) == log.rfind(line));  // the same reason is not logged again
  CHECK_THAT(log, Catch::Contains("HTTP 401"));
  // The token is rotated to one the API server accepts: the next try writes the condition.
  apiserver.set_token("node-token");
  CHECK(condition_when(apiserver, "gpu-1", [](const json& c) { return c["status"] == "False"; }).is_object());
  CHECK_THAT(plugin.log(), Catch::Contains(R"("msg":"node condition written again")"));
  CHECK(plugin.terminate() == 0);
}

TEST_CASE("node condition: a policy the webhook would refuse never stops the GPUs being served") {
  FakeApiserver apiserver("node-token");
  apiserver.put("nodes", node_object("gpu-1"));
  ConditionNode node;
  // A typo in a key the plugin does not read: not read, not refused, not even warned about.
  node.host.write("policy/mode", "enforcing\n");
  node.host.write("policy/privileged", "sometimes\n");
  {
    FakeKubelet kubelet(node.plugin_dir);
    PluginProcess plugin(node.plugin_dir, node.host.root(), node.flags(apiserver));
    REQUIRE(kubelet.wait_for(1).size() == 1);
    CHECK(kubelet.wait_for(1)[0].resource_name() == "nvidia.com/gpu");
    CHECK(condition_when(apiserver, "gpu-1", [](const json& c) { return c["reason"] == "BreaksPods"; }).is_object());
    CHECK(plugin.log().find("enforcing") == std::string::npos);
    CHECK(plugin.terminate() == 0);
  }
  // A bad value of the one key it reads: refused, logged and counted; the default (none) is judged until
  // the value is fixed, and the GPUs are served meanwhile.
  node.host.write("policy/visibleDevicesValue", "all\n");
  FakeKubelet kubelet(node.plugin_dir);
  PluginProcess plugin(node.plugin_dir, node.host.root(), node.flags(apiserver));
  REQUIRE(kubelet.wait_for(1).size() == 1);
  CHECK(kubelet.wait_for(1)[0].resource_name() == "nvidia.com/gpu");
  CHECK_THAT(plugin.log(), Catch::Contains("visibleDevicesValue"));
  CHECK_THAT(http_get(plugin.status_port(), "/metrics").second,
             Catch::Contains("gpuguard_policy_reloads_total{result=\"failure\"} 1\n"));
  const std::string judged_default = http_get(plugin.status_port(), "/metrics").second;
  CHECK_THAT(
      judged_default,
      Catch::Contains("gpuguard_device_plugin_injected_value_honoured{value=\"none\",verdict=\"breaks-pods\"} 0\n"));
  // The plugin reads no mode, so it says none.
  CHECK(judged_default.find("gpuguard_policy_info") == std::string::npos);
  node.host.write("policy/visibleDevicesValue", "void\n");
  CHECK(condition_when(apiserver, "gpu-1", [](const json& c) { return c["reason"] == "Honoured"; }).is_object());
  CHECK_THAT(
      http_get(plugin.status_port(), "/metrics").second,
      Catch::Contains("gpuguard_device_plugin_injected_value_honoured{value=\"void\",verdict=\"honoured\"} 1\n"));
  CHECK(plugin.terminate() == 0);
}

TEST_CASE("node condition: a bad node name, or no API to write to, is refused at start") {
  ConditionNode node;
  PluginProcess bad_name(node.plugin_dir, node.host.root(), {"--node-name", "GPU_1"});
  CHECK(bad_name.wait_exit(5s) == 2);
  // No --apiserver-url, and not in a pod.
  PluginProcess no_api(node.plugin_dir, node.host.root(), {"--node-name", "gpu-1"});
  CHECK(no_api.wait_exit(5s) == 2);
}

TEST_CASE("forget-node: with --node-name the Node's GPUIsolation condition goes too, then the ready file") {
  FakeApiserver apiserver("node-token");
  apiserver.put("nodes", node_with_isolation("gpu-1"));
  ConditionNode node;
  node.host.write("var/run/cdi/k8s.gpuguard.io-gpu.json", "{}");
  const fs::path ready = node.host.root() / "forgotten";
  const std::string probe = "forget-node --host-root " + node.host.root().string() + " --cdi-root /var/run/cdi" +
                            " --node-name gpu-1 --ready-file " + ready.string();
  // The readiness probe's form: the file removed, but not ready while the condition may be left.
  CHECK(run_binary(GPUGUARD_DEVICE_PLUGIN_BIN, probe).status == 1);
  CHECK_FALSE(fs::exists(node.host.root() / "var/run/cdi/k8s.gpuguard.io-gpu.json"));
  CHECK(apiserver.object("nodes", "gpu-1")["status"]["conditions"].size() == 2);  // the probe sends nothing
  ChildProcess cleanup(node.forget_node_waiting(apiserver, ready, {"--cdi-root", "/var/run/cdi"}));
  if (!eventually([&] { return fs::exists(ready); }, 20s)) FAIL("no ready file: " << cleanup.log());
  // Removed by type, with the node's token; the kubelet's condition stays.
  const json conditions = apiserver.object("nodes", "gpu-1")["status"]["conditions"];
  REQUIRE(conditions.size() == 1);
  CHECK(conditions[0]["type"] == "Ready");
  bool removal_seen = false;
  for (const auto& r : apiserver.requests()) {
    if (r.method != "PATCH") continue;
    CHECK(r.path == "/api/v1/nodes/gpu-1/status");
    CHECK(r.authorization == "Bearer node-token");
    removal_seen = removal_seen || r.body == R"({"status":{"conditions":[{"$patch":"delete","type":"GPUIsolation"}]}})";
  }
  CHECK(removal_seen);
  CHECK(run_binary(GPUGUARD_DEVICE_PLUGIN_BIN, probe).status == 0);
  CHECK(cleanup.terminate() == 0);
  CHECK_THAT(cleanup.log(), Catch::Contains("nothing of gpuguard is left on this node"));
}

TEST_CASE("forget-node: a condition it may not remove keeps it unready, and it tries again until it may") {
  FakeApiserver apiserver("node-token");
  apiserver.put("nodes", node_with_isolation("gpu-1"));
  ConditionNode node;
  node.host.write("token", "another-token\n");  // refused: 401
  const fs::path ready = node.host.root() / "forgotten";
  ChildProcess cleanup(node.forget_node_waiting(apiserver, ready));
  // Two rounds refused: no ready file, the condition there, and the probe's form fails.
  REQUIRE(eventually([&] { return apiserver.requests().size() >= 2; }, 10s));
  CHECK_FALSE(fs::exists(ready));
  CHECK(apiserver.object("nodes", "gpu-1")["status"]["conditions"].size() == 2);
  CHECK(run_binary(GPUGUARD_DEVICE_PLUGIN_BIN,
                   "forget-node --host-root " + node.host.root().string() + " --ready-file " + ready.string())
            .status == 1);
  CHECK_THAT(cleanup.log(), Catch::Contains("cannot remove the node's condition"));
  // Allowed now (the token the API server takes): the next round removes it, then the ready file.
  apiserver.set_token("another-token");
  if (!eventually([&] { return fs::exists(ready); }, 10s)) FAIL("no ready file: " << cleanup.log());
  CHECK(apiserver.object("nodes", "gpu-1")["status"]["conditions"].size() == 1);
  CHECK(cleanup.terminate() == 0);
}

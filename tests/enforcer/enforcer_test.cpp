// The node enforcer's core (include/gpuguard/enforcer/enforcer.hpp) driven through its ports with fakes: NRI's
// requests as the runtime writes them (NRI's protobuf), a kubelet that counts its calls and can be slow, a pod
// directory and a node in memory. What lies between calls is checked here without a process or a sleep: the
// create's allocation handed to its validation, the answer fetched when a sandbox is made, the kubelet's
// deadline, the break glass and the flags' exemptions merged into the policy, and the running containers'
// report, Synchronize split in chunks whose containers come before their pods, within a byte budget.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "eventually.hpp"
#include "gpuguard/enforcer/enforcer.hpp"
#include "gpuguard/nri/messages.hpp"
#include "nri/v1alpha1/api.pb.h"
#include "proto_writer.hpp"

using namespace gpuguard;
using namespace std::chrono_literals;
namespace api = ::nri::pkg::api::v1alpha1;

namespace {

constexpr const char* kGpu0 = "GPU-11111111-1111-4111-8111-111111111111";
constexpr const char* kGpu1 = "GPU-22222222-2222-4222-8222-222222222222";

// The kubelet: the pods it lists, how long it takes, how often it was asked.
class FakeKubelet final : public enforcer::PodResourcesSource {
 public:
  void set(const std::string& pod_namespace, const std::string& name, enforcement::PodResources pod) {
    const std::lock_guard lock(mutex_);
    pods_[pod_namespace + "/" + name] = std::move(pod);
  }
  void set_delay(std::chrono::milliseconds delay) {
    const std::lock_guard lock(mutex_);
    delay_ = delay;
  }
  void serve_get(bool served) {
    const std::lock_guard lock(mutex_);
    get_served_ = served;
  }
  std::string list(std::chrono::milliseconds deadline, const Wanted& wanted, const Take& take) override {
    std::map<std::string, enforcement::PodResources> pods;
    {
      const std::lock_guard lock(mutex_);
      ++lists_;
      if (delay_ > deadline) return "List: Deadline Exceeded (code 4)";
      pods = pods_;
    }
    for (auto& [key, pod] : pods) {
      const std::size_t slash = key.find('/');
      if (wanted(key.substr(0, slash), key.substr(slash + 1))) take(key.substr(0, slash), key.substr(slash + 1), pod);
    }
    return {};
  }
  std::optional<enforcement::KubeletAnswer> get(const std::string& pod_namespace, const std::string& pod_name,
                                                std::chrono::milliseconds deadline) override {
    const std::lock_guard lock(mutex_);
    if (!get_served_) return std::nullopt;
    ++gets_;
    enforcement::KubeletAnswer answer;
    if (delay_ > deadline) {
      answer.error = "Get: Deadline Exceeded (code 4)";
      return answer;
    }
    answer.answered = true;
    if (const auto found = pods_.find(pod_namespace + "/" + pod_name); found != pods_.end()) answer.pod = found->second;
    return answer;
  }
  int calls() {
    const std::lock_guard lock(mutex_);
    return lists_ + gets_;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, enforcement::PodResources> pods_;
  std::chrono::milliseconds delay_{0};
  bool get_served_ = false;
  int lists_ = 0, gets_ = 0;
};

class FakePods final : public enforcer::PodDirectory {
 public:
  std::map<std::string, std::string> accounts;  // "namespace/name" -> service account
  std::string service_account(const std::string& pod_namespace, const std::string& pod_name,
                              const std::string& /*uid*/) override {
    ++asked;
    const auto found = accounts.find(pod_namespace + "/" + pod_name);
    return found == accounts.end() ? "" : found->second;
  }
  void node_event(const std::string& message) override {
    const std::lock_guard lock(mutex_);
    events_.push_back(message);
    changed_.notify_all();
  }
  // Recorded as "namespace/name uid: message".
  void pod_event(const std::string& pod_namespace, const std::string& pod_name, const std::string& uid,
                 const std::string& message) override {
    node_event(pod_namespace + "/" + pod_name + " " + uid + ": " + message);
  }
  int asked = 0;  // service_account's calls, each a GET to the API server in the enforcer
  std::vector<std::string> events(std::size_t at_least) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, 5s, [&] { return events_.size() >= at_least; });
    return events_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> events_;
};

class FakeNode final : public enforcer::NodeState {
 public:
  FakeNode() {
    auto node = std::make_shared<enforcement::NodeView>();
    node->gpus = {{kGpu0, 0, "0000:10:00.0", {}}, {kGpu1, 1, "0000:20:00.0", {}}};
    node->toolkit.mode = "auto";
    node->toolkit.version = enforcement::ToolkitVersion{1, 20, 1};
    node_ = node;
  }
  std::shared_ptr<const enforcement::NodeView> current() override { return node_; }
  void refresh() override { ++refreshes; }
  // Each path costs `cost` lookups of the budget; what each call was left with is recorded.
  enforcement::HostPathResolution resolve(std::string_view /*host_path*/, std::size_t& steps_left) override {
    budgets.push_back(steps_left);
    steps_left -= std::min(steps_left, cost);
    return {};
  }
  std::optional<std::string> mountinfo(std::uint32_t pid, std::string& why) override {
    const auto found = mounts.find(pid);
    if (found == mounts.end()) {
      why = "no such process";
      return std::nullopt;
    }
    return found->second;
  }
  void set_places(std::vector<enforcement::NodeView::RootPlace> places) {
    auto node = std::make_shared<enforcement::NodeView>(*node_);
    for (const auto& place : places) node->mps_roots_maskable.insert(place.root);
    node->mps_root_places = std::move(places);
    node_ = node;
  }
  int refreshes = 0;
  std::size_t cost = 0;
  std::vector<std::size_t> budgets;
  std::map<std::uint32_t, std::string> mounts;  // each process's mountinfo

 private:
  std::shared_ptr<const enforcement::NodeView> node_;
};

struct Fixture {
  FakeKubelet kubelet;
  FakePods pods;
  FakeNode node;
  enforcer::EnforcerMetrics metrics{"test"};
  std::shared_ptr<const policy::Policy> policy = std::make_shared<policy::Policy>();
  std::atomic<bool> glass{false};
  enforcer::EnforcerOptions options;

  std::unique_ptr<enforcer::Enforcer> make() {
    return std::make_unique<enforcer::Enforcer>(
        options, kubelet, pods, node, [this] { return policy; }, [this] { return glass.load(); }, metrics);
  }
};

api::PodSandbox pod(const std::string& name) {
  api::PodSandbox sandbox;
  sandbox.set_id("sandbox-" + name);
  sandbox.set_name(name);
  sandbox.set_namespace_("team-a");
  sandbox.set_uid("uid-" + name);
  return sandbox;
}

api::Container container(const std::string& pod_name, const std::string& id, const std::vector<std::string>& env) {
  api::Container c;
  c.set_id(id);
  c.set_pod_sandbox_id("sandbox-" + pod_name);
  c.set_name("app");
  for (const std::string& entry : env) c.add_env(entry);
  return c;
}

std::string create_request(const api::PodSandbox& sandbox, const api::Container& c) {
  api::CreateContainerRequest request;
  *request.mutable_pod() = sandbox;
  *request.mutable_container() = c;
  return request.SerializeAsString();
}

// ValidateContainerAdjustmentRequest {1 pod, 2 container, 3 adjust}: written by hand, as proto/ keeps only
// the messages the enforcer writes.
std::string validate_request(const api::PodSandbox& sandbox, const api::Container& c,
                             const std::map<std::string, std::string>& set_env) {
  api::ContainerAdjustment adjust;
  for (const auto& [name, value] : set_env) {
    auto* env = adjust.add_env();
    env->set_key(name);
    env->set_value(value);
  }
  return test::ProtoWriter()
      .bytes(1, sandbox.SerializeAsString())
      .bytes(2, c.SerializeAsString())
      .bytes(3, adjust.SerializeAsString())
      .str();
}

enforcement::PodResources gpu_pod(const std::vector<std::string>& ids) {
  enforcement::PodResources pod;
  pod.containers.push_back({"app", {{"nvidia.com/gpu", ids}}, {}});
  return pod;
}

// What a create's answer sets NVIDIA_VISIBLE_DEVICES to, "" where it sets nothing, "refused" where it refuses.
std::string written(const gpuguard::nri::CreateResult& result) {
  if (result.refusal) return "refused";
  if (!result.response) return "";
  for (const auto& env : result.response->adjust().env()) {
    if (env.key() == "NVIDIA_VISIBLE_DEVICES") return env.value();
  }
  return "";
}

}  // namespace

TEST_CASE("enforcer core: a create's allocation is handed to its validation, and the kubelet asked once for both") {
  Fixture f;
  f.kubelet.set("team-a", "train", gpu_pod({kGpu1}));
  const auto enforcer = f.make();
  const api::PodSandbox sandbox = pod("train");
  const api::Container app = container("train", "c1", {"NVIDIA_VISIBLE_DEVICES=all"});
  CHECK(written(enforcer->create_container(create_request(sandbox, app))) == kGpu1);
  CHECK(f.kubelet.calls() == 1);
  // The merged adjustment, as the runtime shows it to validators: gpuguard's own write, within.
  CHECK_FALSE(enforcer->validate(validate_request(sandbox, app, {{"NVIDIA_VISIBLE_DEVICES", kGpu1}})).has_value());
  CHECK(f.kubelet.calls() == 1);
  // Another plugin's change after it: rejected, on the same allocation, without asking again.
  const auto rejected = enforcer->validate(validate_request(sandbox, app, {{"NVIDIA_VISIBLE_DEVICES", "all"}}));
  REQUIRE(rejected.has_value());
  CHECK_THAT(*rejected, Catch::Contains("after every NRI plugin's adjustment"));
  CHECK(f.kubelet.calls() == 2);  // handed over once: a second validation asks
}

TEST_CASE("enforcer core: a sandbox's answer is fetched when it is made, and its containers created without asking") {
  Fixture f;
  f.kubelet.set("team-a", "a", gpu_pod({kGpu0}));
  f.kubelet.set("team-a", "b", gpu_pod({kGpu1}));
  const auto enforcer = f.make();
  enforcer->run_pod_sandbox(pod("a").SerializeAsString());
  test::eventually([&] { return enforcer->prefetch_lists() >= 1; }, 5s, 5ms);
  REQUIRE(enforcer->prefetch_lists() == 1);
  const int before = f.kubelet.calls();
  CHECK(written(enforcer->create_container(
            create_request(pod("a"), container("a", "c1", {"NVIDIA_VISIBLE_DEVICES=all"})))) == kGpu0);
  CHECK(written(enforcer->create_container(
            create_request(pod("a"), container("a", "c2", {"NVIDIA_VISIBLE_DEVICES=all"})))) == kGpu0);
  CHECK(f.kubelet.calls() == before);  // the fetched answer served both, a restart's included
  // A sandbox made before the enforcer, never fetched: asked at the create.
  CHECK(written(enforcer->create_container(
            create_request(pod("b"), container("b", "c3", {"NVIDIA_VISIBLE_DEVICES=all"})))) == kGpu1);
  CHECK(f.kubelet.calls() == before + 1);
  // Removed: forgotten, so that nothing is held for it.
  enforcer->remove_pod_sandbox(pod("a").SerializeAsString());
  CHECK(written(enforcer->create_container(
            create_request(pod("a"), container("a", "c4", {"NVIDIA_VISIBLE_DEVICES=all"})))) == kGpu0);
  CHECK(f.kubelet.calls() == before + 2);
}

TEST_CASE("enforcer core: one pod is asked for by Get where the kubelet serves it, by List where it does not") {
  Fixture f;
  f.kubelet.set("team-a", "a", gpu_pod({kGpu0}));
  f.kubelet.serve_get(true);
  const auto enforcer = f.make();
  CHECK(written(enforcer->create_container(
            create_request(pod("a"), container("a", "c1", {"NVIDIA_VISIBLE_DEVICES=all"})))) == kGpu0);
  // A pod the kubelet does not know is an answer too: no resources, so no GPU.
  CHECK(written(enforcer->create_container(
            create_request(pod("gone"), container("gone", "c2", {"NVIDIA_VISIBLE_DEVICES=all"})))) == "void");
  CHECK(f.kubelet.calls() == 2);
}

TEST_CASE("enforcer core: a kubelet slower than its deadline: GPUs refused as not judged, a GPU-less container made") {
  Fixture f;
  f.kubelet.set("team-a", "slow", gpu_pod({kGpu0}));
  f.kubelet.set_delay(2s);
  f.options.kubelet_deadline = 50ms;
  f.options.fetched_wait = 10ms;
  const auto enforcer = f.make();
  const gpuguard::nri::CreateResult refused =
      enforcer->create_container(create_request(pod("slow"), container("slow", "c1", {"NVIDIA_VISIBLE_DEVICES=all"})));
  REQUIRE(refused.refusal);
  CHECK_THAT(*refused.refusal, Catch::Contains("would reach GPUs while its allocation cannot be read"));
  CHECK_THAT(*refused.refusal, Catch::Contains("Deadline Exceeded"));
  // Void reaches no GPU: nothing to judge, whatever the kubelet says.
  CHECK(written(enforcer->create_container(
            create_request(pod("slow"), container("slow", "c2", {"NVIDIA_VISIBLE_DEVICES=void"})))) == "");
  // nodeEnforcementUnknown: allow lets it be, as it is.
  auto allow = std::make_shared<policy::Policy>();
  allow->node_enforcement_unknown = policy::NodeEnforcementUnknown::allow;
  f.policy = allow;
  CHECK(written(enforcer->create_container(
            create_request(pod("slow"), container("slow", "c3", {"NVIDIA_VISIBLE_DEVICES=all"})))) == "");
}

TEST_CASE("enforcer core: the break glass and the flags' exemptions are merged into the policy as they change") {
  Fixture f;
  f.options.exempt_service_accounts = {"gpuguard/device-plugin"};
  f.pods.accounts["gpuguard/plugin-pod"] = "device-plugin";
  const auto enforcer = f.make();
  const std::vector<std::string> all = {"NVIDIA_VISIBLE_DEVICES=all"};
  api::PodSandbox plugin = pod("plugin-pod");
  plugin.set_namespace_("gpuguard");
  CHECK(written(enforcer->create_container(create_request(plugin, container("plugin-pod", "p1", all)))) == "");
  CHECK(written(enforcer->create_container(create_request(pod("x"), container("x", "c1", all)))) == "void");
  f.glass = true;
  CHECK(enforcer->effective_policy()->node_enforcement == policy::NodeEnforcement::off);
  CHECK(written(enforcer->create_container(create_request(pod("x"), container("x", "c2", all)))) == "");
  f.glass = false;
  CHECK(written(enforcer->create_container(create_request(pod("x"), container("x", "c3", all)))) == "void");
  // A policy reloaded meanwhile keeps the flags' exemptions.
  auto audit = std::make_shared<policy::Policy>();
  audit->node_enforcement = policy::NodeEnforcement::audit;
  f.policy = audit;
  const auto merged = enforcer->effective_policy();
  CHECK(merged->node_enforcement == policy::NodeEnforcement::audit);
  CHECK_THAT(merged->node_enforcement_exempt_service_accounts,
             Catch::VectorContains(std::string("gpuguard/device-plugin")));
}

TEST_CASE("enforcer core: a pod's service account is asked for only where an entry could exempt it with its labels") {
  Fixture f;
  f.options.exempt_service_accounts = {"gpuguard/device-plugin:app.kubernetes.io/name=device-plugin"};
  f.pods.accounts["gpuguard/plugin-pod"] = "device-plugin";
  f.pods.accounts["gpuguard/webhook-pod"] = "webhook";
  const auto enforcer = f.make();
  const std::vector<std::string> all = {"NVIDIA_VISIBLE_DEVICES=all"};
  api::PodSandbox plugin = pod("plugin-pod");
  plugin.set_namespace_("gpuguard");
  (*plugin.mutable_labels())["app.kubernetes.io/name"] = "device-plugin";
  CHECK(written(enforcer->create_container(create_request(plugin, container("plugin-pod", "p1", all)))) == "");
  CHECK(f.pods.asked == 1);
  // Another pod of the namespace, without the entry's label: no account of it could exempt it, so the API
  // server is not asked (a fresh enforcer's registration asked once for each such running pod).
  api::PodSandbox webhook = pod("webhook-pod");
  webhook.set_namespace_("gpuguard");
  (*webhook.mutable_labels())["app.kubernetes.io/name"] = "webhook";
  CHECK(written(enforcer->create_container(create_request(webhook, container("webhook-pod", "w1", all)))) == "void");
  CHECK(f.pods.asked == 1);
}

TEST_CASE("enforcer core: GPU infrastructure in a namespace its entry does not name is said on its pod, once a pod") {
  Fixture f;
  auto policy = std::make_shared<policy::Policy>();
  policy->node_enforcement_exempt_service_accounts = {"nvidia/*:app.kubernetes.io/name=nvidia-device-plugin"};
  f.policy = policy;
  const auto enforcer = f.make();
  const auto look_alike = [](const std::string& name, const std::string& pod_namespace) {
    api::PodSandbox sandbox = pod(name);
    sandbox.set_namespace_(pod_namespace);
    (*sandbox.mutable_labels())["app.kubernetes.io/name"] = "nvidia-device-plugin";
    return sandbox;
  };
  const std::vector<std::string> all = {"NVIDIA_VISIBLE_DEVICES=all"};
  // Two containers of one pod in an unnamed namespace, then another such pod: enforced as any, said once each.
  CHECK(written(enforcer->create_container(
            create_request(look_alike("plugin", "team-a"), container("plugin", "c1", all)))) == "void");
  CHECK(written(enforcer->create_container(
            create_request(look_alike("plugin", "team-a"), container("plugin", "c2", all)))) == "void");
  CHECK(written(enforcer->create_container(
            create_request(look_alike("other", "team-b"), container("other", "c3", all)))) == "void");
  // In the namespace its entry names it is exempt, and not said; nor is a pod without the label.
  f.pods.accounts["nvidia/exempt"] = "anything";
  CHECK(written(enforcer->create_container(
            create_request(look_alike("exempt", "nvidia"), container("exempt", "c4", all)))) == "");
  CHECK(written(enforcer->create_container(create_request(pod("plain"), container("plain", "c5", all)))) == "void");
  CHECK(f.metrics.render({}, "enforce").find("gpuguard_node_enforcer_unlisted_infrastructure_total 3") !=
        std::string::npos);
  // A last such pod: events are written in order, so any said wrongly above would come before its own.
  CHECK(written(enforcer->create_container(
            create_request(look_alike("last", "team-c"), container("last", "c6", all)))) == "void");
  const auto events = f.pods.events(3);
  REQUIRE(events.size() == 3);
  CHECK_THAT(events[2], Catch::StartsWith("team-c/last uid-last: "));
  // The entry's label alone: its namespace and account are the admin's.
  CHECK_THAT(events[0], Catch::StartsWith("team-a/plugin uid-plugin: Carries the label "
                                          "app.kubernetes.io/name=nvidia-device-plugin of a GPU infrastructure "
                                          "exemption whose namespaces do not include team-a"));
  CHECK_THAT(events[0], !Catch::Contains("nvidia/*"));
  CHECK_THAT(events[1], Catch::StartsWith("team-b/other uid-other: "));
}

TEST_CASE("enforcer core: running containers are judged at registration, their pods in later chunks, and reported") {
  Fixture f;
  f.kubelet.set("team-a", "old", gpu_pod({}));
  f.kubelet.set("team-a", "gpu", gpu_pod({kGpu1}));
  const auto enforcer = f.make();
  // NRI splits a Synchronize that does not fit one message: pods and containers apart, so that a container
  // may come before its pod. Here every container comes first.
  api::SynchronizeRequest first, second;
  *first.add_containers() = container("old", "c-old", {"NVIDIA_VISIBLE_DEVICES=all"});
  *first.add_containers() =
      container("gpu", "c-gpu", {"NVIDIA_VISIBLE_DEVICES=all", std::string("NVIDIA_VISIBLE_DEVICES=") + kGpu1});
  api::Container privileged = container("old", "c-priv", {});
  auto* rule = privileged.mutable_linux()->mutable_resources()->add_devices();
  rule->set_allow(true);
  rule->set_access("rwm");
  *first.add_containers() = privileged;
  *first.add_containers() = container("orphan", "c-orphan", {"NVIDIA_VISIBLE_DEVICES=all"});
  first.set_more(true);
  *second.add_pods() = pod("old");
  *second.add_pods() = pod("gpu");
  enforcer->synchronize(first.SerializeAsString(), false);
  CHECK(enforcer->running().beyond == 0);  // nothing decided before the end
  enforcer->synchronize(second.SerializeAsString(), true);
  const enforcer::RunningReport report = enforcer->running();
  CHECK(report.beyond == 1);      // c-old: all, with no GPU allocated
  CHECK(report.privileged == 1);  // c-priv
  CHECK(report.unjudged == 1);    // c-orphan: its pod never came
  const auto events = f.pods.events(1);
  REQUIRE(events.size() == 1);
  CHECK_THAT(events[0], Catch::Contains("team-a/old/app"));
  CHECK_THAT(events[0], !Catch::Contains("team-a/gpu/app"));
  // Removed: no longer counted.
  enforcer->remove_container(pod("old").SerializeAsString(), container("old", "c-old", {}).SerializeAsString());
  CHECK(enforcer->running().beyond == 0);
}

TEST_CASE("enforcer core: a Synchronize keeps views of containers awaiting their pod within its byte budget") {
  Fixture f;
  f.kubelet.set("team-a", "p", gpu_pod({}));
  // Room for a few views of containers that set 4 KiB values, and not for the rest: those are counted, and
  // the memory held stays the budget's, however many the runtime sends.
  f.options.sync_pending_bytes = 64 << 10;
  const auto enforcer = f.make();
  api::SynchronizeRequest containers, pods;
  const std::string heavy(4000, '0');
  for (int i = 0; i < 100; ++i) {
    *containers.add_containers() = container("p", std::string("c").append(std::to_string(i)),
                                             {"NVIDIA_VISIBLE_DEVICES=" + heavy, "NVIDIA_IMEX_CHANNELS=" + heavy});
  }
  containers.set_more(true);
  *pods.add_pods() = pod("p");
  enforcer->synchronize(containers.SerializeAsString(), false);
  enforcer->synchronize(pods.SerializeAsString(), true);
  const enforcer::RunningReport report = enforcer->running();
  CHECK(report.beyond >= 1);
  CHECK(report.unjudged > 0);
  CHECK(report.beyond + report.unjudged == 100);
  CHECK(report.beyond <= (64 << 10) / (2 * 4000));  // each view holds its two values: no more than fit
}

TEST_CASE("enforcer core: answers fetched ahead are kept within a byte budget, past which containers ask themselves") {
  Fixture f;
  f.options.prefetch_bytes = 4096;
  enforcement::PodResources large;
  for (int i = 0; i < 40; ++i) large.containers.push_back({std::string(60, 'c').append(std::to_string(i)), {}, {}});
  f.kubelet.set("team-a", "large", large);
  f.kubelet.set("team-a", "small", gpu_pod({kGpu0}));
  const auto enforcer = f.make();
  // One sandbox at a time, so that each has a fetch of its own to wait for (made at once, they may share one).
  enforcer->run_pod_sandbox(pod("large").SerializeAsString());
  test::eventually([&] { return enforcer->prefetch_lists() >= 1; }, 5s, 5ms);
  REQUIRE(enforcer->prefetch_lists() == 1);
  enforcer->run_pod_sandbox(pod("small").SerializeAsString());
  test::eventually([&] { return enforcer->prefetch_lists() >= 2; }, 5s, 5ms);
  REQUIRE(enforcer->prefetch_lists() == 2);
  const int before = f.kubelet.calls();
  // The small pod's answer was kept: its container is created without a call.
  CHECK(written(enforcer->create_container(
            create_request(pod("small"), container("small", "c1", {"NVIDIA_VISIBLE_DEVICES=all"})))) == kGpu0);
  CHECK(f.kubelet.calls() == before);
  // The large one's was over the budget: its container asks.
  api::Container c = container("large", "c2", {"NVIDIA_VISIBLE_DEVICES=all"});
  c.set_name(large.containers[3].name);
  CHECK(written(enforcer->create_container(create_request(pod("large"), c))) == "void");
  CHECK(f.kubelet.calls() == before + 1);
}

TEST_CASE("enforcer core: one container's host paths share one budget of lookups, and the next container has its own") {
  Fixture f;
  f.options.resolve_steps = 2500;
  f.node.cost = 1000;
  const auto enforcer = f.make();
  const auto with_mounts = [](const std::string& id) {
    api::Container c = container("p", id, {"PATH=/usr/bin"});
    for (int i = 0; i < 4; ++i) {
      auto* mount = c.add_mounts();
      mount->set_destination("/m" + std::to_string(i));
      mount->set_source("/srv/m" + std::to_string(i));
      mount->set_type("bind");
    }
    return c;
  };
  f.kubelet.set("team-a", "p", gpu_pod({}));
  enforcer->create_container(create_request(pod("p"), with_mounts("c1")));
  CHECK(f.node.budgets == std::vector<std::size_t>{2500, 1500, 500, 0});
  f.node.budgets.clear();
  enforcer->create_container(create_request(pod("p"), with_mounts("c2")));
  CHECK(f.node.budgets == std::vector<std::size_t>{2500, 1500, 500, 0});
}

TEST_CASE("enforcer core: a Synchronize judges running containers within its time budget, and counts the rest") {
  Fixture f;
  f.kubelet.set("team-a", "p", gpu_pod({}));
  api::SynchronizeRequest sync;
  *sync.add_pods() = pod("p");
  for (int i = 0; i < 10; ++i) {
    *sync.add_containers() = container("p", std::string("c").append(std::to_string(i)), {"NVIDIA_VISIBLE_DEVICES=all"});
  }
  // With its budget: every one judged, each beyond its allocation.
  {
    const auto enforcer = f.make();
    enforcer->synchronize(sync.SerializeAsString(), true);
    CHECK(enforcer->running().beyond == 10);
    CHECK(enforcer->running().unjudged == 0);
  }
  // With none left (the kubelet's List took it all): none judged, every one counted, and answered at once.
  f.options.sync_budget = 0ms;
  const auto enforcer = f.make();
  enforcer->synchronize(sync.SerializeAsString(), true);
  CHECK(enforcer->running().beyond == 0);
  CHECK(enforcer->running().unjudged == 10);
}

TEST_CASE("enforcer core: a Synchronize the runtime gave up on is forgotten, and the next one starts afresh") {
  Fixture f;
  f.kubelet.set("team-a", "p", gpu_pod({}));
  const auto enforcer = f.make();
  api::SynchronizeRequest cut, whole;
  *cut.add_containers() = container("gone", "c-gone", {"NVIDIA_VISIBLE_DEVICES=all"});
  cut.set_more(true);
  enforcer->synchronize(cut.SerializeAsString(), false);
  // NRI's request timeout passed before the last message: the connection ends, and the runtime's next one
  // synchronizes from the start.
  enforcer->connection(false, false, {}, "the runtime closed the connection");
  enforcer->connection(true, true, "containerd", "containerd v2.4.2");
  const int before = f.kubelet.calls();
  *whole.add_pods() = pod("p");
  *whole.add_containers() = container("p", "c1", {"NVIDIA_VISIBLE_DEVICES=all"});
  enforcer->synchronize(whole.SerializeAsString(), true);
  CHECK(f.kubelet.calls() == before + 1);  // the kubelet's List again
  CHECK(enforcer->running().beyond == 1);
  CHECK(enforcer->running().unjudged == 0);  // not the cut one's container, whose pod never came
}

TEST_CASE("enforcer core: the node is read at the runtime's Configure, outside the Synchronize's timeout") {
  Fixture f;
  f.kubelet.set("team-a", "p", gpu_pod({}));
  const auto enforcer = f.make();
  const int at_start = f.node.refreshes;
  enforcer->connection(true, true, "containerd", "containerd v2.4.2");
  CHECK(f.node.refreshes == at_start + 1);
  api::SynchronizeRequest whole;
  *whole.add_pods() = pod("p");
  *whole.add_containers() = container("p", "c1", {"NVIDIA_VISIBLE_DEVICES=all"});
  enforcer->synchronize(whole.SerializeAsString(), true);
  CHECK(f.node.refreshes == at_start + 1);  // not again within the Synchronize
  CHECK(enforcer->running().beyond == 1);   // judged all the same
  // A Configure whose connection then ended is forgotten: the next Synchronize with no Configure before it
  // reads the node itself.
  enforcer->connection(true, true, "containerd", "containerd v2.4.2");
  CHECK(f.node.refreshes == at_start + 2);
  enforcer->connection(false, false, {}, "the runtime closed the connection");
  enforcer->synchronize(whole.SerializeAsString(), true);
  CHECK(f.node.refreshes == at_start + 3);
}

TEST_CASE("enforcer core: every reason a decision gives is a series of its own on /metrics") {
  enforcer::EnforcerMetrics metrics{"test"};
  using Why = enforcement::Decision::Why;
  const std::vector<Why> whys = {Why::enforced,   Why::audited,      Why::off,       Why::exempt,
                                 Why::privileged, Why::cannot_judge, Why::oversized, Why::within};
  for (const Why why : whys) {
    enforcement::Decision decision;
    decision.why = why;
    metrics.count_decision(decision, 0.001);
  }
  const std::string page = metrics.render({}, "enforce");
  for (const Why why : whys) {
    const std::string series = std::string("gpuguard_node_enforcer_decisions_total{action=\"allow\",why=\"")
                                   .append(enforcement::why_name(why))
                                   .append("\"} 1\n");
    INFO(series);
    CHECK_THAT(page, Catch::Contains(series));
  }
}

// A container whose mask runc mounted where its bind mount shows the MPS root starts; one whose mask runc
// resolved elsewhere (through the image's links, or a mount after the bind mount's) is refused at its start;
// one whose mounts cannot be read, too, under nodeEnforcementUnknown: refuse; a privileged one and one
// without masks are let start unread.
TEST_CASE("enforcer core: a container's masks are checked at its start against where its mounts show each MPS root") {
  Fixture f;
  f.node.set_places({{"/run/gpuguard", "0:26", "/gpuguard"}});
  // The host's /run (tmpfs 0:26) comes in below the host's / at /host/root/run.
  const std::string bind =
      "100 90 8:1 / /host/root rw,relatime master:1 - ext4 /dev/sda1 rw\n"
      "101 100 0:26 / /host/root/run rw,nosuid master:2 - tmpfs tmpfs rw\n";
  f.node.mounts[41] = bind + "102 101 0:70 / /host/root/run/gpuguard ro,nosuid - tmpfs tmpfs ro,size=4k\n";
  // The mask landed in the image's own directories, not below the mount.
  f.node.mounts[42] = bind + "102 90 0:70 / /var/h/run/gpuguard ro,nosuid - tmpfs tmpfs ro,size=4k\n";
  // A mask mounted before the mount it should cover hides nothing.
  f.node.mounts[43] = "99 90 0:70 / /host/root/run/gpuguard ro - tmpfs tmpfs ro\n" + bind;
  // A root below a masked root is hidden with it (the device plugin's /run/gpuguard/mps under /run/gpuguard).
  f.node.mounts[46] = bind + "102 101 0:70 / /host/root/run/gpuguard ro,nosuid - tmpfs tmpfs ro,size=4k\n";
  // Spaces in mountinfo are \040: the check reads the paths unescaped.
  f.node.mounts[44] =
      "100 90 0:26 / /host\\040root/run rw - tmpfs tmpfs rw\n"
      "102 100 0:70 / /host\\040root/run/gpuguard ro - tmpfs tmpfs ro\n";
  auto enforcer = f.make();
  const auto start = [&](std::uint32_t pid, bool mask, bool privileged = false) {
    api::Container c = container("agent", "ctr-" + std::to_string(pid), {});
    auto* root = c.add_mounts();
    root->set_destination("/host/root");
    root->set_source("/");
    root->set_type("bind");
    root->add_options("rbind");
    if (mask) {
      auto* m = c.add_mounts();
      m->set_destination("/host/root/run/gpuguard");
      m->set_source("tmpfs");
      m->set_type("tmpfs");
      for (const auto option : enforcement::kMaskOptions) m->add_options(std::string(option));
    }
    if (privileged) {
      auto* rule = c.mutable_linux()->mutable_resources()->add_devices();
      rule->set_allow(true);
      rule->set_access("rwm");
    }
    c.set_pid(pid);
    return enforcer->start_container(create_request(pod("agent"), c));
  };
  CHECK_FALSE(start(41, true));
  const auto diverted = start(42, true);
  REQUIRE(diverted);
  CHECK_THAT(*diverted, Catch::Contains("would show every shared GPU's MPS server"));
  CHECK_THAT(*diverted, Catch::Contains("/host/root/run/gpuguard (/run/gpuguard)"));
  CHECK(start(43, true));
  CHECK_FALSE(start(44, true));
  f.node.set_places({{"/run/gpuguard", "0:26", "/gpuguard"}, {"/run/gpuguard/mps", "0:26", "/gpuguard/mps"}});
  CHECK_FALSE(start(46, true));
  f.node.set_places({{"/run/gpuguard", "0:26", "/gpuguard"}});
  const auto unread = start(45, true);
  REQUIRE(unread);
  CHECK_THAT(*unread, Catch::Contains("whose place cannot be checked: no such process"));
  CHECK_FALSE(start(42, true, true));  // privileged: not held to it
  CHECK_FALSE(start(42, false));       // no mask: nothing to check (the create judged the mount)
  const std::string page = f.metrics.render({}, "enforce");
  CHECK_THAT(page, Catch::Contains("gpuguard_node_enforcer_mask_checks_total{result=\"masked\"} 3"));
  CHECK_THAT(page, Catch::Contains("gpuguard_node_enforcer_mask_checks_total{result=\"unmasked\"} 2"));
  CHECK_THAT(page, Catch::Contains("gpuguard_node_enforcer_mask_checks_total{result=\"unknown\"} 1"));
  // Under audit, reported and started.
  f.policy = std::make_shared<policy::Policy>([] {
    policy::Policy p;
    p.node_enforcement = policy::NodeEnforcement::audit;
    return p;
  }());
  CHECK_FALSE(start(42, true));
}

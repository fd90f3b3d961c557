#include "enforcer_service.hpp"

#include <yaml-cpp/yaml.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "allocation_cache.hpp"
#include "enforcer_metrics.hpp"
#include "gpuguard/deviceplugin/discovery.hpp"
#include "gpuguard/enforcer/allocation.hpp"
#include "gpuguard/enforcer/decision.hpp"
#include "gpuguard/enforcer/kubelet_client.hpp"
#include "gpuguard/enforcer/nri_view.hpp"
#include "gpuguard/files/poller.hpp"
#include "gpuguard/files/read_file.hpp"
#include "gpuguard/kube/request.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/nri/plugin.hpp"
#include "gpuguard/policy/policy_watcher.hpp"
#include "gpuguard/server/http_server.hpp"
#include "nri/v1alpha1/api.pb.h"

namespace gpuguard::enforcer {
namespace {

namespace api = ::nri::pkg::api::v1alpha1;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Each CreateContainer is answered within the runtime's 2 s: at most this for the kubelet's answer...
constexpr auto kKubeletDeadline = 800ms;
// ...and this for the pod's service account, where an exemption names one of its namespace...
constexpr auto kApiDeadline = 300ms;
// ...after waiting at most this for the answer fetched when the pod's sandbox was made.
constexpr auto kFetchedWait = 400ms;
constexpr std::size_t kServiceAccountCache = 1024;
constexpr std::size_t kCdiSpecMax = std::size_t{1} << 20;
constexpr std::size_t kReportedMax = 20;  // containers named in one Node event

// The policy keys the enforcer reads; a bad value of any other is the webhook's to refuse.
const std::set<std::string> kPolicyKeys = {"gpuResources",
                                           "exemptNamespaces",
                                           "exemptServiceAccounts",
                                           "nodeEnforcement",
                                           "nodeEnforcementExemptNamespaces",
                                           "nodeEnforcementExemptServiceAccounts"};

std::vector<NodeGpu> node_gpus(const fs::path& host_root) {
  std::vector<NodeGpu> gpus;
  const deviceplugin::Discovery found = deviceplugin::discover(deviceplugin::DiscoveryMode::automatic, host_root);
  for (const deviceplugin::Gpu& gpu : found.gpus) {
    NodeGpu node{gpu.uuid, gpu.minor, gpu.pci_address, {}};
    for (const deviceplugin::MigDevice& mig : gpu.mig_devices) {
      std::vector<unsigned> caps;
      if (mig.gi_cap_minor) caps.push_back(*mig.gi_cap_minor);
      if (mig.ci_cap_minor) caps.push_back(*mig.ci_cap_minor);
      node.mig_cap_minors[mig.uuid] = std::move(caps);
    }
    gpus.push_back(std::move(node));
  }
  return gpus;
}

// The paths of an object's containerEdits.deviceNodes (a spec's or a device's), where it has them.
std::set<std::string> device_node_paths(const YAML::Node& holder) {
  std::set<std::string> paths;
  const YAML::Node edits = holder["containerEdits"];
  if (!edits || !edits.IsMap() || !edits["deviceNodes"] || !edits["deviceNodes"].IsSequence()) return paths;
  for (const auto& node : edits["deviceNodes"]) {
    if (node.IsMap() && node["path"]) paths.insert(node["path"].as<std::string>());
  }
  return paths;
}

// The device nodes the named CDI devices bring, from the specs in the node's CDI directories: each device's
// own nodes and its spec's common ones.
std::set<std::string> cdi_device_nodes(const fs::path& host_root, const std::set<std::string>& names) {
  std::set<std::string> nodes;
  if (names.empty()) return nodes;
  for (const char* dir : {"/etc/cdi", "/var/run/cdi"}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(deviceplugin::host_path(host_root, dir), ec)) {
      const std::string extension = entry.path().extension().string();
      if ((extension != ".yaml" && extension != ".json") || entry.file_size(ec) > kCdiSpecMax) continue;
      const auto text = files::read_file(entry.path());
      if (!text) continue;
      try {
        const YAML::Node spec = YAML::Load(*text);
        if (!spec.IsMap() || !spec["kind"] || !spec["devices"] || !spec["devices"].IsSequence()) continue;
        const std::string kind = spec["kind"].as<std::string>();
        std::set<std::string> common = device_node_paths(spec);
        for (const auto& device : spec["devices"]) {
          if (!device.IsMap() || !device["name"] || !names.contains(kind + "=" + device["name"].as<std::string>()))
            continue;
          nodes.insert(common.begin(), common.end());
          const std::set<std::string> own = device_node_paths(device);
          nodes.insert(own.begin(), own.end());
        }
      } catch (const YAML::Exception&) {
        // A spec the runtime would not read either: it injects nothing.
      }
    }
  }
  return nodes;
}

// The service accounts of the pods an exemption's namespace holds, from the API server, cached by pod UID.
class ServiceAccounts {
 public:
  explicit ServiceAccounts(std::optional<kube::ApiServer> api) : api_(std::move(api)) {}
  std::string of(const std::string& pod_namespace, const std::string& pod_name, const std::string& uid) {
    if (!api_) return "";
    {
      const std::lock_guard lock(mutex_);
      if (const auto known = cache_.find(uid); known != cache_.end()) return known->second;
    }
    const kube::Reply reply = kube::send_request(
        *api_,
        {"GET", "/api/v1/namespaces/" + pod_namespace + "/pods/" + pod_name, "", "", "gpuguard-node-enforcer", ""},
        kApiDeadline);
    if (reply.status != 200) {
      log::warn("cannot read a pod's service account: its exemption is not applied",
                {{"pod", pod_namespace + "/" + pod_name}, {"status", reply.status}, {"reason", reply.error}});
      return "";
    }
    const auto pod = nlohmann::json::parse(reply.body, nullptr, false);
    // Another pod of the same name (this one deleted meanwhile) says nothing about this one; a static
    // pod's mirror has a UID of its own, and no service account but default.
    const auto metadata = pod.is_object() ? pod.value("metadata", nlohmann::json::object()) : nlohmann::json::object();
    const auto annotations =
        metadata.is_object() ? metadata.value("annotations", nlohmann::json::object()) : nlohmann::json::object();
    const bool mirror = annotations.is_object() && annotations.contains("kubernetes.io/config.mirror");
    if (!mirror && (!metadata.is_object() || metadata.value("uid", std::string()) != uid)) {
      log::warn("the API server's pod of that name is another pod: its exemption is not applied",
                {{"pod", pod_namespace + "/" + pod_name}});
      return "";
    }
    std::string account = "default";
    if (pod.is_object() && pod.contains("spec") && pod["spec"].is_object()) {
      const auto named = pod["spec"].find("serviceAccountName");
      if (named != pod["spec"].end() && named->is_string() && !named->get<std::string>().empty()) account = *named;
    }
    const std::lock_guard lock(mutex_);
    if (cache_.size() >= kServiceAccountCache) cache_.clear();
    cache_[uid] = account;
    return account;
  }

 private:
  std::optional<kube::ApiServer> api_;
  std::mutex mutex_;
  std::map<std::string, std::string> cache_;
};

// Node events saying which running containers see GPUs beyond their allocation.
void post_event(const std::optional<kube::ApiServer>& api, const std::string& node, const std::string& message) {
  if (!api || node.empty()) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
  const nlohmann::json event = {{"apiVersion", "v1"},
                                {"kind", "Event"},
                                {"metadata", {{"generateName", "gpuguard-node-enforcer."}, {"namespace", "default"}}},
                                {"involvedObject", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}},
                                {"reason", "GPUsBeyondAllocation"},
                                {"message", message},
                                {"type", "Warning"},
                                {"source", {{"component", "gpuguard-node-enforcer"}, {"host", node}}},
                                {"firstTimestamp", stamp},
                                {"lastTimestamp", stamp},
                                {"count", 1}};
  const kube::Reply reply = kube::send_request(
      *api,
      {"POST", "/api/v1/namespaces/default/events", "application/json", event.dump(), "gpuguard-node-enforcer", ""},
      3s);
  if (reply.status != 201) {
    log::warn("cannot write the Node event", {{"node", node}, {"status", reply.status}, {"reason", reply.error}});
  }
}

class EnforcerHandler final : public nri::Handler {
 public:
  EnforcerHandler(const EnforcerConfig& config, policy::PolicyWatcher& policy, EnforcerMetrics& metrics)
      : config_(config),
        policy_(policy),
        metrics_(metrics),
        kubelet_(config.pod_resources_socket),
        fetched_(kubelet_, kKubeletDeadline),
        accounts_(config.apiserver),
        gpus_(std::make_shared<const std::vector<NodeGpu>>(node_gpus(config.host_root))) {
    log::info("GPUs found", {{"count", gpus_.load()->size()}, {"host_root", config.host_root.string()}});
  }

  void rediscover() { gpus_.store(std::make_shared<const std::vector<NodeGpu>>(node_gpus(config_.host_root))); }

  void connection(bool registered, const std::string& detail) override {
    if (registered) log::info("registered with the container runtime over NRI", {{"runtime", detail}});
  }

  void synchronize(const api::SynchronizeRequest& request, bool last) override {
    for (const api::PodSandbox& pod : request.pods()) sync_pods_[pod.id()] = pod;
    for (const api::Container& container : request.containers()) sync_containers_.push_back(container);
    if (!last) return;
    report_running();
    sync_pods_.clear();
    sync_containers_.clear();
  }

  nri::CreateResult create_container(const api::PodSandbox& pod, const api::Container& container) override {
    const auto started = Clock::now();
    const std::shared_ptr<const policy::Policy> policy = effective_policy();
    ContainerView view = view_of(pod, container);
    Decision decision;
    try {
      decision = decide_for(view, pod, container, *policy, nullptr);
    } catch (const std::exception& e) {
      // A fault here must not refuse containers: the runtime would refuse them all.
      log::error(
          "decision failed; the container is left as it is",
          {{"pod", view.pod_namespace + "/" + view.pod_name}, {"container", view.container}, {"reason", e.what()}});
      decision.why = Decision::Why::allocation_unknown;
    }
    metrics_.count_decision(decision, std::chrono::duration<double>(Clock::now() - started).count());
    const std::string who = view.pod_namespace + "/" + view.pod_name + "/" + view.container;
    nri::CreateResult result;
    switch (decision.action) {
      case Decision::Action::refuse:
        log::info("container refused", {{"container", who}, {"reason", decision.message}});
        result.refusal = decision.message;
        break;
      case Decision::Action::adjust:
        log::info("container adjusted", {{"container", who}, {"change", decision.message}});
        result.response = visible_devices_adjustment(*decision.visible_devices);
        break;
      case Decision::Action::allow:
        if (decision.why == Decision::Why::audited || decision.why == Decision::Why::privileged) {
          log::info(decision.why == Decision::Why::audited ? "container would be changed (nodeEnforcement: audit)"
                                                           : "privileged container: not confined, reported",
                    {{"container", who}, {"beyond", decision.beyond.front()}});
          remember(container.id(), who, decision);
        } else if (decision.why == Decision::Why::allocation_unknown) {
          log::warn("allocation unknown: the container is left as it is",
                    {{"container", who}, {"reason", decision.message}});
        }
        break;
    }
    return result;
  }

  void run_pod_sandbox(const api::PodSandbox& pod) override { fetched_.fetch(pod.id(), pod.namespace_(), pod.name()); }
  void remove_pod_sandbox(const api::PodSandbox& pod) override { fetched_.forget(pod.id()); }

  void remove_container(const api::PodSandbox&, const api::Container& container) override {
    const std::lock_guard lock(mutex_);
    if (running_.erase(container.id()) != 0) publish_counts();
  }

 private:
  struct Running {
    std::string who;
    bool privileged = false;
  };

  // The policy with the flag's exemptions added, made again only when the ConfigMap changes.
  std::shared_ptr<const policy::Policy> effective_policy() {
    std::shared_ptr<const policy::Policy> current = policy_.current();
    if (config_.exempt_service_accounts.empty()) return current;
    const std::lock_guard lock(mutex_);
    if (current != merged_from_) {
      auto merged = std::make_shared<policy::Policy>(*current);
      auto& accounts = merged->node_enforcement_exempt_service_accounts;
      accounts.insert(accounts.end(), config_.exempt_service_accounts.begin(), config_.exempt_service_accounts.end());
      merged_from_ = current;
      merged_ = std::move(merged);
    }
    return merged_;
  }

  // The decision for one container; `listed` (from one List for all) saves the kubelet a call per container.
  Decision decide_for(ContainerView& view, const api::PodSandbox& pod, const api::Container& container,
                      const policy::Policy& policy, const std::map<std::string, PodResources>* listed) {
    if (policy.node_enforcement == policy::NodeEnforcement::off ||
        policy.is_node_enforcement_exempt(view.pod_namespace, "")) {
      return decide(view, Allocation{}, {}, policy);
    }
    if (policy.names_service_accounts_in(view.pod_namespace)) {
      view.service_account = accounts_.of(view.pod_namespace, view.pod_name, view.pod_uid);
    }
    KubeletAnswer answer;
    if (listed != nullptr) {
      answer.answered = true;
      if (const auto found = listed->find(view.pod_namespace + "/" + view.pod_name); found != listed->end()) {
        answer.pod = found->second;
      }
    } else if (auto fetched = fetched_.answer(pod.id(), kFetchedWait)) {
      answer = std::move(*fetched);
    } else {
      answer = kubelet_.pod(view.pod_namespace, view.pod_name, kKubeletDeadline);
      if (!answer.answered) metrics_.count_kubelet_error();
    }
    Allocation allocation = allocation_for(answer, view.container,
                                           trusted_annotation(annotations_of(container), annotations_of(pod)), policy);
    allocation.device_paths = cdi_device_nodes(config_.host_root, allocation.cdi_devices);
    return decide(view, allocation, *gpus_.load(), policy);
  }

  // At registration: every running container that sees GPUs beyond its allocation, reported. Running
  // containers cannot be changed; they are counted, logged and named in a Node event.
  void report_running() {
    rediscover();
    auto policy = std::make_shared<policy::Policy>(*effective_policy());
    if (policy->node_enforcement == policy::NodeEnforcement::off) return;
    policy->node_enforcement = policy::NodeEnforcement::audit;  // judge, never act
    std::string error;
    const auto listed = kubelet_.all(kKubeletDeadline, error);
    if (!error.empty()) {
      metrics_.count_kubelet_error();
      log::warn("cannot read the kubelet's allocations: running containers are not judged", {{"reason", error}});
      return;
    }
    std::map<std::string, Running> running;
    for (const api::Container& container : sync_containers_) {
      const auto pod = sync_pods_.find(container.pod_sandbox_id());
      if (pod == sync_pods_.end()) continue;
      ContainerView view = view_of(pod->second, container);
      const Decision decision = decide_for(view, pod->second, container, *policy, &listed);
      if (decision.why != Decision::Why::audited && decision.why != Decision::Why::privileged) continue;
      const std::string who = view.pod_namespace + "/" + view.pod_name + "/" + view.container;
      log::warn(decision.why == Decision::Why::privileged ? "running privileged container: not confined"
                                                          : "running container sees GPUs beyond its allocation",
                {{"container", who}, {"beyond", decision.beyond.front()}});
      running[container.id()] = {who, decision.why == Decision::Why::privileged};
    }
    std::string message;
    std::size_t named = 0;
    for (const auto& [id, entry] : running) {
      if (entry.privileged) continue;
      if (named++ < kReportedMax) message.append(message.empty() ? "" : ", ").append(entry.who);
    }
    {
      const std::lock_guard lock(mutex_);
      running_ = std::move(running);
      publish_counts();
    }
    if (named > 0) {
      std::string text = std::to_string(named) +
                         " running containers see GPUs the kubelet did not allocate them, and cannot be changed "
                         "while they run: ";
      text.append(message).append(named > kReportedMax ? ", …" : "");
      // Written beside the connection: Synchronize is answered within the runtime's registration timeout
      // whatever the API server does. One at a time; a report while the last is still being written
      // is only logged.
      if (event_.valid() && event_.wait_for(0s) != std::future_status::ready) {
        log::warn("the last Node event is still being written: this report is only logged");
      } else {
        event_ = std::async(std::launch::async, [api = config_.apiserver, node = config_.node_name,
                                                 text = std::move(text)] { post_event(api, node, text); });
      }
    }
  }

  void remember(const std::string& id, const std::string& who, const Decision& decision) {
    const std::lock_guard lock(mutex_);
    running_[id] = {who, decision.why == Decision::Why::privileged};
    publish_counts();
  }

  void publish_counts() {
    std::size_t privileged = 0;
    for (const auto& [id, entry] : running_) privileged += entry.privileged ? 1 : 0;
    metrics_.set_running(running_.size() - privileged, privileged);
  }

  const EnforcerConfig& config_;
  policy::PolicyWatcher& policy_;
  EnforcerMetrics& metrics_;
  KubeletClient kubelet_;
  AllocationCache fetched_;
  ServiceAccounts accounts_;
  std::atomic<std::shared_ptr<const std::vector<NodeGpu>>> gpus_;
  std::shared_ptr<const policy::Policy> merged_from_, merged_;  // effective_policy's, under mutex_
  std::future<void> event_;                           // the Node event being written; its destructor waits for it
  std::map<std::string, api::PodSandbox> sync_pods_;  // Synchronize's chunks, until the last
  std::vector<api::Container> sync_containers_;
  std::mutex mutex_;
  std::map<std::string, Running> running_;  // by container id
};

// /healthz, /readyz (registered with the runtime) and /metrics, over plain HTTP.
class StatusHandler final : public server::Handler {
 public:
  StatusHandler(const nri::Plugin& plugin, const EnforcerMetrics& metrics, policy::PolicyWatcher& policy)
      : plugin_(plugin), metrics_(metrics), policy_(policy) {}
  std::optional<server::Response> reject_early(const server::RequestHead& head) const override {
    if (server::ProbeRoutes::owns(head.path)) return server::ProbeRoutes::reject_early(head);
    return server::text_response(404, "not found");
  }
  server::Response handle(const server::RequestHead& head, std::string) const override {
    const nri::PluginStats stats = plugin_.stats();
    return server::ProbeRoutes::respond(head.path, stats.registered, [&] {
      return metrics_.render(stats, policy::node_enforcement_name(policy_.current()->node_enforcement));
    });
  }

 private:
  const nri::Plugin& plugin_;
  const EnforcerMetrics& metrics_;
  policy::PolicyWatcher& policy_;
};

}  // namespace

void serve(const EnforcerConfig& config) {
  EnforcerMetrics metrics(GPUGUARD_VERSION);
  policy::PolicyWatcher policy(config.policy_dir, metrics, kPolicyKeys, policy::PolicyWatcher::AtStart::defaults);
  EnforcerHandler handler(config, policy, metrics);
  nri::PluginOptions options;
  options.socket = config.nri_socket;
  options.name = config.plugin_name;
  options.index = config.plugin_index;
  nri::Plugin plugin(options, handler);
  StatusHandler status_handler(plugin, metrics, policy);
  server::ServerOptions server_options;
  server_options.listen_address = config.metrics_address;
  server_options.threads = 1;
  server_options.shutdown_delay = 0ms;
  server_options.shutdown_timeout = 5s;
  server::HttpServer status(server_options, server::TlsProvider{}, status_handler);
  log::info("serving probes and metrics", {{"address", status.bind()}});
  policy.watch(1s);
  files::Poller gpus(60s, [&handler] { handler.rediscover(); });
  std::jthread nri_thread([&plugin](const std::stop_token& stop) { plugin.run(stop); });
  log::info("enforcing at the node", {{"nri_socket", config.nri_socket.string()},
                                      {"plugin", config.plugin_index + "-" + config.plugin_name},
                                      {"pod_resources", config.pod_resources_socket.string()},
                                      {"mode", policy::node_enforcement_name(policy.current()->node_enforcement)}});
  status.run();  // until SIGTERM or SIGINT
  nri_thread.request_stop();
}

}  // namespace gpuguard::enforcer

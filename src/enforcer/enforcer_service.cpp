#include "enforcer_service.hpp"

#include <atomic>
#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "allocation_cache.hpp"
#include "break_glass.hpp"
#include "enforcer_metrics.hpp"
#include "gpuguard/enforcer/allocation.hpp"
#include "gpuguard/enforcer/decision.hpp"
#include "gpuguard/enforcer/kubelet_client.hpp"
#include "gpuguard/enforcer/nri_response.hpp"
#include "gpuguard/enforcer/nri_view.hpp"
#include "gpuguard/files/poller.hpp"
#include "gpuguard/kube/request.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/nri/messages.hpp"
#include "gpuguard/nri/plugin.hpp"
#include "gpuguard/policy/policy_watcher.hpp"
#include "gpuguard/server/http_server.hpp"
#include "node_reader.hpp"
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
constexpr std::size_t kReportedMax = 20;  // containers named in one Node event

// The policy keys the enforcer reads; a bad value of any other is the webhook's to refuse.
const std::set<std::string> kPolicyKeys = {"gpuResources",
                                           "exemptNamespaces",
                                           "exemptServiceAccounts",
                                           "nodeEnforcement",
                                           "nodeEnforcementExemptNamespaces",
                                           "nodeEnforcementExemptServiceAccounts",
                                           "nodeEnforcementUnknown"};

// The pod labels an exemption names ("namespace/name:key=value"): the only labels a view keeps.
std::set<std::string> exemption_label_keys(const policy::Policy& policy) {
  std::set<std::string> keys;
  for (const std::string& entry : policy.node_enforcement_exempt_service_accounts) {
    const std::size_t colon = entry.find(':');
    if (colon != std::string::npos) keys.insert(entry.substr(colon + 1, entry.find('=', colon) - colon - 1));
  }
  return keys;
}

// What the enforcer does with a container it could not judge at all (a request it cannot read, its own
// error): the policy's nodeEnforcementUnknown, refuse by default.
Decision not_judged(const std::string& who, const std::string& why, const policy::Policy& policy) {
  Decision decision;
  decision.why = Decision::Why::cannot_judge;
  decision.message = "gpuguard: container " + who + " could not be judged: " + why;
  if (policy.node_enforcement == policy::NodeEnforcement::enforce &&
      policy.node_enforcement_unknown == policy::NodeEnforcementUnknown::refuse) {
    decision.action = Decision::Action::refuse;
    decision.message += ". The kubelet tries the create again; gpuguard's nodeEnforcementUnknown policy decides this";
  }
  decision.message.resize(std::min(decision.message.size(), kMessageMax));
  return decision;
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

// The allocations found at the last few creates, by sandbox and container ID, for their validations. Bounded: a
// validation that finds nothing (its create was long ago, or the runtime does not validate) asks again.
class RecentAllocations {
 public:
  void put(const std::string& container_id, Allocation allocation) {
    const std::lock_guard lock(mutex_);
    std::erase_if(entries_, [&](const auto& e) { return e.first == container_id; });
    if (entries_.size() >= kKept) entries_.pop_front();
    entries_.emplace_back(container_id, std::move(allocation));
  }
  std::optional<Allocation> take(const std::string& container_id) {
    const std::lock_guard lock(mutex_);
    const auto found =
        std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == container_id; });
    if (found == entries_.end()) return std::nullopt;
    Allocation allocation = std::move(found->second);
    entries_.erase(found);
    return allocation;
  }

 private:
  static constexpr std::size_t kKept = 16;
  std::mutex mutex_;
  std::deque<std::pair<std::string, Allocation>> entries_;
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
  EnforcerHandler(const EnforcerConfig& config, policy::PolicyWatcher& policy, EnforcerMetrics& metrics,
                  const BreakGlass* break_glass)
      : config_(config),
        break_glass_(break_glass),
        policy_(policy),
        metrics_(metrics),
        kubelet_(config.pod_resources_socket),
        fetched_(kubelet_, kKubeletDeadline),
        accounts_(config.apiserver),
        node_(config.host_root, config.mps_roots) {
    publish_node();
  }

  void refresh_node() {
    node_.refresh();
    publish_node();
  }

  void connection(bool registered, bool validating, const std::string& detail) override {
    if (registered) {
      log::info("registered with the container runtime over NRI", {{"runtime", detail}, {"validating", validating}});
      if (!validating) {
        log::warn(
            "the runtime does not show the enforcer each container's final adjustment (NRI before v0.10.0): "
            "devices other NRI plugins add are not judged");
      }
    }
  }

  void synchronize(std::string_view request, bool last) override {
    const std::shared_ptr<const policy::Policy> policy = effective_policy();
    const std::set<std::string> labels = exemption_label_keys(*policy);
    const std::shared_ptr<const NodeView> node = node_.current();
    nri::for_each_field(request, nri::field::kSyncPods, [&](std::string_view pod) {
      PodFacts facts = pod_facts(pod, labels);
      sync_pods_[facts.identity.id] = std::move(facts);
    });
    nri::for_each_field(request, nri::field::kSyncContainers, [&](std::string_view container) {
      if (auto view = container_view(container, *node)) {
        sync_containers_.emplace_back(container_ids(container), std::move(*view));
      }
    });
    if (!last) return;
    report_running();
    sync_pods_.clear();
    sync_containers_.clear();
  }

  nri::CreateResult create_container(std::string_view request) override {
    const auto started = Clock::now();
    const std::shared_ptr<const policy::Policy> policy = effective_policy();
    const std::string_view pod = nri::string_field(request, nri::field::kCreatePod);
    const std::string_view container = nri::string_field(request, nri::field::kCreateContainer);
    const PodIdentity identity = pod_identity(pod);
    const std::string who = identity.pod_namespace + "/" + identity.name + "/" +
                            std::string(nri::string_field(container, nri::field::kContainerName));
    Decision decision;
    try {
      const std::shared_ptr<const NodeView> node = node_.current();
      std::optional<ContainerView> view = view_of(pod, container, *node, exemption_label_keys(*policy));
      decision = view ? decide_for(*view, identity.id, *policy, *node, nullptr,
                                   std::string(nri::string_field(container, nri::field::kContainerId)))
                      : not_judged(who, "the runtime's CreateContainer request does not parse", *policy);
    } catch (const std::exception& e) {
      log::error("decision failed", {{"container", who}, {"reason", e.what()}});
      decision = not_judged(who, std::string("the enforcer's own error: ") + e.what(), *policy);
    }
    metrics_.count_decision(decision, std::chrono::duration<double>(Clock::now() - started).count());
    nri::CreateResult result;
    switch (decision.action) {
      case Decision::Action::refuse:
        log::info("container refused", {{"container", who}, {"reason", decision.message}});
        result.refusal = decision.message;
        break;
      case Decision::Action::adjust:
        log::info("container adjusted", {{"container", who}, {"change", decision.message}});
        result.response = env_adjustment(decision.set_env);
        break;
      case Decision::Action::allow:
        if (decision.why == Decision::Why::audited || decision.why == Decision::Why::privileged) {
          log::info(decision.why == Decision::Why::audited ? "container would be changed (nodeEnforcement: audit)"
                                                           : "privileged container: not confined, reported",
                    {{"container", who}, {"beyond", decision.beyond.front()}});
          remember(std::string(nri::string_field(container, nri::field::kContainerId)), who, decision);
        } else if (decision.why == Decision::Why::cannot_judge) {
          log::warn("container not judged, and left as it is (nodeEnforcementUnknown: allow, or audit)",
                    {{"container", who}, {"reason", decision.message}});
        }
        break;
    }
    return result;
  }

  std::optional<std::string> validate(std::string_view request) override {
    const std::shared_ptr<const policy::Policy> policy = effective_policy();
    const std::string_view pod = nri::string_field(request, nri::field::kValidatePod);
    const std::string_view container = nri::string_field(request, nri::field::kValidateContainer);
    const PodIdentity identity = pod_identity(pod);
    const std::string who = identity.pod_namespace + "/" + identity.name + "/" +
                            std::string(nri::string_field(container, nri::field::kContainerName));
    Decision decision;
    try {
      const std::shared_ptr<const NodeView> node = node_.current();
      std::optional<ContainerView> view = view_of(pod, container, *node, exemption_label_keys(*policy));
      if (view && apply_adjustment(*view, nri::string_field(request, nri::field::kValidateAdjust), *node)) {
        decision = decide_for(*view, identity.id, *policy, *node, nullptr,
                              std::string(nri::string_field(container, nri::field::kContainerId)), true);
      } else {
        decision = not_judged(who, "the runtime's ValidateContainerAdjustment request does not parse", *policy);
      }
    } catch (const std::exception& e) {
      log::error("validation failed", {{"container", who}, {"reason", e.what()}});
      decision = not_judged(who, std::string("the enforcer's own error: ") + e.what(), *policy);
    }
    // What every plugin left must be within: a change still to make means another plugin undid gpuguard's.
    const bool rejected = decision.action != Decision::Action::allow;
    metrics_.count_validation(rejected);
    if (!rejected) return std::nullopt;
    std::string reason =
        decision.action == Decision::Action::refuse
            ? decision.message
            : "gpuguard: container " + who +
                  " would reach GPUs beyond its allocation after every NRI plugin's adjustment: " + decision.message;
    log::info("container adjustment rejected", {{"container", who}, {"reason", reason}});
    reason.resize(std::min(reason.size(), kMessageMax));
    return reason;
  }

  void run_pod_sandbox(std::string_view pod) override {
    const PodIdentity identity = pod_identity(pod);
    fetched_.fetch(identity.id, identity.pod_namespace, identity.name);
  }
  void remove_pod_sandbox(std::string_view pod) override { fetched_.forget(pod_identity(pod).id); }

  void remove_container(std::string_view /*pod*/, std::string_view container) override {
    const std::lock_guard lock(mutex_);
    if (running_.erase(container_ids(container).id) != 0) publish_counts();
  }

 private:
  struct Running {
    std::string who;
    bool privileged = false;
  };

  void publish_node() {
    const std::shared_ptr<const NodeView> node = node_.current();
    metrics_.set_node(node->gpus.size(), node->gpus_unknown.empty());
  }

  // The policy with the flag's exemptions added, and nodeEnforcement off while the break glass is engaged;
  // made again only when the ConfigMap or the break glass changes.
  std::shared_ptr<const policy::Policy> effective_policy() {
    std::shared_ptr<const policy::Policy> current = policy_.current();
    const bool broken = break_glass_ != nullptr && break_glass_->engaged();
    if (config_.exempt_service_accounts.empty() && !broken) return current;
    const std::lock_guard lock(mutex_);
    if (current != merged_from_ || broken != merged_broken_) {
      auto merged = std::make_shared<policy::Policy>(*current);
      auto& accounts = merged->node_enforcement_exempt_service_accounts;
      accounts.insert(accounts.end(), config_.exempt_service_accounts.begin(), config_.exempt_service_accounts.end());
      if (broken) merged->node_enforcement = policy::NodeEnforcement::off;
      merged_from_ = current;
      merged_broken_ = broken;
      merged_ = std::move(merged);
    }
    return merged_;
  }

  // The decision for one container; `listed` (from one List for all) saves the kubelet a call per container.
  // The allocation found at a container's CreateContainer is kept for its validation, which follows at once:
  // the kubelet is asked once per create, not twice.
  Decision decide_for(ContainerView& view, const std::string& sandbox_id, const policy::Policy& policy,
                      const NodeView& node, const std::map<std::string, PodResources>* listed,
                      const std::string& container_id = {}, bool validating = false) {
    if (policy.node_enforcement == policy::NodeEnforcement::off ||
        policy.is_node_enforcement_exempt(view.pod_namespace, "")) {
      return decide(view, Allocation{}, node, policy);
    }
    if (policy.names_service_accounts_in(view.pod_namespace)) {
      view.service_account = accounts_.of(view.pod_namespace, view.pod_name, view.pod_uid);
    }
    std::optional<Allocation> allocation;
    const std::string key = sandbox_id + "/" + container_id;
    if (validating) allocation = recent_.take(key);
    if (!allocation) {
      KubeletAnswer answer;
      if (listed != nullptr) {
        answer.answered = true;
        if (const auto found = listed->find(view.pod_namespace + "/" + view.pod_name); found != listed->end()) {
          answer.pod = found->second;
        }
      } else if (auto fetched = fetched_.answer(sandbox_id, kFetchedWait)) {
        answer = std::move(*fetched);
      } else {
        answer = kubelet_.pod(view.pod_namespace, view.pod_name, kKubeletDeadline);
        if (!answer.answered) metrics_.count_kubelet_error();
      }
      allocation =
          allocation_for(answer, view.container, trusted_annotation(view.annotations, view.pod_annotations), policy);
      for (const std::string& name : allocation->cdi_devices) {
        if (const auto spec = node.cdi_devices.find(name); spec != node.cdi_devices.end()) {
          allocation->device_paths.insert(spec->second.begin(), spec->second.end());
        }
      }
      if (!validating && !container_id.empty()) recent_.put(key, *allocation);
    }
    return decide(view, *allocation, node, policy);
  }

  // At registration: every running container that sees GPUs beyond its allocation, reported. Running
  // containers cannot be changed; they are counted, logged and named in a Node event.
  void report_running() {
    refresh_node();
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
    const std::shared_ptr<const NodeView> node = node_.current();
    std::map<std::string, Running> running;
    for (auto& [ids, view] : sync_containers_) {
      const auto pod = sync_pods_.find(ids.sandbox_id);
      if (pod == sync_pods_.end()) continue;
      set_pod(view, pod->second);
      const Decision decision = decide_for(view, ids.sandbox_id, *policy, *node, &listed);
      if (decision.why != Decision::Why::audited && decision.why != Decision::Why::privileged) continue;
      const std::string who = view.pod_namespace + "/" + view.pod_name + "/" + view.container;
      log::warn(decision.why == Decision::Why::privileged ? "running privileged container: not confined"
                                                          : "running container sees GPUs beyond its allocation",
                {{"container", who}, {"beyond", decision.beyond.front()}});
      running[ids.id] = {who, decision.why == Decision::Why::privileged};
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
        event_ = std::async(std::launch::async, [api = config_.apiserver, node_name = config_.node_name,
                                                 text = std::move(text)] { post_event(api, node_name, text); });
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
  const BreakGlass* break_glass_;  // none without the API
  policy::PolicyWatcher& policy_;
  EnforcerMetrics& metrics_;
  KubeletClient kubelet_;
  AllocationCache fetched_;
  RecentAllocations recent_;
  ServiceAccounts accounts_;
  NodeReader node_;
  std::shared_ptr<const policy::Policy> merged_from_, merged_;  // effective_policy's, under mutex_
  bool merged_broken_ = false;                                  // the break glass merged_ was made with
  std::future<void> event_;                    // the Node event being written; its destructor waits for it
  std::map<std::string, PodFacts> sync_pods_;  // Synchronize's chunks, until the last
  std::vector<std::pair<ContainerIds, ContainerView>> sync_containers_;
  std::mutex mutex_;
  std::map<std::string, Running> running_;  // by container id
};

// /healthz, /readyz (registered with the runtime, or the runtime serves no NRI: nothing to wait for, and
// the metrics say the node is not enforced) and /metrics, over plain HTTP.
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
    const bool ready = stats.registered || !stats.nri_served;
    return server::ProbeRoutes::respond(
        head.path, ready,
        [&] { return metrics_.render(stats, policy::node_enforcement_name(policy_.current()->node_enforcement)); },
        stats.nri_served ? "" : "not enforced: the container runtime serves no NRI socket");
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
  std::unique_ptr<BreakGlass> break_glass;
  if (config.apiserver && !config.break_glass_name.empty()) {
    break_glass =
        std::make_unique<BreakGlass>(*config.apiserver, config.break_glass_namespace, config.break_glass_name);
  }
  EnforcerHandler handler(config, policy, metrics, break_glass.get());
  nri::PluginOptions options;
  options.socket = config.nri_socket;
  options.unserved_after = config.nri_unserved_after;
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
  files::Poller node(60s, [&handler] { handler.refresh_node(); });
  // Said once when the break glass is engaged and once when it is released; the metric follows it.
  std::optional<files::Poller> glass;
  if (break_glass) {
    break_glass->start();
    glass.emplace(1s, [&break_glass, &metrics, engaged = false]() mutable {
      if (break_glass->engaged() == engaged) return;
      engaged = !engaged;
      metrics.set_break_glass(engaged);
      if (engaged) {
        log::warn("break glass engaged: every container is created as it is, nothing enforced or refused",
                  {{"configmap", break_glass->describe()}});
      } else {
        log::info("break glass released: enforcing as the policy says", {{"configmap", break_glass->describe()}});
      }
    });
  }
  std::jthread nri_thread([&plugin](const std::stop_token& stop) { plugin.run(stop); });
  log::info("enforcing at the node", {{"nri_socket", config.nri_socket.string()},
                                      {"plugin", config.plugin_index + "-" + config.plugin_name},
                                      {"pod_resources", config.pod_resources_socket.string()},
                                      {"mode", policy::node_enforcement_name(policy.current()->node_enforcement)}});
  status.run();  // until SIGTERM or SIGINT
  nri_thread.request_stop();
}

}  // namespace gpuguard::enforcer

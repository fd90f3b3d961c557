// gpuguard-node-enforcer's core (include/gpuguard/enforcer/enforcer.hpp).
#include "gpuguard/enforcer/enforcer.hpp"

#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>

#include "gpuguard/enforcement/mask_hook.hpp"
#include "gpuguard/enforcer/allocation_cache.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/nri/container_response.hpp"
#include "gpuguard/nri/container_view.hpp"
#include "gpuguard/nri/messages.hpp"
#include "nri/v1alpha1/api.pb.h"

namespace gpuguard::enforcer {
namespace {

using enforcement::kMessageMax;
using enforcement::kNameMax;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// For the log, which says durations in whole milliseconds.
long long whole_ms(Clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

constexpr std::size_t kServiceAccountCache = 1024;
constexpr std::size_t kReportedMax = 20;        // containers named in one Node event
constexpr std::size_t kUnlistedSaidMax = 1024;  // pods remembered as said to hold unlisted GPU infrastructure
constexpr std::size_t kUidMax = 64;             // a pod's UID is 36 characters; a longer one is not remembered
constexpr std::size_t kPodEventsWaiting = 16;   // pod events waiting for the API server; more are only logged
constexpr std::size_t kSyncPodsMax = 4096;      // pods a Synchronize remembers until its last chunk
constexpr std::size_t kSyncListedBytes = std::size_t{8} << 20;  // the kubelet's pods it keeps for its judgments

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

std::string who_of(const nri::PodIdentity& pod, std::string_view container) {
  return pod.pod_namespace + "/" + pod.name + "/" + std::string(container.substr(0, kNameMax));
}

// The service accounts of the pods an exemption's namespace holds, cached by pod UID.
class ServiceAccounts {
 public:
  explicit ServiceAccounts(PodDirectory& pods) : pods_(pods) {}
  std::string of(const std::string& pod_namespace, const std::string& pod_name, const std::string& uid) {
    {
      const std::lock_guard lock(mutex_);
      if (const auto known = cache_.find(uid); known != cache_.end()) return known->second;
    }
    std::string account = pods_.service_account(pod_namespace, pod_name, uid);
    if (account.empty()) return account;  // not cached: asked again at the next container
    const std::lock_guard lock(mutex_);
    if (cache_.size() >= kServiceAccountCache) cache_.clear();
    cache_[uid] = account;
    return account;
  }

 private:
  PodDirectory& pods_;
  std::mutex mutex_;
  std::map<std::string, std::string> cache_;
};

// The allocations found at the last few creates, by sandbox and container ID, for their validations.
// Bounded: a validation that finds nothing (its create was long ago, or the runtime does not validate)
// asks again.
class RecentAllocations {
 public:
  void put(const std::string& key, Allocation allocation) {
    const std::lock_guard lock(mutex_);
    std::erase_if(entries_, [&](const auto& e) { return e.first == key; });
    if (entries_.size() >= kKept) entries_.pop_front();
    entries_.emplace_back(key, std::move(allocation));
  }
  std::optional<Allocation> take(const std::string& key) {
    const std::lock_guard lock(mutex_);
    const auto found = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == key; });
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

// A running container reported: beyond its allocation, or privileged. Its name is kept only for the first
// few, which the Node event names: an entry costs its ID and a flag, whatever the container holds.
using Running = std::map<std::string, bool>;  // container ID -> privileged

}  // namespace

struct Enforcer::Impl {
  Impl(EnforcerOptions o, PodResourcesSource& k, PodDirectory& p, NodeState& n, PolicySource ps, BreakGlass bg,
       EnforcerMetrics& m)
      : options(std::move(o)),
        kubelet(k),
        pods(p),
        node(n),
        policy_source(std::move(ps)),
        break_glass(std::move(bg)),
        metrics(m),
        accounts(p),
        fetched(k, options.kubelet_deadline, options.prefetch_capacity, options.prefetch_bytes) {}

  EnforcerOptions options;
  PodResourcesSource& kubelet;
  PodDirectory& pods;
  NodeState& node;
  PolicySource policy_source;
  BreakGlass break_glass;
  EnforcerMetrics& metrics;
  ServiceAccounts accounts;
  RecentAllocations recent;
  AllocationCache fetched;

  mutable std::mutex mutex;
  std::shared_ptr<const policy::Policy> merged_from, merged;  // effective_policy's
  bool merged_broken = false;                                 // the break glass merged was made with
  // The runtime is CRI-O (its Configure said so): only there is CRI-O's copy of a container's annotations
  // the runtime's own. Touched only on the runtime's thread.
  bool crio = false;
  Running running;  // reported, by container ID
  RunningReport report;
  std::future<void> event;  // the Node event being written; its destructor waits for it
  // The pods said to hold GPU infrastructure in a namespace its entry does not name, by UID: once a pod,
  // whichever of its containers came first. Touched only on the runtime's thread; forgotten whole at
  // kUnlistedSaidMax, so that a flood holds no more.
  std::set<std::string> unlisted_said;
  // Their pod events, written one after another off the runtime's thread; at most kPodEventsWaiting wait.
  struct PodEvent {
    nri::PodIdentity pod;
    std::string message;
  };
  std::mutex pod_events_mutex;
  std::deque<PodEvent> pod_events_waiting;  // guarded by pod_events_mutex
  bool pod_events_writing = false;          // guarded by pod_events_mutex
  std::future<void> pod_events;             // the writer; its destructor waits for it

  // The pod events still waiting are dropped: a stop waits for the one being written alone.
  ~Impl() {
    const std::lock_guard lock(pod_events_mutex);
    pod_events_waiting.clear();
  }

  // One Synchronize, from its first chunk to its last: the pods seen, the decisions made, and the views of
  // containers whose pod has not come yet (NRI splits pods and containers apart when they do not fit one
  // message). Touched only on the runtime's thread.
  struct Sync {
    bool started = false;
    bool node_read_at_configure = false;  // the node was read at this connection's Configure (connection())
    bool judging = false;                 // nodeEnforcement is not off, and the kubelet answered
    std::shared_ptr<const policy::Policy> policy;
    std::shared_ptr<const NodeView> node;
    std::set<std::string> label_keys;
    std::map<std::string, PodResources> listed;  // by "namespace/name"
    bool listed_whole = true;                    // every pod the kubelet listed was kept (within kSyncListedBytes)
    std::map<std::string, nri::PodFacts> pods;   // by sandbox ID
    std::vector<std::pair<nri::ContainerIds, ContainerView>> pending;
    std::size_t pending_bytes = 0;  // enforcement::view_bytes of the views in `pending`
    Running found;
    std::vector<std::string> named;  // the first kReportedMax beyond, "namespace/pod/container"
    std::size_t unjudged = 0;
    Clock::time_point until;  // judging stops then (sync_budget)
    // For the log: NRI gives the whole Synchronize one request timeout, and this is the enforcer's part of it.
    // Its parts, where an admin asks whose the time was: the node read, the kubelet's List, and reading the
    // containers (host paths looked up among it).
    Clock::time_point began;
    Clock::duration handled{}, node_read{}, kubelet_list{}, views_read{};
    std::size_t messages = 0;
  } sync;

  // A resolver for one container's view: its bind mounts share one budget of lookups.
  nri::HostPathResolver resolver() {
    return [this, steps_left = options.resolve_steps](std::string_view path) mutable {
      return node.resolve(path, steps_left);
    };
  }

  std::shared_ptr<const policy::Policy> effective_policy() {
    std::shared_ptr<const policy::Policy> current = policy_source();
    const bool broken = break_glass && break_glass();
    if (options.exempt_service_accounts.empty() && !broken) return current;
    const std::lock_guard lock(mutex);
    if (current != merged_from || broken != merged_broken) {
      auto next = std::make_shared<policy::Policy>(*current);
      auto& accounts_list = next->node_enforcement_exempt_service_accounts;
      accounts_list.insert(accounts_list.end(), options.exempt_service_accounts.begin(),
                           options.exempt_service_accounts.end());
      if (broken) next->node_enforcement = policy::NodeEnforcement::off;
      merged_from = current;
      merged_broken = broken;
      merged = std::move(next);
    }
    return merged;
  }

  // The container's allocation: the one its create found, for its validation; else from `listed` (one List
  // for a whole Synchronize), the answer fetched when its sandbox was made, or the kubelet asked now.
  Allocation allocation_of(const ContainerView& view, const std::string& sandbox_id, const std::string& container_id,
                           const policy::Policy& policy, const NodeView& node_view,
                           const std::map<std::string, PodResources>* listed, bool validating) {
    const std::string key = sandbox_id + "/" + container_id;
    if (validating) {
      if (std::optional<Allocation> found = recent.take(key)) return std::move(*found);
    }
    KubeletAnswer answer;
    if (listed != nullptr) {
      answer.answered = true;
      if (const auto found = listed->find(view.pod_namespace + "/" + view.pod_name); found != listed->end()) {
        answer.pod = found->second;
      }
    } else if (auto prefetched = fetched.answer(sandbox_id, options.fetched_wait)) {
      answer = std::move(*prefetched);
    } else {
      answer = pod_answer(kubelet, view.pod_namespace, view.pod_name, options.kubelet_deadline);
      if (!answer.answered) metrics.count_kubelet_error();
    }
    Allocation allocation = allocation_for(answer, view.container, trusted_annotation(view, crio), policy);
    for (const std::string& name : allocation.cdi_devices) {
      if (const auto spec = node_view.cdi_devices.find(name); spec != node_view.cdi_devices.end()) {
        allocation.device_paths.insert(spec->second.begin(), spec->second.end());
      }
    }
    if (!validating && !container_id.empty()) recent.put(key, allocation);
    return allocation;
  }

  // The pod's service account, asked of the API server only where an exemption could exempt it by it.
  void find_account(ContainerView& view, const policy::Policy& policy) {
    if (policy.names_service_accounts_for(view.pod_namespace, view.pod_labels)) {
      view.service_account = accounts.of(view.pod_namespace, view.pod_name, view.pod_uid);
    }
  }

  Decision decide_for(ContainerView& view, const std::string& sandbox_id, const std::string& container_id,
                      const policy::Policy& policy, const NodeView& node_view,
                      const std::map<std::string, PodResources>* listed, bool validating) {
    if (policy.node_enforcement == policy::NodeEnforcement::off ||
        policy.is_node_enforcement_exempt(view.pod_namespace, "")) {
      return decide(view, Allocation{}, node_view, policy);
    }
    find_account(view, policy);
    view.masks_checked = !crio || !options.mask_hook.empty();
    // Over the size NRI can show at a registration: decided on its size alone, the kubelet not asked.
    if (view.nri_bytes > enforcement::kNriContainerBytesMax) return decide(view, Allocation{}, node_view, policy);
    const Allocation allocation = allocation_of(view, sandbox_id, container_id, policy, node_view, listed, validating);
    return decide(view, allocation, node_view, policy);
  }

  // The mask check's hook for a decision with masks, on CRI-O; none otherwise (containerd's is the start).
  // The places it is told are those of the node view the masks were decided on. A privileged container is
  // not held to its masks, as to nothing else (start_container): no hook.
  std::vector<std::string> mask_hook_for(const Decision& decision, const NodeView& view,
                                         const policy::Policy& policy) const {
    if (!crio || decision.masks.empty() || options.mask_hook.empty() || decision.why == Decision::Why::privileged) {
      return {};
    }
    const bool unknown_allowed = policy.node_enforcement_unknown == policy::NodeEnforcementUnknown::allow;
    return enforcement::mask_hook_args(options.mask_hook, {view.mps_root_places, unknown_allowed});
  }

  void remember(const std::string& id, const Decision& decision) {
    const std::lock_guard lock(mutex);
    running[id] = decision.why == Decision::Why::privileged;
    publish_counts();
  }

  void publish_counts() {
    std::size_t privileged = 0;
    for (const auto& [id, is_privileged] : running) privileged += is_privileged ? 1 : 0;
    report.beyond = running.size() - privileged;
    report.privileged = privileged;
    metrics.set_running(report.beyond, report.privileged, report.unjudged);
  }

  // --- Synchronize ---

  void begin_sync() {
    const auto began = Clock::now();
    // A Synchronize without a Configure (the unit tests') reads the node now.
    const Clock::duration node_read = sync.node_read_at_configure ? Clock::duration{} : read_node();
    sync = Sync{};
    sync.started = true;
    sync.began = began;
    sync.node_read = node_read;
    sync.until = sync.began + options.sync_budget;
    auto audit = std::make_shared<policy::Policy>(*effective_policy());
    if (audit->node_enforcement == policy::NodeEnforcement::off) return;
    audit->node_enforcement = policy::NodeEnforcement::audit;  // judge, never act
    sync.policy = std::move(audit);
    sync.node = node.current();
    sync.label_keys = exemption_label_keys(*sync.policy);
    std::size_t listed_bytes = 0;
    const auto listing = Clock::now();
    const std::string error = kubelet.list(
        options.kubelet_deadline, [](std::string_view, std::string_view) { return true; },
        [&](std::string_view ns, std::string_view name, PodResources pod) {
          const std::size_t bytes = answer_bytes(KubeletAnswer{true, pod, {}});
          if (listed_bytes + bytes > kSyncListedBytes) {
            sync.listed_whole = false;  // its containers are not judged: a pod not kept is not "not listed"
            return;
          }
          listed_bytes += bytes;
          sync.listed[std::string(ns).append("/").append(name)] = std::move(pod);
        });
    sync.kubelet_list = Clock::now() - listing;
    if (!error.empty()) {
      metrics.count_kubelet_error();
      log::warn("cannot read the kubelet's allocations: running containers are not judged", {{"reason", error}});
      sync.listed.clear();
      return;
    }
    sync.judging = true;
  }

  void judge_running(const nri::ContainerIds& ids, ContainerView& view) {
    const auto pod = sync.pods.find(ids.sandbox_id);
    nri::set_pod(view, pod->second);
    if (!sync.listed_whole && !sync.listed.contains(view.pod_namespace + "/" + view.pod_name)) {
      ++sync.unjudged;
      return;
    }
    const Decision decision = decide_for(view, ids.sandbox_id, {}, *sync.policy, *sync.node, &sync.listed, false);
    if (decision.why != Decision::Why::audited && decision.why != Decision::Why::privileged) return;
    const std::string who = view.pod_namespace + "/" + view.pod_name + "/" + view.container;
    log::warn(decision.why == Decision::Why::privileged ? "running privileged container: not confined"
                                                        : "running container sees GPUs beyond its allocation",
              {{"container", who}, {"beyond", decision.beyond.front()}});
    const bool privileged = decision.why == Decision::Why::privileged;
    sync.found[ids.id] = privileged;
    if (!privileged && sync.named.size() < kReportedMax) sync.named.push_back(who);
  }

  void judge_pending_with_pods() {
    std::erase_if(sync.pending, [&](auto& entry) {
      if (!sync.pods.contains(entry.first.sandbox_id)) return false;
      sync.pending_bytes -= enforcement::view_bytes(entry.second);
      judge_running(entry.first, entry.second);
      return true;
    });
  }

  void sync_chunk(std::string_view request) {
    nri::for_each_field(request, nri::field::kSyncPods, [&](std::string_view pod) {
      nri::PodFacts facts = nri::pod_facts(pod, sync.label_keys);
      if (sync.pods.size() < kSyncPodsMax) sync.pods[facts.identity.id] = std::move(facts);
    });
    judge_pending_with_pods();
    nri::for_each_field(request, nri::field::kSyncContainers, [&](std::string_view container) {
      const nri::ContainerIds ids = nri::container_ids(container);
      std::optional<ContainerView> view;
      if (const auto reading = Clock::now(); reading < sync.until) {
        view = nri::container_view(container, *sync.node, resolver());
        sync.views_read += Clock::now() - reading;
      }
      if (view && sync.pods.contains(ids.sandbox_id)) {
        judge_running(ids, *view);
        return;
      }
      const std::size_t bytes = view ? enforcement::view_bytes(*view) : 0;
      if (view && sync.pending_bytes + bytes <= options.sync_pending_bytes) {
        sync.pending_bytes += bytes;
        sync.pending.emplace_back(ids, std::move(*view));
        return;
      }
      ++sync.unjudged;  // past the time budget, not parsed, or past the pending views' budget
    });
  }

  void end_sync() {
    sync.unjudged += sync.pending.size();  // their pod never came
    if (sync.unjudged > 0) {
      log::warn("running containers not judged at registration", {{"containers", sync.unjudged}});
    }
    log::info("synchronized with the runtime", {{"messages", sync.messages},
                                                {"enforcer_ms", whole_ms(sync.handled)},
                                                {"node_ms", whole_ms(sync.node_read)},
                                                {"kubelet_ms", whole_ms(sync.kubelet_list)},
                                                {"containers_ms", whole_ms(sync.views_read)},
                                                {"elapsed_ms", whole_ms(Clock::now() - sync.began)}});
    std::size_t named = 0;
    for (const auto& [id, privileged] : sync.found) named += privileged ? 0 : 1;
    std::string message;
    for (const std::string& who : sync.named) message.append(message.empty() ? "" : ", ").append(who);
    {
      const std::lock_guard lock(mutex);
      running = std::move(sync.found);
      report.unjudged = sync.unjudged;
      publish_counts();
    }
    sync = Sync{};
    if (named == 0) return;
    std::string text = std::to_string(named) +
                       " running containers see GPUs the kubelet did not allocate them, and cannot be changed while "
                       "they run: ";
    text.append(message).append(named > kReportedMax ? ", …" : "");
    // Written beside the connection: Synchronize is answered within the runtime's registration timeout
    // whatever the API server does. One at a time; a report while the last is still being written is only
    // logged.
    if (event.valid() && event.wait_for(0s) != std::future_status::ready) {
      log::warn("the last Node event is still being written: this report is only logged");
    } else {
      event = std::async(std::launch::async, [this, text = std::move(text)] { pods.node_event(text); });
    }
  }

  // A container carries a GPU infrastructure entry's label in a namespace the entry does not name: a Warning
  // event on its pod says so, once a pod, beside the counter and the log (which say it at every container).
  // Written beside the connection, as the Node event is: the runtime's answer never waits for the API server,
  // and nothing here can change the decision made (noexcept: a thread that cannot start is logged).
  // The event names the entry's label only: the entry's namespace and account are the admin's, not the
  // pod's owner's to read. A static pod's UID is its own, not its mirror's: `kubectl describe` of the
  // mirror does not show it, `kubectl get events` does.
  void say_unlisted(const nri::PodIdentity& pod, const std::string& entry) noexcept try {
    if (pod.uid.empty() || pod.uid.size() > kUidMax || unlisted_said.contains(pod.uid)) return;
    if (unlisted_said.size() >= kUnlistedSaidMax) unlisted_said.clear();
    unlisted_said.insert(pod.uid);
    PodEvent said{pod, "Carries the label " + entry.substr(entry.find(':') + 1) +
                           " of a GPU infrastructure exemption whose namespaces do not include " + pod.pod_namespace +
                           ": its containers are enforced as any pod's. Where this is NVIDIA's component (or "
                           "gpuguard's), the admin names the namespace in gpuInfrastructure."};
    const std::lock_guard lock(pod_events_mutex);
    if (pod_events_waiting.size() >= kPodEventsWaiting) {
      log::warn("too many pod events waiting to be written: this one is only logged",
                {{"pod", pod.pod_namespace + "/" + pod.name}});
      return;
    }
    pod_events_waiting.push_back(std::move(said));
    if (pod_events_writing) return;
    pod_events = std::async(std::launch::async, [this] { write_pod_events(); });
    pod_events_writing = true;
  } catch (const std::exception& e) {
    log::warn("the pod event is not written", {{"pod", pod.pod_namespace + "/" + pod.name}, {"reason", e.what()}});
  }

  // Until none waits. A failed write is logged and the next one tried.
  void write_pod_events() {
    for (;;) {
      PodEvent next;
      {
        const std::lock_guard lock(pod_events_mutex);
        if (pod_events_waiting.empty()) {
          pod_events_writing = false;
          return;
        }
        next = std::move(pod_events_waiting.front());
        pod_events_waiting.pop_front();
      }
      try {
        pods.pod_event(next.pod.pod_namespace, next.pod.name, next.pod.uid, next.message);
      } catch (const std::exception& e) {
        log::warn("the pod event is not written",
                  {{"pod", next.pod.pod_namespace + "/" + next.pod.name}, {"reason", e.what()}});
      }
    }
  }

  // The node read again and published; how long it took.
  Clock::duration read_node() {
    const auto began = Clock::now();
    node.refresh();
    publish_node();
    return Clock::now() - began;
  }

  void publish_node() {
    const std::shared_ptr<const NodeView> current = node.current();
    metrics.set_node(current->gpus.size(), current->gpus_unknown.empty());
  }
};

Enforcer::Enforcer(EnforcerOptions options, PodResourcesSource& kubelet, PodDirectory& pods, NodeState& node,
                   PolicySource policy, BreakGlass break_glass, EnforcerMetrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(options), kubelet, pods, node, std::move(policy), std::move(break_glass),
                                   metrics)) {
  impl_->publish_node();
}

Enforcer::~Enforcer() = default;

void Enforcer::refresh_node() { impl_->read_node(); }

RunningReport Enforcer::running() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->report;
}

std::size_t Enforcer::prefetch_lists() { return impl_->fetched.lists(); }

std::shared_ptr<const policy::Policy> Enforcer::effective_policy() { return impl_->effective_policy(); }

void Enforcer::connection(bool registered, bool validating, const std::string& runtime, const std::string& detail) {
  // A Synchronize the runtime gave up on (its request timeout passed between two messages) is forgotten:
  // the next connection's starts afresh, with its own node read, kubelet List and time budget.
  impl_->sync = Impl::Sync{};
  if (!registered) return;
  // The node is read here, within the Configure's own request timeout, not the Synchronize's: NRI gives a whole
  // Synchronize one timeout, and the node read took 183 ms of the enforcer's 694 there on CI's loaded node.
  const Clock::duration node_read = impl_->read_node();
  impl_->sync.node_read_at_configure = true;
  impl_->crio = runtime == "cri-o";
  log::info("registered with the container runtime over NRI",
            {{"runtime", detail}, {"validating", validating}, {"node_ms", whole_ms(node_read)}});
  if (!validating) {
    log::warn(
        "the runtime does not show the enforcer each container's final adjustment (NRI before v0.10.0): "
        "devices other NRI plugins add are not judged");
  }
}

void Enforcer::synchronize(std::string_view request, bool last) {
  Impl& impl = *impl_;
  const auto received = Clock::now();
  if (!impl.sync.started) impl.begin_sync();
  if (impl.sync.judging) {
    impl.sync_chunk(request);
  } else if (impl.sync.policy) {
    nri::for_each_field(request, nri::field::kSyncContainers, [&](std::string_view) { ++impl.sync.unjudged; });
  }
  ++impl.sync.messages;
  impl.sync.handled += Clock::now() - received;
  if (last) impl.end_sync();
}

nri::CreateResult Enforcer::create_container(std::string_view request) {
  Impl& impl = *impl_;
  const auto started = Clock::now();
  const std::shared_ptr<const policy::Policy> policy = impl.effective_policy();
  const std::string_view pod = nri::string_field(request, nri::field::kCreatePod);
  const std::string_view container = nri::string_field(request, nri::field::kCreateContainer);
  const nri::PodIdentity identity = nri::pod_identity(pod);
  const std::string who = who_of(identity, nri::string_field(container, nri::field::kContainerName));
  const std::string container_id = nri::container_ids(container).id;
  Decision decision;
  std::string unlisted;  // the entry a container looks like, in a namespace it does not name
  const std::shared_ptr<const NodeView> node = impl.node.current();
  try {
    std::optional<ContainerView> view =
        nri::view_of(pod, container, *node, exemption_label_keys(*policy), impl.resolver());
    decision = view ? impl.decide_for(*view, identity.id, container_id, *policy, *node, nullptr, false)
                    : not_judged(who, "the runtime's CreateContainer request does not parse", *policy);
    if (view && decision.why != Decision::Why::exempt) {
      // NVIDIA's chart (or gpuguard's) installed in a namespace its entry does not name: said, not exempted.
      if (const std::string entry = policy->unlisted_infrastructure(view->pod_namespace, view->pod_labels);
          !entry.empty()) {
        impl.metrics.count_unlisted_infrastructure();
        log::warn("GPU infrastructure in a namespace its exemption does not name: enforced as any pod",
                  {{"container", who}, {"looks_like", entry}});
        unlisted = entry;
      }
    }
  } catch (const std::exception& e) {
    log::error("decision failed", {{"container", who}, {"reason", e.what()}});
    decision = not_judged(who, std::string("the enforcer's own error: ") + e.what(), *policy);
  }
  if (!unlisted.empty()) impl.say_unlisted(identity, unlisted);
  impl.metrics.count_decision(decision, std::chrono::duration<double>(Clock::now() - started).count());
  nri::CreateResult result;
  switch (decision.action) {
    case Decision::Action::refuse:
      log::info("container refused", {{"container", who}, {"reason", decision.message}});
      result.refusal = decision.message;
      break;
    case Decision::Action::adjust:
      log::info("container adjusted", {{"container", who}, {"change", decision.message}});
      result.response = nri::adjustment(decision.set_env, decision.masks, impl.mask_hook_for(decision, *node, *policy));
      impl.metrics.count_masks(decision.masks.size());
      if (decision.why == Decision::Why::privileged) impl.remember(container_id, decision);
      break;
    case Decision::Action::allow:
      if (decision.why == Decision::Why::audited || decision.why == Decision::Why::privileged) {
        log::info(decision.why == Decision::Why::audited ? "container would be changed (nodeEnforcement: audit)"
                                                         : "privileged container: not confined, reported",
                  {{"container", who}, {"beyond", decision.beyond.front()}});
        impl.remember(container_id, decision);
      } else if (decision.why == Decision::Why::cannot_judge) {
        log::warn("container not judged, and left as it is (nodeEnforcementUnknown: allow, or audit)",
                  {{"container", who}, {"reason", decision.message}});
      }
      break;
  }
  return result;
}

std::optional<std::string> Enforcer::validate(std::string_view request) {
  Impl& impl = *impl_;
  const std::shared_ptr<const policy::Policy> policy = impl.effective_policy();
  const std::string_view pod = nri::string_field(request, nri::field::kValidatePod);
  const std::string_view container = nri::string_field(request, nri::field::kValidateContainer);
  const nri::PodIdentity identity = nri::pod_identity(pod);
  const std::string who = who_of(identity, nri::string_field(container, nri::field::kContainerName));
  Decision decision;
  try {
    const std::shared_ptr<const NodeView> node = impl.node.current();
    std::optional<ContainerView> view =
        nri::view_of(pod, container, *node, exemption_label_keys(*policy), impl.resolver());
    if (view &&
        nri::apply_adjustment(*view, nri::string_field(request, nri::field::kValidateAdjust), *node, impl.resolver())) {
      decision = impl.decide_for(*view, identity.id, nri::container_ids(container).id, *policy, *node, nullptr, true);
    } else {
      decision = not_judged(who, "the runtime's ValidateContainerAdjustment request does not parse", *policy);
    }
  } catch (const std::exception& e) {
    log::error("validation failed", {{"container", who}, {"reason", e.what()}});
    decision = not_judged(who, std::string("the enforcer's own error: ") + e.what(), *policy);
  }
  // What every plugin left must be within: a change still to make means another plugin undid gpuguard's.
  const bool rejected = decision.action != Decision::Action::allow;
  impl.metrics.count_validation(rejected);
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

namespace {
// Whether a container as NRI sends it carries a mask (a read-only tmpfs): only the enforcer writes one.
bool carries_mask(std::string_view container) {
  bool mask = false;
  nri::for_each_field(container, nri::field::kContainerMounts, [&](std::string_view bytes) {
    if (nri::string_field(bytes, nri::field::kMountType) != "tmpfs") return;
    nri::for_each_field(bytes, nri::field::kMountOptions,
                        [&](std::string_view option) { mask = mask || option == "ro"; });
  });
  return mask;
}
}  // namespace

// A container with masks, made and not yet started: where runc mounted them is checked against where its
// mounts show each MPS root (enforcement::unmasked_roots), since runc resolves both through the container's
// own links and mounts. A privileged container is not held to it, as to nothing else.
std::optional<std::string> Enforcer::start_container(std::string_view request) {
  Impl& impl = *impl_;
  const std::shared_ptr<const policy::Policy> policy = impl.effective_policy();
  const std::string_view container = nri::string_field(request, nri::field::kCreateContainer);
  if (policy->node_enforcement == policy::NodeEnforcement::off || !carries_mask(container)) return std::nullopt;
  const std::string_view pod = nri::string_field(request, nri::field::kCreatePod);
  const std::string who = who_of(nri::pod_identity(pod), nri::string_field(container, nri::field::kContainerName));
  const std::shared_ptr<const NodeView> node = impl.node.current();
  std::string problem;
  std::vector<std::string> unmasked;
  try {
    std::optional<ContainerView> view =
        nri::view_of(pod, container, *node, exemption_label_keys(*policy), impl.resolver());
    if (view && view->all_devices_allowed) return std::nullopt;
    if (view) impl.find_account(*view, *policy);
    if (view && policy->is_node_enforcement_exempt(view->pod_namespace, view->service_account, &view->pod_labels)) {
      return std::nullopt;  // its mounts were never masked by the enforcer, nor held against it
    }
    const auto pid = static_cast<std::uint32_t>(nri::varint_field(container, nri::field::kContainerPid).value_or(0));
    if (pid == 0) {
      problem = "the runtime did not say its process";
    } else if (const std::optional<std::string> mounts = impl.node.mountinfo(pid, problem)) {
      if (mounts->find(" - tmpfs ") == std::string::npos) {
        problem = "its process's mounts show no mask at all (a runtime that runs the container elsewhere, in a VM?)";
      } else {
        unmasked = enforcement::unmasked_roots(*mounts, node->mps_root_places);
      }
    }
  } catch (const std::exception& e) {
    problem = std::string("the enforcer's own error: ") + e.what();
  }
  impl.metrics.count_mask_check(!problem.empty() ? "unknown" : unmasked.empty() ? "masked" : "unmasked");
  if (problem.empty() && unmasked.empty()) return std::nullopt;
  std::string reason = "gpuguard: container " + who + " ";
  if (!problem.empty()) {
    reason += "has masks over MPS roots whose place cannot be checked: " + problem;
    if (policy->node_enforcement_unknown == policy::NodeEnforcementUnknown::allow) {
      log::warn("masks not checked, and the container started (nodeEnforcementUnknown: allow)",
                {{"container", who}, {"reason", reason}});
      return std::nullopt;
    }
  } else {
    reason += "would show every shared GPU's MPS server: its mounts show an MPS root where no mask landed (";
    for (std::size_t i = 0; i < unmasked.size(); ++i) reason.append(i == 0 ? "" : ", ").append(unmasked[i]);
    reason +=
        "); runc resolved the mask through the container's own links or mounts elsewhere than the mount. "
        "Mount the host's directory at a path without links in the image";
  }
  if (policy->node_enforcement == policy::NodeEnforcement::audit) {
    log::info("container would not start (nodeEnforcement: audit)", {{"container", who}, {"reason", reason}});
    return std::nullopt;
  }
  log::info("container start refused", {{"container", who}, {"reason", reason}});
  reason.resize(std::min(reason.size(), kMessageMax));
  return reason;
}

void Enforcer::run_pod_sandbox(std::string_view pod) {
  const nri::PodFacts facts = nri::pod_facts(pod, {});
  if (facts.oversized) return;  // no pod of such a name is listed: its containers are judged as they come
  impl_->fetched.fetch(facts.identity.id, facts.identity.pod_namespace, facts.identity.name);
}

void Enforcer::remove_pod_sandbox(std::string_view pod) { impl_->fetched.forget(nri::pod_identity(pod).id); }

void Enforcer::remove_container(std::string_view /*pod*/, std::string_view container) {
  const std::lock_guard lock(impl_->mutex);
  if (impl_->running.erase(nri::container_ids(container).id) != 0) impl_->publish_counts();
}

}  // namespace gpuguard::enforcer

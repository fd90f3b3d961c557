// The audit loop: two stores fed by list and watch, and one thread that keeps the Lease and runs the
// passes. Everything that writes to the API happens on that thread, one request at a time, and each
// write first checks that this replica still leads.
#include "gpuguard/audit/audit_loop.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "audit_stores.hpp"
#include "gpuguard/audit/pod_audit.hpp"
#include "gpuguard/audit/policy_report.hpp"
#include "gpuguard/claims/claim_cache.hpp"
#include "gpuguard/kube/informer.hpp"
#include "gpuguard/kube/request.hpp"
#include "gpuguard/log/log.hpp"

namespace gpuguard::audit {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr const char* kReportsApi = "/apis/wgpolicyk8s.io/v1alpha2";
constexpr const char* kFieldManager = "gpuguard-audit";
// How often the leader looks again for the PolicyReport API when it is not served.
constexpr auto kReportsApiRetry = std::chrono::seconds(60);

std::string report_path(std::string_view pod_namespace) {
  return std::string(kReportsApi) + "/namespaces/" + std::string(pod_namespace) + "/policyreports/" +
         std::string(kReportName);
}

}  // namespace

struct AuditLoop::Impl {
  Impl(AuditLoopOptions o, PolicySource p, AuditMetrics& m)
      : options(std::move(o)),
        policy(std::move(p)),
        metrics(m),
        claims(options.resource_claims ? std::make_unique<claims::ClaimCache>() : nullptr),
        pods(policy, claims.get(), metrics),
        election(options.identity, options.timing) {}

  AuditLoopOptions options;
  PolicySource policy;
  AuditMetrics& metrics;
  std::unique_ptr<claims::ClaimCache> claims;
  PodStore pods;
  NodeStore nodes;
  kube::LeaderElection election;

  std::unique_ptr<kube::Informers> pod_informer, other_informers;
  std::thread thread;
  std::mutex stop_mutex;
  std::condition_variable stop_signal;
  bool stopping = false;
  std::atomic<bool> running{false};  // start() called, stop() not yet
  std::atomic<bool> synced_now{false};
  std::shared_ptr<const policy::Policy> relisting_for;  // the policy a re-list of the pods is under way for

  // The leader's knowledge of the reports in the cluster: namespace -> content hash.
  bool leading = false;
  bool reports_known = false;
  std::map<std::string, std::string, std::less<>> written;
  std::optional<Clock::time_point> reports_api_retry_at;
  Clock::time_point next_lease{};
  std::map<std::string, std::string, std::less<>> last_errors;  // what -> the error last logged

  // The Lease every 2 s and the reports: one connection kept open, not a TLS handshake per request.
  kube::RequestSession session{options.apiserver};

  // A request to the API, bounded by the request timeout; transport failures come back in `error`.
  kube::Reply send(std::string method, std::string path, std::string content_type = {}, std::string body = {},
                   std::string accept = {}) {
    kube::Request request{std::move(method), std::move(path),    std::move(content_type),
                          std::move(body),   options.user_agent, std::move(accept)};
    try {
      return session.send(request, options.request_timeout);
    } catch (const std::exception& e) {
      kube::Reply reply;
      reply.error = e.what();
      return reply;
    }
  }

  // Logs a failure once while it stays the same, and once more when it goes away.
  void failed(const std::string& what, const std::string& error) {
    auto& last = last_errors[what];
    if (last != error) log::warn(what, {{"reason", error}});
    last = error;
  }
  void succeeded(const std::string& what) {
    const auto it = last_errors.find(what);
    if (it == last_errors.end() || it->second.empty()) return;
    log::info(what + ": works again");
    it->second.clear();
  }

  std::string lease_path() const {
    return "/apis/coordination.k8s.io/v1/namespaces/" + options.lease_namespace + "/leases/" + options.lease_name;
  }

  // nullopt: the read failed (and was logged); a nullopt inside: there is no Lease.
  std::optional<std::optional<kube::LeaseRecord>> read_lease() {
    const kube::Reply got = send("GET", lease_path());
    if (got.status == 404) return std::optional<kube::LeaseRecord>();
    if (got.status / 100 != 2) {
      failed("cannot read the audit Lease", got.error);
      return std::nullopt;
    }
    auto record = kube::parse_lease(got.body);
    if (!record) {
      failed("cannot read the audit Lease", "the answer is not a Lease");
      return std::nullopt;
    }
    return record;
  }

  // One round of client-go's tryAcquireOrRenew; then whether this replica leads, said when it changes.
  void keep_lease() {
    const auto started = Clock::now();
    if (const auto seen = read_lease()) {
      const auto decision = election.decide(*seen, started, kube::micro_time(std::chrono::system_clock::now()));
      if (decision.write != kube::LeaderElection::Write::none) {
        const bool create = decision.write == kube::LeaderElection::Write::create;
        const std::string body = kube::lease_body(options.lease_namespace, options.lease_name, decision.record);
        const kube::Reply reply =
            create ? send("POST", "/apis/coordination.k8s.io/v1/namespaces/" + options.lease_namespace + "/leases",
                          "application/json", body)
                   : send("PUT", lease_path(), "application/json", body);
        const bool ok = reply.status / 100 == 2;
        // A conflict is another candidate winning the race: not worth a warning.
        if (!ok && reply.status != 409) failed("cannot write the audit Lease", reply.error);
        if (ok) succeeded("cannot write the audit Lease");
        election.written(ok, started);
      }
      succeeded("cannot read the audit Lease");
    }
    next_lease = started + options.timing.retry_period;
    set_leading(election.leading(Clock::now()));
    metrics.count_lease_round();
  }

  // `released`: this replica gave the Lease up itself, and says so elsewhere.
  void set_leading(bool now_leading, bool released = false) {
    if (now_leading == leading) return;
    leading = now_leading;
    metrics.set_leader(leading);
    if (released) {
      reports_known = false;
      written.clear();
    } else if (leading) {
      log::info("leading: this replica writes the PolicyReports",
                {{"lease", options.lease_namespace + "/" + options.lease_name}, {"identity", options.identity}});
    } else {
      log::info("not leading: another replica writes the PolicyReports",
                {{"lease", options.lease_namespace + "/" + options.lease_name}, {"holder", election.holder()}});
      reports_known = false;
      written.clear();
    }
  }

  // Leads still, the Lease renewed first when that is due: asked before every write.
  bool may_write() {
    if (Clock::now() >= next_lease) keep_lease();
    set_leading(election.leading(Clock::now()));
    return leading;
  }

  // The reports gpuguard wrote, as the cluster has them (metadata only, a page at a time): what a new
  // leader must know to write only what changed and to delete what is no longer true.
  bool learn_reports() {
    if (reports_api_retry_at && Clock::now() < *reports_api_retry_at) return false;
    std::map<std::string, std::string, std::less<>> found;
    std::string continue_token;
    do {
      std::string path = std::string(kReportsApi) +
                         "/policyreports?limit=100&labelSelector=" + std::string(kManagedByLabel) + "%3D" +
                         std::string(kManagedByValue);
      if (!continue_token.empty()) path += "&continue=" + continue_token;
      const kube::Reply reply = send(
          "GET", path, {}, {}, "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json");
      if (reply.status == 404) {
        if (!reports_api_retry_at) {
          log::warn(
              "the PolicyReport API (wgpolicyk8s.io/v1alpha2) is not served: no reports are written, the "
              "metrics go on; install its CRD (the chart's audit.policyReportCRD) to have them");
        }
        reports_api_retry_at = Clock::now() + kReportsApiRetry;
        metrics.set_reports_available(false);
        return false;
      }
      if (reply.status / 100 != 2) {
        failed("cannot list the PolicyReports", reply.error);
        return false;
      }
      const json list = json::parse(reply.body, nullptr, false);
      // An empty list's items are null, as Go writes a nil slice.
      const auto items = list.is_object() ? list.find("items") : list.end();
      if (!list.is_object() || (items != list.end() && !items->is_array() && !items->is_null())) {
        failed("cannot list the PolicyReports", "the answer is not a list");
        return false;
      }
      for (const json& item : items != list.end() && items->is_array() ? *items : json::array()) {
        const json metadata = item.value("metadata", json::object());
        if (!metadata.is_object() || metadata.value("name", "") != kReportName) continue;
        const json annotations = metadata.value("annotations", json::object());
        found[metadata.value("namespace", "")] =
            annotations.is_object() ? annotations.value(std::string(kContentHashAnnotation), "") : "";
      }
      const json list_metadata = list.value("metadata", json::object());
      continue_token = kube::percent_encode(list_metadata.is_object() ? list_metadata.value("continue", "") : "");
    } while (!continue_token.empty());
    succeeded("cannot list the PolicyReports");
    if (reports_api_retry_at) log::info("the PolicyReport API is served: writing reports");
    reports_api_retry_at.reset();
    metrics.set_reports_available(true);
    written = std::move(found);
    reports_known = true;
    return true;
  }

  // What differs between the reports as they should be and as last written: applied, or deleted.
  void write_reports(const std::map<std::string, NamespaceReport, std::less<>>& reports) {
    if (!may_write() || (!reports_known && !learn_reports())) return;
    for (const auto& [pod_namespace, report] : reports) {
      const auto known = written.find(pod_namespace);
      if (known != written.end() && known->second == report.hash) continue;
      if (!may_write()) return;
      const kube::Reply reply = send(
          "PATCH", report_path(pod_namespace) + "?fieldManager=" + kFieldManager + "&force=true&fieldValidation=Strict",
          "application/apply-patch+yaml", report.body);
      const bool ok = reply.status / 100 == 2;
      metrics.count_write(ReportWrite::apply, ok);
      if (!ok) {
        failed("cannot write the PolicyReport of namespace " + pod_namespace, reply.error);
        if (reply.status == 404) reports_known = false;  // the API went away: look for it again
        continue;
      }
      succeeded("cannot write the PolicyReport of namespace " + pod_namespace);
      written.insert_or_assign(pod_namespace, report.hash);
    }
    for (auto it = written.begin(); it != written.end();) {
      if (reports.contains(it->first)) {
        ++it;
        continue;
      }
      if (!may_write()) return;
      const kube::Reply reply = send("DELETE", report_path(it->first));
      const bool ok = reply.status / 100 == 2 || reply.status == 404;
      metrics.count_write(ReportWrite::remove, ok);
      if (!ok) {
        failed("cannot delete the PolicyReport of namespace " + it->first, reply.error);
        ++it;
        continue;
      }
      it = written.erase(it);
    }
  }

  // Judges the cluster as the stores hold it now: the metrics always, the reports when leading.
  void pass() {
    const auto started = Clock::now();
    const auto policy_now = pods.judged_under();
    if (!policy_now) return;
    PassSummary summary;
    const auto conditions = nodes.snapshot(summary.nodes);
    std::vector<Offender> offenders = pods.offenders(conditions, summary.pods);
    std::map<std::string, std::vector<PodExposures>, std::less<>> by_namespace;
    for (const Offender& o : offenders) {
      const std::string result(result_of(*o.pod, policy_now->mode));
      std::vector<std::string_view> seen;
      for (const auto* list : {&o.pod->exposures(), &o.from_node}) {
        for (const admission::Exposure& e : *list) {
          const std::string_view reason = reason_of(e.door);
          if (std::find(seen.begin(), seen.end(), reason) != seen.end()) continue;
          seen.push_back(reason);
          ++summary.exposed_pods[{o.pod->namespace_, std::string(reason), result}];
        }
      }
      by_namespace[o.pod->namespace_].push_back({o.pod.get(), o.from_node});
    }
    std::map<std::string, NamespaceReport, std::less<>> reports;
    for (auto& [pod_namespace, entries] : by_namespace) {
      reports.emplace(pod_namespace, policy_report(pod_namespace, std::move(entries), policy_now->mode));
    }
    summary.reports = reports.size();
    metrics.set_pass(std::move(summary), Clock::now(), Clock::now() - started);
    if (leading) write_reports(reports);
  }

  // On the loop's thread, which alone replaces the informers; other threads read `synced_now`.
  bool informers_synced() const {
    return pod_informer && pod_informer->synced() && other_informers && other_informers->synced();
  }

  void start_pod_informer() {
    pod_informer.reset();  // its watch stops before another lists into the same store
    kube::InformerOptions informer_options;
    informer_options.user_agent = options.user_agent;
    pod_informer = std::make_unique<kube::Informers>(
        options.apiserver,
        std::vector<kube::WatchedResource>{{"pods", "/api/v1/pods", std::string(kPodSelector), &pods}},
        informer_options, [this](std::string_view resource, kube::ReflectorOutcome outcome) {
          metrics.count_informer(resource, outcome);
        });
    pod_informer->start();
  }

  void run() {
    std::uint64_t seen_pods = 0, seen_nodes = 0;
    std::optional<Clock::time_point> last_pass;
    Clock::duration last_took{};
    std::unique_lock lock(stop_mutex);
    while (!stopping) {
      lock.unlock();
      const auto now = Clock::now();
      if (now >= next_lease) keep_lease();
      set_leading(election.leading(Clock::now()));
      const auto judged = pods.judged_under();
      const auto in_force = policy();
      if (judged && judged != in_force && relisting_for != in_force) {
        log::info("policy changed: listing the pods again to judge each under it");
        relisting_for = in_force;
        try {
          start_pod_informer();
        } catch (const std::system_error& e) {  // its thread refused, as at a pids limit: tried again next round
          log::error("cannot list the pods again", {{"reason", e.what()}, {"effect", "not ready until it can"}});
          relisting_for = nullptr;
        }
      }
      synced_now = informers_synced();
      const bool changed = pods.changes() != seen_pods || nodes.changes() != seen_nodes;
      // Passes take at most a fifth of a core however busy the cluster: a pass of 3 s waits 12 s for the next.
      const auto spacing = std::max<Clock::duration>(options.min_pass_interval, 4 * last_took);
      const bool due = !last_pass || (changed && now - *last_pass >= spacing) || now - *last_pass >= options.full_pass;
      if (synced_now && due) {
        seen_pods = pods.changes();
        seen_nodes = nodes.changes();
        pass();
        last_pass = Clock::now();
        last_took = *last_pass - now;
      }
      lock.lock();
      stop_signal.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping; });
    }
  }

  // Gives the Lease up, so that another replica leads at once rather than after it expires.
  void release_lease() {
    const auto seen = read_lease();
    const auto record =
        election.release(seen ? *seen : std::nullopt, kube::micro_time(std::chrono::system_clock::now()));
    set_leading(false, true);
    if (!record) return;
    const kube::Reply reply = send("PUT", lease_path(), "application/json",
                                   kube::lease_body(options.lease_namespace, options.lease_name, *record));
    if (reply.status / 100 == 2) {
      log::info("audit Lease released", {{"lease", options.lease_namespace + "/" + options.lease_name}});
    } else {
      log::warn("cannot release the audit Lease; another replica leads once it expires", {{"reason", reply.error}});
    }
  }
};

AuditLoop::AuditLoop(AuditLoopOptions options, PolicySource policy, AuditMetrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(policy), metrics)) {}

AuditLoop::~AuditLoop() { stop(); }

void AuditLoop::start() {
  Impl& i = *impl_;
  std::vector<kube::WatchedResource> others = {{"nodes", "/api/v1/nodes", "", &i.nodes}};
  if (i.claims) {
    for (auto& r : i.claims->watched_resources()) others.push_back(std::move(r));
  }
  kube::InformerOptions informer_options;
  informer_options.user_agent = i.options.user_agent;
  informer_options.on_discovery = [](const std::string&, const kube::GroupDiscovery& found) {
    claims::log_claims_discovery(found);
  };
  i.other_informers = std::make_unique<kube::Informers>(
      i.options.apiserver, std::move(others), informer_options,
      [&i](std::string_view resource, kube::ReflectorOutcome outcome) { i.metrics.count_informer(resource, outcome); });
  i.other_informers->start();
  i.start_pod_informer();
  i.thread = std::thread([&i] { i.run(); });
  i.running = true;  // only now: a thread the system refused is not joined by stop()
}

void AuditLoop::stop() {
  Impl& i = *impl_;
  if (!i.running.exchange(false)) return;
  {
    const std::lock_guard lock(i.stop_mutex);
    i.stopping = true;
  }
  i.stop_signal.notify_all();
  i.thread.join();
  i.pod_informer.reset();
  i.other_informers.reset();
  i.release_lease();
}

bool AuditLoop::synced() const { return impl_->synced_now; }

}  // namespace gpuguard::audit

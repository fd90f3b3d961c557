// gpuguard-node-enforcer wired together (enforcer_service.hpp): the core (gpuguard/enforcer/enforcer.hpp)
// with its real ports (the kubelet's pod-resources, the API server, the host's files), the NRI plugin, the
// policy ConfigMap, the break glass, and /healthz, /readyz and /metrics.
#include "enforcer_service.hpp"

#include <grpc/grpc.h>
#include <sys/stat.h>
#include <nlohmann/json.hpp>

#include <thread>

#include "break_glass.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/enforcement/mask_hook.hpp"
#include "gpuguard/enforcer/enforcer.hpp"
#include "gpuguard/enforcer/kubelet_client.hpp"
#include "gpuguard/files/poller.hpp"
#include "gpuguard/files/read_file.hpp"
#include "gpuguard/files/write_file.hpp"
#include "gpuguard/kube/event.hpp"
#include "gpuguard/kube/request.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/nri/plugin.hpp"
#include "gpuguard/policy/policy_watcher.hpp"
#include "gpuguard/server/http_server.hpp"
#include "gpuguard/server/status_routes.hpp"
#include "node_reader.hpp"

namespace gpuguard::enforcer {
namespace {

using namespace std::chrono_literals;

constexpr auto kApiDeadline = 300ms;  // a service account looked up within a create's 2 s

// The policy keys the enforcer reads; a bad value of any other is the webhook's to refuse.
const std::set<std::string> kPolicyKeys = {"gpuResources",
                                           "exemptNamespaces",
                                           "exemptServiceAccounts",
                                           "nodeEnforcement",
                                           "nodeEnforcementExemptNamespaces",
                                           "nodeEnforcementExemptServiceAccounts",
                                           "nodeEnforcementUnknown"};

// The pod directory: the API server, where the flags give one.
class ApiPodDirectory final : public PodDirectory {
 public:
  ApiPodDirectory(std::optional<kube::ApiServer> api, std::string node)
      : api_(std::move(api)), node_(std::move(node)) {}

  std::string service_account(const std::string& pod_namespace, const std::string& pod_name,
                              const std::string& uid) override {
    if (!api_) return "";
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
    return account;
  }

  // The Node's UID given as its name, as the kubelet gives it in its own Node events: `kubectl describe node`
  // looks for events by either.
  void node_event(const std::string& message) override {
    if (!api_ || node_.empty()) return;
    post({"v1", "Node", "", node_, node_}, "default", "GPUsBeyondAllocation", message);
  }

  void pod_event(const std::string& pod_namespace, const std::string& pod_name, const std::string& uid,
                 const std::string& message) override {
    if (!api_ || pod_namespace.empty() || pod_name.empty()) return;
    post({"v1", "Pod", pod_namespace, pod_name, uid}, pod_namespace, "GPUInfrastructureUnlisted", message);
  }

 private:
  void post(kube::EventSubject about, const std::string& events_namespace, const char* reason,
            const std::string& message) {
    const kube::WarningEvent event{
        std::move(about),
        events_namespace,
        reason,
        message,
        "gpuguard-node-enforcer",
        node_,
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()};
    const kube::Reply reply = kube::send_request(*api_,
                                                 {"POST", kube::events_path(event.events_namespace), "application/json",
                                                  kube::warning_event_json(event), "gpuguard-node-enforcer", ""},
                                                 3s);
    if (reply.status != 201) {
      log::warn("cannot write the event",
                {{"event", reason},
                 {"about", event.about.kind + " " + event.about.namespace_ + "/" + event.about.name},
                 {"status", reply.status},
                 {"reason", reply.error}});
    }
  }

  std::optional<kube::ApiServer> api_;
  std::string node_;
};

// gRPC's library held for the whole service, and let go last. gRPC joins its own threads when its last user lets
// go; where that last user is one of gRPC's threads (a channel's end runs there), it does so on a detached thread
// of its own, which the process's exit can outrun: make test-tsan saw gRPC's timer thread left unjoined at exit.
// Held here, the last release is the main thread's, after every channel is gone, and the clean-up runs on it;
// the bounded wait covers a clean-up already handed to gRPC's thread.
class GrpcLibraryHeld {
 public:
  GrpcLibraryHeld() { grpc_init(); }
  ~GrpcLibraryHeld() {
    grpc_shutdown();
    for (int i = 0; i < 200 && grpc_is_initialized() != 0; ++i) std::this_thread::sleep_for(10ms);
  }
  GrpcLibraryHeld(const GrpcLibraryHeld&) = delete;
  GrpcLibraryHeld& operator=(const GrpcLibraryHeld&) = delete;
};

// gpuguard-mask-check, beside this program in its image, copied whole into `dir`, which must be the host's
// directory of that path (the host root shows the same directory there): the path the runtime runs it by,
// or empty, said why, where it cannot be. A new copy takes the old one's name at once, so a runtime never
// runs half of one.
std::string install_mask_hook(const std::filesystem::path& dir, const std::filesystem::path& host_root) {
  const std::string name(enforcement::kMaskHookName);
  try {
    struct stat here {};
    struct stat on_host {};
    const std::filesystem::path host_dir = host_root / dir.relative_path();
    if (::stat(dir.c_str(), &here) != 0 || ::stat(host_dir.c_str(), &on_host) != 0 || here.st_dev != on_host.st_dev ||
        here.st_ino != on_host.st_ino) {
      throw std::runtime_error("it is not the host's " + dir.string() + " (the host root's " + host_dir.string() +
                               " is another directory, or either is missing): mount the host's directory at the "
                               "same path");
    }
    const std::filesystem::path source = std::filesystem::read_symlink("/proc/self/exe").parent_path() / name;
    const std::optional<std::string> program = files::read_file(source);
    if (!program || program->empty()) throw std::runtime_error("cannot read " + source.string());
    const std::filesystem::path target = dir / name;
    using std::filesystem::perms;
    files::write_file_atomically(
        target, *program,
        perms::owner_all | perms::group_read | perms::group_exec | perms::others_read | perms::others_exec);
    log::info("the mask check is in place for CRI-O", {{"hook", target.string()}});
    return target.string();
  } catch (const std::exception& e) {
    log::warn("the mask check cannot be put in place: on CRI-O, a container that would need a mask is refused",
              {{"directory", dir.string()}, {"reason", e.what()}});
    return {};
  }
}

}  // namespace

void serve(const EnforcerConfig& config) {
  cli::StopSignalsHeld stop_signals;  // before gRPC's threads and ours, which keep them blocked
  const GrpcLibraryHeld grpc;         // first made, last gone
  EnforcerMetrics metrics(GPUGUARD_VERSION);
  policy::PolicyWatcher policy(config.policy_dir, metrics, kPolicyKeys, policy::PolicyWatcher::AtStart::defaults);
  std::unique_ptr<BreakGlass> break_glass;
  if (config.apiserver && !config.break_glass_name.empty()) {
    break_glass =
        std::make_unique<BreakGlass>(*config.apiserver, config.break_glass_namespace, config.break_glass_name);
  }
  KubeletClient kubelet(config.pod_resources_socket);
  ApiPodDirectory pods(config.apiserver, config.node_name);
  NodeReader node(config.host_root, config.mps_roots, config.kubelet_root);
  EnforcerOptions options;
  options.exempt_service_accounts = config.exempt_service_accounts;
  if (config.mask_hook_dir) options.mask_hook = install_mask_hook(*config.mask_hook_dir, config.host_root);
  Enforcer enforcer(
      options, kubelet, pods, node, [&policy] { return policy.current(); },
      [&break_glass] { return break_glass != nullptr && break_glass->engaged(); }, metrics);
  nri::PluginOptions plugin_options;
  plugin_options.socket = config.nri_socket;
  plugin_options.unserved_after = config.nri_unserved_after;
  plugin_options.name = config.plugin_name;
  plugin_options.index = config.plugin_index;
  nri::Plugin plugin(plugin_options, enforcer);
  // Ready once registered with the runtime and synchronized by it, or when the runtime serves no NRI: nothing
  // to wait for, and the metrics say the node is not enforced. The port's bounds are in
  // docs/node-enforcer.md#memory.
  const server::StatusRoutes status_routes(
      [&plugin]() -> server::StatusRoutes::Readiness {
        const nri::PluginStats stats = plugin.stats();
        return {stats.registered || !stats.nri_served,
                stats.nri_served ? "" : "not enforced: the container runtime serves no NRI socket"};
      },
      [&] {
        return metrics.render(plugin.stats(), policy::node_enforcement_name(policy.current()->node_enforcement));
      });
  server::HttpServer status(server::status_server_options(config.metrics_address, 5s), server::TlsProvider{},
                            status_routes);
  log::info("serving probes and metrics", {{"address", status.bind()}});
  policy.watch(1s);
  // The GPUs again every minute, for what procfs does not stamp; the rest is read again as it changes.
  files::Poller node_poll(60s, [&enforcer] { enforcer.refresh_node(); });
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
  const auto stop_delivered = stop_signals.release();  // to this thread alone; held again before the server goes
  status.run();                                        // until SIGTERM or SIGINT
  nri_thread.request_stop();
}

}  // namespace gpuguard::enforcer

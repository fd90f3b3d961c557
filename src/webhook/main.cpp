// gpuguard-webhook: serves the mutating admission webhook, or runs one of its offline commands (review,
// audit) through the same admission core.
#include <boost/program_options.hpp>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "arm_command.hpp"
#include "audit_command.hpp"
#include "audit_controller_command.hpp"
#include "await_rollout_command.hpp"
#include "gpuguard/claims/claim_cache.hpp"
#include "gpuguard/cli/apiserver_flags.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/cli/server_flags.hpp"
#include "gpuguard/k8s/names.hpp"
#include "gpuguard/k8s/quantity.hpp"
#include "gpuguard/kube/informer.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/policy/policy_watcher.hpp"
#include "gpuguard/server/http_server.hpp"
#include "gpuguard/tls/server_context.hpp"
#include "gpuguard/webhook/arming.hpp"
#include "gpuguard/webhook/memory_plan.hpp"
#include "gpuguard/webhook/webhook_handler.hpp"
#include "review_command.hpp"

namespace po = boost::program_options;
using namespace gpuguard;

namespace {

constexpr const char* kUsage =
    "gpuguard-webhook: a Kubernetes mutating admission webhook that sets NVIDIA_VISIBLE_DEVICES=none in\n"
    "every container that does not request a GPU.\n\n"
    "Usage:\n"
    "  gpuguard-webhook --tls-cert-file FILE --tls-private-key-file FILE [options]\n"
    "  gpuguard-webhook review [--policy-dir DIR] [--claims FILE] FILE|-\n"
    "      review an AdmissionReview or a bare Pod offline and print the response and the decoded JSON Patch\n"
    "  gpuguard-webhook audit [--policy-dir DIR] [--claims FILE] [--nodes FILE] [--output table|json] FILE|-\n"
    "      report every container of a PodList (kubectl get pods -A -o json) that can see GPUs it did not\n"
    "      ask for, and what the webhook would do, and the nodes (kubectl get nodes -o json) where the injected\n"
    "      value does not hold; exits 1 when there is any\n"
    "  gpuguard-webhook audit-controller [options]\n"
    "      the same audit in the cluster, continuously: PolicyReports and metrics (audit-controller --help)\n"
    "  gpuguard-webhook arm [options]\n"
    "      the chart's post-install hook: once a replica is available, the webhook configuration's failurePolicy\n"
    "      to Fail and the backstop to Deny (arm --help)\n"
    "  gpuguard-webhook await-rollout [options]\n"
    "      the chart's post-delete hook: waits until the node cleanup's DaemonSet is ready on every node\n"
    "      (await-rollout --help)\n\n"
    "In a pod it looks up DRA claims, and watches the namespaces labelled gpuguard.io/ignore and the objects\n"
    "--webhook-configuration, --backstop-binding, --backstop-policy and --parameter-keeper name, with its\n"
    "service account;\n"
    "elsewhere give --apiserver-url, --token-file and --ca-file, or run without (claims are then unknown, and\n"
    "treated as requesting no GPU).\n\n"
    "Options";

std::optional<std::size_t> byte_flag(const po::variables_map& flags, const char* name) {
  const std::string text = flags[name].as<std::string>();
  const auto bytes = k8s::quantity_count(text);
  if (!bytes || *bytes <= 0) {
    std::cerr << "gpuguard-webhook: --" << name << " '" << text
              << "' is not a byte count (a Kubernetes quantity such as 128Mi or 134217728)\n";
    return std::nullopt;
  }
  return static_cast<std::size_t>(*bytes);
}

// Threads, connections and bytes in flight, from the pod's memory limit (webhook::plan_memory).
bool size_for_memory(const po::variables_map& flags, server::ServerOptions& options) {
  const auto memory_limit = byte_flag(flags, "memory-limit");
  const auto body_limit = byte_flag(flags, "body-limit");
  if (!memory_limit || !body_limit) return false;
  std::string why;
  const auto plan =
      webhook::plan_memory(*memory_limit, options.threads, std::thread::hardware_concurrency(), *body_limit,
                           flags["max-connections"].as<std::size_t>(), webhook::MemoryCosts{}, why);
  if (!plan) {
    std::cerr << "gpuguard-webhook: " << why << "\n";
    return false;
  }
  options.body_limit = *body_limit;
  options.threads = plan->threads;
  options.max_connections = plan->max_connections;
  options.inflight_bytes = plan->inflight_bytes;
  log::info("memory plan", {{"memory_limit", *memory_limit},
                            {"threads", plan->threads},
                            {"max_connections", plan->max_connections},
                            {"inflight_bytes", plan->inflight_bytes},
                            {"body_limit", *body_limit}});
  return true;
}

// A namespace's name, '/', a Deployment's: what the arm hook names the webhook by (arm --namespace,
// --deployment).
bool valid_instance(std::string_view instance) {
  const auto slash = instance.find('/');
  if (slash == std::string_view::npos) return false;
  return k8s::is_dns_label(instance.substr(0, slash)) &&
         webhook::arming::is_deployment_name(instance.substr(slash + 1));
}

// Serves reviews until a signal ends it, from flags serve() has checked; throws when it cannot start.
void serve_reviews(const po::variables_map& flags, const std::optional<kube::ApiServer>& apiserver,
                   const std::string& claims_mode, const std::string& instance, server::ServerOptions options) {
  cli::StopSignalsHeld stop_signals;  // first: before the watchers' and informers' threads, which keep them blocked
  webhook::WebhookMetrics metrics(GPUGUARD_VERSION);
  policy::PolicyWatcher policy(cli::path_flag(flags, "policy-dir"), metrics);
  tls::CertificateWatcher certificate(flags["tls-cert-file"].as<std::string>(),
                                      flags["tls-private-key-file"].as<std::string>(), metrics);
  std::unique_ptr<claims::ClaimCache> claims;
  std::unique_ptr<webhook::AdmissionSwitches> switches;
  std::unique_ptr<kube::Informers> informers;
  if (apiserver) {
    std::vector<kube::WatchedResource> watched;
    if (flags["admission-switches"].as<std::string>() == "watch") {
      switches = std::make_unique<webhook::AdmissionSwitches>(
          flags["webhook-configuration"].as<std::string>(), flags["backstop-binding"].as<std::string>(),
          flags["backstop-policy"].as<std::string>(), flags["parameter-keeper"].as<std::string>());
      watched = switches->watched_resources();
    }
    if (claims_mode == "auto") {
      claims = std::make_unique<claims::ClaimCache>();
      for (kube::WatchedResource& resource : claims->watched_resources()) watched.push_back(std::move(resource));
    }
    kube::InformerOptions informer_options;
    informer_options.user_agent = std::string("gpuguard-webhook/") + GPUGUARD_VERSION;
    informer_options.rediscover_interval =
        std::chrono::milliseconds(static_cast<long long>(flags["api-discovery-interval"].as<double>() * 1000));
    informer_options.on_discovery = [](const std::string&, const kube::GroupDiscovery& found) {
      claims::log_claims_discovery(found);
    };
    kube::InformerObserver observer;
    if (switches) {
      observer = [&switches](std::string_view resource, kube::ReflectorOutcome outcome) {
        switches->observe(resource, outcome);
      };
    }
    informers = std::make_unique<kube::Informers>(*apiserver, std::move(watched), informer_options, observer);
  }
  if (!claims) {
    log::warn(claims_mode == "off"
                  ? "--resource-claims off: DRA claims are not looked up"
                  : "no Kubernetes API (not in a pod, no --apiserver-url): DRA claims are not looked up",
              {{"effect", "containers that get devices through resource claims are treated as requesting no GPU"}});
  }
  if (!switches) {
    log::info(flags["admission-switches"].as<std::string>() == "off"
                  ? "--admission-switches off: the admission switches are not watched"
                  : "no Kubernetes API: the admission switches are not watched",
              {{"effect",
                "no gpuguard_admission_switches_watched, gpuguard_ignored_namespaces or "
                "gpuguard_admission_object_present; their alerts cannot fire"}});
  }
  webhook::WebhookHandler handler(
      [&policy] { return policy.current(); }, metrics, claims.get(),
      claims ? std::function<bool()>([&claims] { return claims->synced(); }) : std::function<bool()>());
  handler.set_instance(instance);
  handler.set_switches(switches.get());
  if (claims) {
    handler.set_readiness_note(
        [&informers] { return claims::claims_off_note(informers->discovered(claims::ClaimCache::kGroup)); });
  }
  options.on_shutdown = [&handler] { handler.set_ready(false); };
  options.counters = &metrics.server_counters();
  server::HttpServer server(
      options, [&certificate] { return certificate.current(); }, handler);
  const std::string address = server.bind();
  if (informers) informers->start();
  policy.watch(std::chrono::seconds(1));
  certificate.watch(std::chrono::seconds(2));
  handler.set_ready(true);
  log::info("listening", {{"address", address},
                          {"version", GPUGUARD_VERSION},
                          {"resource_claims", claims ? apiserver->url() : std::string("off")},
                          {"kubernetes_api", apiserver ? apiserver->url() : std::string("none")}});
  const auto stop_delivered = stop_signals.release();  // to this thread alone; held again before the server goes
  server.run();
}

int serve(const po::variables_map& flags) {
  if (!cli::has_tls_flags(flags)) {
    std::cerr << "gpuguard-webhook: --tls-cert-file and --tls-private-key-file are required (see --help)\n";
    return 2;
  }
  std::optional<server::ServerOptions> parsed_options = cli::server_options("gpuguard-webhook", flags);
  if (!parsed_options) return 2;
  const std::string claims_mode = flags["resource-claims"].as<std::string>();
  if (claims_mode != "auto" && claims_mode != "off") {
    std::cerr << "gpuguard-webhook: --resource-claims must be auto or off\n";
    return 2;
  }
  std::optional<kube::ApiServer> apiserver;
  const std::string switches_mode = flags["admission-switches"].as<std::string>();
  if (switches_mode != "watch" && switches_mode != "off") {
    std::cerr << "gpuguard-webhook: --admission-switches must be watch or off\n";
    return 2;
  }
  if ((claims_mode == "auto" || switches_mode == "watch") && cli::apiserver_known(flags)) {
    try {
      apiserver = cli::api_server(flags);
    } catch (const std::exception& e) {
      std::cerr << "gpuguard-webhook: " << e.what() << "\n";
      return 2;
    }
  }
  if (const double interval = flags["api-discovery-interval"].as<double>(); !(interval >= 0.1 && interval <= 86400)) {
    std::cerr << "gpuguard-webhook: --api-discovery-interval must be between 0.1 and 86400 seconds\n";
    return 2;
  }
  for (const char* name : {"webhook-configuration", "backstop-binding", "backstop-policy", "parameter-keeper"}) {
    const std::string object = flags[name].as<std::string>();
    if (!object.empty() && !k8s::is_dns_subdomain(object)) {
      std::cerr << "gpuguard-webhook: --" << name << " '" << object
                << "' is not an object's name (an RFC 1123 subdomain of at most 253 characters)\n";
      return 2;
    }
  }
  const std::string instance = flags["instance"].as<std::string>();
  if (!instance.empty() && !valid_instance(instance)) {
    std::cerr << "gpuguard-webhook: --instance '" << instance
              << "' is not NAMESPACE/DEPLOYMENT (a namespace's name, '/', a Deployment's name of at most 63 "
                 "characters)\n";
    return 2;
  }
  // A pod's name as a Deployment's pods have it: an RFC 1123 subdomain of at most 63 characters (the API
  // server cuts a generated name's base to keep it so), which keeps the warning under the 256 characters
  // the API server may cut one to.
  const std::string replica = flags["replica"].as<std::string>();
  if (!replica.empty() && (instance.empty() || !webhook::arming::is_deployment_name(replica))) {
    std::cerr << "gpuguard-webhook: --replica '" << replica
              << "' must be a pod's name (an RFC 1123 subdomain of at most 63 characters), with --instance\n";
    return 2;
  }
  server::ServerOptions options = std::move(*parsed_options);
  if (!size_for_memory(flags, options)) return 2;
  const std::string said = replica.empty() ? instance : webhook::arming::replica_identity(instance, replica);
  return cli::run_service([&] { serve_reviews(flags, apiserver, claims_mode, said, std::move(options)); });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "review") return webhook::run_review_command({argv + 2, argv + argc});
  if (argc >= 2 && std::string(argv[1]) == "audit") return webhook::run_audit_command({argv + 2, argv + argc});
  if (argc >= 2 && std::string(argv[1]) == "arm") return webhook::run_arm_command(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "await-rollout") {
    return webhook::run_await_rollout_command(argc - 1, argv + 1);
  }
  if (argc >= 2 && std::string(argv[1]) == "audit-controller") {
    return webhook::run_audit_controller_command(argc - 1, argv + 1);
  }

  po::options_description description(kUsage);
  cli::add_server_flags(description);
  cli::add_apiserver_flags(description);
  description.add_options()("policy-dir", po::value<std::string>(),
                            "mounted policy ConfigMap, re-read on change; without it the default policy applies")(
      "resource-claims", po::value<std::string>()->default_value("auto"),
      "auto: look up DRA ResourceClaims and ResourceClaimTemplates by list and watch when a Kubernetes API is "
      "known, through the newest resource.k8s.io version served (v1, v1beta2, v1beta1); off: never")(
      "webhook-configuration", po::value<std::string>()->default_value(""),
      "the MutatingWebhookConfiguration that sends pods to this webhook, watched under --admission-switches watch "
      "so that /metrics says when it is gone (gpuguard_admission_object_present); empty: not watched")(
      "backstop-binding", po::value<std::string>()->default_value(""),
      "the backstop's ValidatingAdmissionPolicyBinding, watched as --webhook-configuration is; empty: not watched")(
      "backstop-policy", po::value<std::string>()->default_value(""),
      "the backstop's ValidatingAdmissionPolicy, watched as --webhook-configuration is; empty: not watched")(
      "parameter-keeper", po::value<std::string>()->default_value(""),
      "the ValidatingAdmissionPolicy and its binding, of this one name, that keep the API servers watching the "
      "backstop's parameter (gpuguard-keep-configmap-params), watched as --webhook-configuration is; empty: not "
      "watched")(
      "admission-switches", po::value<std::string>()->default_value("watch"),
      "watch: where a Kubernetes API is known, watch the namespaces labelled gpuguard.io/ignore and the objects "
      "--webhook-configuration, --backstop-binding, --backstop-policy and --parameter-keeper name, for /metrics; "
      "off: never (with "
      "--resource-claims off too, the webhook uses no Kubernetes API)")(
      "api-discovery-interval", po::value<double>()->default_value(60),
      "seconds between looks for a resource.k8s.io version to read while the cluster serves none")(
      "memory-limit", po::value<std::string>()->default_value("128Mi"),
      "the container's memory limit (the chart passes limits.memory); threads, connections and request bytes in "
      "flight are sized to stay under it")("body-limit", po::value<std::string>()->default_value("4Mi"),
                                           "largest AdmissionReview accepted; larger ones are answered 413")(
      "max-connections", po::value<std::size_t>()->default_value(0),
      "connections open at once; 0 = as many as --memory-limit leaves room for")(
      "instance", po::value<std::string>()->default_value(""),
      "NAMESPACE/DEPLOYMENT of this webhook, said in a warning to the arm hook's probe pod so that the hook "
      "knows its own release's webhook answered (the chart passes it); empty: nothing said")(
      "replica", po::value<std::string>()->default_value(""),
      "this replica's pod name, said with --instance to the arm hook's probe pod so that the hook can tell that "
      "each replica answered (the chart passes the pod's name); empty: not said");
  const cli::Parsed parsed = cli::parse_command_line("gpuguard-webhook", GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;
  return serve(*parsed.flags);
}

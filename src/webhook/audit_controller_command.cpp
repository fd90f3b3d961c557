// The audit-controller command: flags into an AuditLoop, and the small plain-HTTP server for its probes
// and metrics.
#include "audit_controller_command.hpp"

#include <boost/program_options.hpp>

#include <unistd.h>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>

#include "gpuguard/audit/audit_loop.hpp"
#include "gpuguard/cli/apiserver_flags.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/policy/policy_watcher.hpp"
#include "gpuguard/server/http_server.hpp"
#include "gpuguard/server/status_routes.hpp"

namespace gpuguard::webhook {
namespace {

namespace po = boost::program_options;
using namespace std::chrono_literals;

constexpr const char* kProgram = "gpuguard-webhook audit-controller";
constexpr const char* kUsage =
    "gpuguard-webhook audit-controller: keeps a wgpolicyk8s.io PolicyReport per namespace, and metrics, of every\n"
    "running pod whose containers can see GPUs they did not ask for, judged as `gpuguard-webhook audit` judges\n"
    "them, with the nodes whose GPUIsolation condition is not True. Replicas elect one writer with a Lease.\n\n"
    "Usage:\n"
    "  gpuguard-webhook audit-controller [options]\n\n"
    "In a pod it reaches the Kubernetes API with its service account; elsewhere give --apiserver-url,\n"
    "--token-file and --ca-file.\n\n"
    "Options";

// The namespace this pod runs in, as its service account says; empty elsewhere.
std::string own_namespace() {
  if (const char* env = std::getenv("POD_NAMESPACE"); env != nullptr && *env != '\0') return env;
  std::ifstream file(std::string(kube::kServiceAccountDir) + "/namespace");
  std::string ns;
  std::getline(file, ns);
  return ns;
}

// Unique per process, as client-go's callers make it (host name and a random suffix): a restarted
// container with the same pod name must not believe it still holds the Lease.
std::string default_identity() {
  std::string name;
  if (const char* env = std::getenv("POD_NAME"); env != nullptr && *env != '\0') {
    name = env;
  } else {
    char host[256] = {};
    name = gethostname(host, sizeof host - 1) == 0 ? host : "gpuguard-audit";
  }
  std::random_device random;
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%08x%08x", random(), random());
  return name + "_" + suffix;
}

void add_audit_controller_flags(po::options_description& description) {
  cli::add_apiserver_flags(description);
  description.add_options()("policy-dir", po::value<std::string>(),
                            "the mounted gpuguard-policy ConfigMap (the webhook's), re-read on change; a new policy "
                            "judges every pod again")("listen-address",
                                                      po::value<std::string>()->default_value("0.0.0.0:8080"),
                                                      "IP:port for /healthz, /readyz and /metrics over plain HTTP")(
      "lease-namespace", po::value<std::string>(),
      "namespace of the Lease that elects the one replica writing reports (default: this pod's)")(
      "lease-name", po::value<std::string>()->default_value("gpuguard-audit"), "name of that Lease")(
      "lease-duration", po::value<unsigned>()->default_value(15),
      "seconds a Lease not renewed keeps other replicas waiting (as kube-controller-manager's)")(
      "renew-deadline", po::value<unsigned>()->default_value(10),
      "seconds after its last renewal began by which the leader stops writing, shorter than --lease-duration")(
      "retry-period", po::value<unsigned>()->default_value(2), "seconds between two reads of the Lease")(
      "identity", po::value<std::string>(),
      "this replica's name in the Lease (default: $POD_NAME or the host name, "
      "and a random suffix)")(
      "resource-claims", po::value<std::string>()->default_value("auto"),
      "auto: list and watch DRA ResourceClaims and ResourceClaimTemplates to judge the pods that use them, "
      "through the newest resource.k8s.io version served of v1, v1beta2 and v1beta1 (none served: off); "
      "off: never");
}

// The loop's options from the flags: 0, or 2 after saying which flag is wrong.
int read_loop_options(const po::variables_map& flags, audit::AuditLoopOptions& options) {
  const std::string claims_mode = flags["resource-claims"].as<std::string>();
  if (claims_mode != "auto" && claims_mode != "off") {
    std::cerr << kProgram << ": --resource-claims must be auto or off\n";
    return 2;
  }
  options.lease_namespace =
      flags.count("lease-namespace") ? flags["lease-namespace"].as<std::string>() : own_namespace();
  options.lease_name = flags["lease-name"].as<std::string>();
  options.identity = flags.count("identity") ? flags["identity"].as<std::string>() : default_identity();
  options.resource_claims = claims_mode == "auto";
  options.timing = {std::chrono::seconds(flags["lease-duration"].as<unsigned>()),
                    std::chrono::seconds(flags["renew-deadline"].as<unsigned>()),
                    std::chrono::seconds(flags["retry-period"].as<unsigned>())};
  // client-go's rule: a leader must give up before anyone may take over, and renew more than once first.
  if (!(options.timing.lease_duration > options.timing.renew_deadline &&
        options.timing.renew_deadline.count() * 10 > options.timing.retry_period.count() * 12 &&
        options.timing.retry_period.count() > 0)) {
    std::cerr << kProgram << ": want --lease-duration > --renew-deadline > 1.2 x --retry-period > 0\n";
    return 2;
  }
  options.user_agent = std::string("gpuguard-audit/") + GPUGUARD_VERSION;
  if (options.lease_namespace.empty() || options.lease_name.empty() || options.identity.empty()) {
    std::cerr << kProgram << ": --lease-namespace (outside a pod), --lease-name and --identity must not be empty\n";
    return 2;
  }
  return cli::require_api_server(kProgram, flags, options.apiserver);
}

// Runs the audit loop and its status port until a signal ends it.
int serve_audit(const po::variables_map& flags, const audit::AuditLoopOptions& options) {
  return cli::run_service([&] {
    cli::StopSignalsHeld stop_signals;  // first: before the watchers' and informers' threads, which keep them blocked
    audit::AuditMetrics metrics(GPUGUARD_VERSION);
    policy::PolicyWatcher policy(cli::path_flag(flags, "policy-dir"), metrics);
    audit::AuditLoop loop(
        options, [&policy] { return policy.current(); }, metrics);
    // Probes and metrics: ready once pods and nodes are listed.
    const server::StatusRoutes routes(
        [&loop] {
          return server::StatusRoutes::Readiness{loop.synced(), ""};
        },
        [&] { return metrics.render(loop.synced()); });
    // Its page grows with the cluster (a series per namespace, reason and result exposed): 16 MiB of answers
    // in flight, as it had before the status ports shared their options, holds two scrapes of a page for about
    // 80,000 such series.
    server::HttpServer server(
        server::status_server_options(flags["listen-address"].as<std::string>(), 10s, std::size_t{16} << 20),
        server::TlsProvider{}, routes);
    const std::string address = server.bind();
    policy.watch(1s);
    loop.start();
    log::info("listening", {{"address", address},
                            {"apiserver", options.apiserver.url()},
                            {"lease", options.lease_namespace + "/" + options.lease_name},
                            {"identity", options.identity},
                            {"version", GPUGUARD_VERSION}});
    const auto stop_delivered = stop_signals.release();  // to this thread alone; held again before the server goes
    server.run();
    loop.stop();
  });
}

}  // namespace

int run_audit_controller_command(int argc, char** argv) {
  po::options_description description(kUsage);
  add_audit_controller_flags(description);
  const cli::Parsed parsed = cli::parse_command_line(kProgram, GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;
  const po::variables_map& flags = *parsed.flags;
  audit::AuditLoopOptions options;
  if (const int status = read_loop_options(flags, options); status != 0) return status;
  return serve_audit(flags, options);
}

}  // namespace gpuguard::webhook

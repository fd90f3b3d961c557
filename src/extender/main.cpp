#include <boost/program_options.hpp>

#include <iostream>
#include <memory>
#include <string>

#include "gpuguard/cli/apiserver_flags.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/cli/server_flags.hpp"
#include "gpuguard/extender/cluster_state.hpp"
#include "gpuguard/extender/extender_handler.hpp"
#include "gpuguard/kube/informer.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/policy/policy_watcher.hpp"
#include "gpuguard/server/http_server.hpp"
#include "gpuguard/tls/server_context.hpp"

namespace po = boost::program_options;
using namespace gpuguard;

namespace {

constexpr const char* kProgram = "gpuguard-scheduler-extender";
constexpr const char* kUsage =
    "gpuguard-scheduler-extender: a kube-scheduler extender that packs GPU pods onto the nodes whose GPUs\n"
    "are already in use, so that whole nodes stay free for large requests.\n\n"
    "Usage:\n"
    "  gpuguard-scheduler-extender --tls-cert-file FILE --tls-private-key-file FILE [options]\n"
    "  gpuguard-scheduler-extender --insecure-listen-address 127.0.0.1:8888 [options]\n\n"
    "In a pod it reaches the Kubernetes API with its service account; elsewhere give --apiserver-url,\n"
    "--token-file and --ca-file.\n\n"
    "Options";

// Bound pods that still hold their resources. The extender re-checks both conditions on every event.
constexpr const char* kPodSelector = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";

std::optional<std::string> url_prefix(const po::variables_map& flags) {
  std::string prefix = flags["url-prefix"].as<std::string>();
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  if (prefix.empty() || prefix.front() != '/' || prefix.find_first_of("?# ") != std::string::npos) return std::nullopt;
  return prefix == "/" ? std::string{} : prefix;
}

int serve(const po::variables_map& flags) {
  const bool insecure = flags.count("insecure-listen-address") > 0;
  if (insecure == cli::has_tls_flags(flags)) {
    std::cerr << kProgram
              << ": give either --insecure-listen-address or both --tls-cert-file and "
                 "--tls-private-key-file (see --help)\n";
    return 2;
  }
  std::optional<server::ServerOptions> options = cli::server_options(kProgram, flags);
  const std::optional<std::string> prefix = url_prefix(flags);
  if (!options) return 2;
  if (!prefix) {
    std::cerr << kProgram << ": --url-prefix must be a path starting with /\n";
    return 2;
  }
  if (insecure) options->listen_address = flags["insecure-listen-address"].as<std::string>();
  kube::ApiServer apiserver;
  if (const int status = cli::require_api_server(kProgram, flags, apiserver); status != 0) return status;

  return cli::run_service([&] {
    cli::StopSignalsHeld stop_signals;  // first: before the watchers' and informers' threads, which keep them blocked
    extender::ExtenderMetrics metrics(GPUGUARD_VERSION, !insecure);
    policy::PolicyWatcher policy(cli::path_flag(flags, "policy-dir"), metrics);
    std::unique_ptr<tls::CertificateWatcher> certificate;
    server::TlsProvider tls;
    if (!insecure) {
      certificate = std::make_unique<tls::CertificateWatcher>(flags["tls-cert-file"].as<std::string>(),
                                                              flags["tls-private-key-file"].as<std::string>(), metrics);
      tls = [&certificate] { return certificate->current(); };
    }
    extender::ClusterState state([](std::string_view resource, std::string_view name, std::string_view why) {
      log::warn("quantity not counted as written",
                {{"resource", resource},
                 {"name", name},
                 {"why", why},
                 {"effect", resource == "nodes" ? "no pod asking for that resource is placed on this node"
                                                : "counted as 0, or as 2^40 beyond it, on its node"}});
    });
    kube::InformerOptions informer_options;
    informer_options.user_agent = std::string(kProgram) + "/" + GPUGUARD_VERSION;
    kube::Informers informers(
        apiserver,
        {{"pods", "/api/v1/pods", kPodSelector, &state.pods()}, {"nodes", "/api/v1/nodes", "", &state.nodes()}},
        informer_options, [&metrics](std::string_view resource, kube::ReflectorOutcome outcome) {
          metrics.count_informer(resource, outcome);
        });
    extender::ExtenderHandler handler(
        *prefix, state, [&informers] { return informers.synced(); }, [&policy] { return policy.current(); }, metrics);
    options->on_shutdown = [&handler] { handler.set_shutting_down(); };
    server::HttpServer server(*options, tls, handler);
    const std::string address = server.bind();
    informers.start();
    policy.watch(std::chrono::seconds(1));
    if (certificate) certificate->watch(std::chrono::seconds(2));
    log::info("listening", {{"address", address},
                            {"tls", !insecure},
                            {"filter", *prefix + "/filter"},
                            {"prioritize", *prefix + "/prioritize"},
                            {"apiserver", apiserver.url()},
                            {"version", GPUGUARD_VERSION}});
    const auto stop_delivered = stop_signals.release();  // to this thread alone; held again before the server goes
    server.run();
  });
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description description(kUsage);
  cli::add_server_flags(description);
  cli::add_apiserver_flags(description);
  description.add_options()(
      "insecure-listen-address", po::value<std::string>(),
      "IP:port to serve plain HTTP on instead of HTTPS; only for a kube-scheduler on the same host (127.0.0.1)")(
      "url-prefix", po::value<std::string>()->default_value("/scheduler"),
      "the extender's urlPrefix path: <prefix>/filter, <prefix>/prioritize")(
      "policy-dir", po::value<std::string>(),
      "mounted gpuguard-policy ConfigMap: its gpuResources say which resources are GPUs; re-read on change");
  const cli::Parsed parsed = cli::parse_command_line(kProgram, GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;
  return serve(*parsed.flags);
}

#include <boost/program_options.hpp>

#include <iostream>
#include <string>

#include <chrono>
#include <filesystem>
#include <optional>

#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/cli/server_flags.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/policy/policy_watcher.hpp"
#include "gpuguard/server/http_server.hpp"
#include "gpuguard/tls/server_context.hpp"
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
    "  gpuguard-webhook review FILE|-     review an AdmissionReview or a bare Pod offline and print\n"
    "                                     the response and the decoded JSON Patch\n\n"
    "Options";

int serve(const po::variables_map& flags) {
  if (!cli::has_tls_flags(flags)) {
    std::cerr << "gpuguard-webhook: --tls-cert-file and --tls-private-key-file are required (see --help)\n";
    return 2;
  }
  std::optional<server::ServerOptions> parsed_options = cli::server_options("gpuguard-webhook", flags);
  if (!parsed_options) return 2;
  server::ServerOptions options = std::move(*parsed_options);
  return cli::run_service([&] {
    webhook::WebhookMetrics metrics(GPUGUARD_VERSION);
    policy::PolicyWatcher policy(cli::path_flag(flags, "policy-dir"), metrics);
    tls::CertificateWatcher certificate(flags["tls-cert-file"].as<std::string>(),
                                        flags["tls-private-key-file"].as<std::string>(), metrics);
    webhook::WebhookHandler handler([&policy] { return policy.current(); }, metrics);
    options.on_shutdown = [&handler] { handler.set_ready(false); };
    server::HttpServer server(
        options, [&certificate] { return certificate.current(); }, handler);
    const std::string address = server.bind();
    policy.watch(std::chrono::seconds(1));
    certificate.watch(std::chrono::seconds(2));
    handler.set_ready(true);
    log::info("listening", {{"address", address}, {"version", GPUGUARD_VERSION}});
    server.run();
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "review") {
    std::optional<std::filesystem::path> dir;
    if (argc == 5 && std::string(argv[2]) == "--policy-dir") dir = argv[3];
    if (argc != 3 && !(argc == 5 && dir)) {
      std::cerr << "usage: gpuguard-webhook review [--policy-dir DIR] FILE|-\n";
      return 2;
    }
    return webhook::run_review_command(argv[argc - 1], dir);
  }

  po::options_description description(kUsage);
  cli::add_server_flags(description);
  description.add_options()("policy-dir", po::value<std::string>(),
                            "mounted policy ConfigMap, re-read on change; without it the default policy applies");
  const cli::Parsed parsed = cli::parse_command_line("gpuguard-webhook", GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;
  const po::variables_map& flags = *parsed.flags;
  return serve(flags);
}

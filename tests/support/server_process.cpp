#include "server_process.hpp"

#include <algorithm>

namespace gpuguard::test {

std::string certs_dir() { return GPUGUARD_TEST_CERTS_DIR; }

namespace {

std::vector<std::string> webhook_argv(std::vector<std::string> extra_args) {
  auto given = [&](const std::string& flag) {
    return std::find(extra_args.begin(), extra_args.end(), flag) != extra_args.end();
  };
  std::vector<std::string> args = {GPUGUARD_WEBHOOK_BIN, "--listen-address", "127.0.0.1:0"};
  if (!given("--threads")) args.insert(args.end(), {"--threads", "2"});
  if (!given("--tls-cert-file")) {
    args.insert(args.end(),
                {"--tls-cert-file", certs_dir() + "/tls.crt", "--tls-private-key-file", certs_dir() + "/tls.key"});
  }
  if (!given("--shutdown-delay")) args.insert(args.end(), {"--shutdown-delay", "0.2"});
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  return args;
}

}  // namespace

ServerProcess::ServerProcess(std::vector<std::string> argv)
    : ChildProcess(std::move(argv)), port_(logged_port("listening")) {}

WebhookProcess::WebhookProcess(std::vector<std::string> extra_args)
    : ServerProcess(webhook_argv(std::move(extra_args))) {}

ExitResult run_webhook(const std::string& args) { return run_binary(GPUGUARD_WEBHOOK_BIN, args); }

}  // namespace gpuguard::test

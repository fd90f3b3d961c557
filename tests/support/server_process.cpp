#include "server_process.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>

#include "eventually.hpp"

namespace gpuguard::test {

using namespace std::chrono_literals;

std::string certs_dir() { return GPUGUARD_TEST_CERTS_DIR; }

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

ServerProcess::ServerProcess(std::vector<std::string> argv)
    : ChildProcess(std::move(argv)), port_(logged_port("listening")) {}

WebhookProcess::WebhookProcess(std::vector<std::string> extra_args)
    : ServerProcess(webhook_argv(std::move(extra_args))) {}

ExitResult run_webhook(const std::string& args) { return run_binary(GPUGUARD_WEBHOOK_BIN, args); }

uid_t own_test_user() { return static_cast<uid_t>(2000000000 + ::getpid()); }

int serves_or_says_why_at_each_task_limit(const std::vector<std::string>& argv, unsigned most) {
  INFO("run as root: each start takes a user of its own");
  REQUIRE(::geteuid() == 0);
  int served = 0;
  for (unsigned tasks = 1; tasks <= most; ++tasks) {
    const std::string user = std::to_string(own_test_user());  // each run reaped before the next starts
    std::vector<std::string> limited = {"setpriv",
                                        "--reuid=" + user,
                                        "--regid=" + user,
                                        "--clear-groups",
                                        "--",
                                        "env",
                                        "ASAN_OPTIONS=detect_leaks=0",
                                        "prlimit",
                                        "--nproc=" + std::to_string(tasks) + ":" + std::to_string(tasks),
                                        "--"};
    limited.insert(limited.end(), argv.begin(), argv.end());
    ChildProcess child(limited);
    const bool settled = eventually(
        [&] { return !child.running() || child.log().find("\"msg\":\"listening\"") != std::string::npos; }, 10s);
    const int status = child.running() ? child.terminate(10s) : child.wait_exit(0ms);
    INFO("at most " << tasks << " tasks: exit status " << status << "; its log:\n" << child.log());
    CHECK(settled);
    CHECK((status == 0 || (status == 1 && child.log().find("cannot start") != std::string::npos)));
    served += status == 0 ? 1 : 0;
  }
  return served;
}

}  // namespace gpuguard::test

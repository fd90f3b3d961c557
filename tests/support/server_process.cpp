#include "server_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

extern char** environ;

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

WebhookProcess::WebhookProcess(std::vector<std::string> extra_args)
    : ServerProcess(webhook_argv(std::move(extra_args))) {}

ServerProcess::ServerProcess(std::vector<std::string> args) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  stderr_fd_ = pipe_fds[0];
  if (rc != 0) throw std::runtime_error("cannot start " + args[0]);

  // Read log lines until the server says where it listens.
  std::string pending;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd pfd{stderr_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stderr_fd_, chunk, sizeof chunk);
    if (n <= 0) break;
    pending.append(chunk, static_cast<std::size_t>(n));
    std::size_t newline;
    while ((newline = pending.find('\n')) != std::string::npos) {
      const auto line = nlohmann::json::parse(pending.substr(0, newline), nullptr, false);
      pending.erase(0, newline + 1);
      if (line.is_object() && line.value("msg", "") == "listening") {
        const std::string address = line.value("address", "");
        port_ = static_cast<unsigned short>(std::stoi(address.substr(address.rfind(':') + 1)));
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread([fd = stderr_fd_] {
          char sink[4096];
          while (read(fd, sink, sizeof sink) > 0) {
          }
        }).detach();
        return;
      }
    }
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  throw std::runtime_error(args[0] + " did not report listening; stderr: " + pending);
}

int ServerProcess::terminate() {
  if (pid_ <= 0) return -1;
  send_sigterm();
  return wait_exit(30);
}

void ServerProcess::send_sigterm() const { kill(pid_, SIGTERM); }

int ServerProcess::wait_exit(int seconds) {
  if (pid_ <= 0) return -1;
  int status = 0;
  for (int i = 0; i < seconds * 10; ++i) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return -1;
}

bool ServerProcess::running() {
  if (pid_ <= 0) return false;
  if (waitpid(pid_, nullptr, WNOHANG) == 0) return true;
  pid_ = -1;
  return false;
}

ExitResult run_webhook(const std::string& args) { return run_binary(GPUGUARD_WEBHOOK_BIN, args); }

ExitResult run_binary(const std::string& binary, const std::string& args) {
  ExitResult result;
  // stderr joins stdout first, so `args` may still send it elsewhere.
  FILE* pipe = popen((binary + " 2>&1 " + args).c_str(), "r");
  if (pipe == nullptr) return result;
  char chunk[4096];
  while (std::size_t n = fread(chunk, 1, sizeof chunk, pipe)) result.output.append(chunk, n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

}  // namespace gpuguard::test

namespace gpuguard::test {

std::size_t ServerProcess::status_kib(const std::string& field) const {
  std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with(field + ":")) return std::stoul(line.substr(field.size() + 1));
  }
  return 0;
}

}  // namespace gpuguard::test

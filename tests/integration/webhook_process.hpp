#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace gpuguard::test {

// Starts gpuguard-webhook on 127.0.0.1 with a kernel-chosen port and waits for its "listening" log line.
// Certificates come from the test CA unless extra_args name others; the shutdown delay is 0.2 s unless
// extra_args set it, so that tests which do not study the drain stay quick.
class WebhookProcess {
 public:
  explicit WebhookProcess(std::vector<std::string> extra_args = {});
  ~WebhookProcess();
  WebhookProcess(const WebhookProcess&) = delete;
  WebhookProcess& operator=(const WebhookProcess&) = delete;

  unsigned short port() const { return port_; }
  // Sends SIGTERM and returns the exit status (-1 when it did not exit normally within 30 s).
  int terminate();
  void send_sigterm() const;
  // The exit status once it exits (-1 when it did not exit normally within `seconds`).
  int wait_exit(int seconds);

 private:
  pid_t pid_ = -1;
  int stderr_fd_ = -1;
  unsigned short port_ = 0;
};

std::string certs_dir();

struct ExitResult {
  int status = -1;
  std::string output;  // stdout and stderr together
};
// Runs gpuguard-webhook with `args` to completion (for start-up failures and the review command).
ExitResult run_webhook(const std::string& args);

}  // namespace gpuguard::test

#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace gpuguard::test {

// Starts gpuguard-webhook on 127.0.0.1 with a kernel-chosen port and waits for its "listening" log line.
class WebhookProcess {
 public:
  explicit WebhookProcess(std::vector<std::string> extra_args = {});
  ~WebhookProcess();
  WebhookProcess(const WebhookProcess&) = delete;
  WebhookProcess& operator=(const WebhookProcess&) = delete;

  unsigned short port() const { return port_; }
  // Sends SIGTERM and returns the exit status (-1 when it did not exit normally within 30 s).
  int terminate();

 private:
  pid_t pid_ = -1;
  int stderr_fd_ = -1;
  unsigned short port_ = 0;
};

std::string certs_dir();

}  // namespace gpuguard::test

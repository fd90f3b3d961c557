#pragma once
// A gpuguard server binary started for a test, known by the port it reports: the webhook, the extender and
// the audit controller.
#include <string>
#include <vector>

#include "child_process.hpp"

namespace gpuguard::test {

// Starts a gpuguard server binary (argv[0] is its path) and waits for its "listening" log line, which names
// the address (tests pass port 0 and read the kernel's choice).
class ServerProcess : public ChildProcess {
 public:
  explicit ServerProcess(std::vector<std::string> argv);

  unsigned short port() const { return port_; }

 private:
  unsigned short port_ = 0;
};

// gpuguard-webhook on 127.0.0.1 with a kernel-chosen port. Certificates come from the test CA unless
// extra_args name others; the shutdown delay is 0.2 s unless extra_args set it, so that tests which do
// not study the drain stay quick.
class WebhookProcess : public ServerProcess {
 public:
  explicit WebhookProcess(std::vector<std::string> extra_args = {});
};

std::string certs_dir();

// Runs gpuguard-webhook with `args` (a shell word list) to completion.
ExitResult run_webhook(const std::string& args);

}  // namespace gpuguard::test

#pragma once
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace gpuguard::test {

// Starts a gpuguard server binary (argv[0] is its path) and waits for its "listening" log line, which
// names the address (tests pass port 0 and read the kernel's choice). stderr is drained afterwards so
// that the server never blocks on a full pipe. The process is killed when this object goes away.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> argv);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  unsigned short port() const { return port_; }
  pid_t pid() const { return pid_; }
  // A field of /proc/PID/status in KiB, such as "VmRSS" or "VmHWM" (the peak); 0 when absent.
  std::size_t status_kib(const std::string& field) const;
  // Sends SIGTERM and returns the exit status (-1 when it did not exit normally within 30 s).
  int terminate();
  void send_sigterm() const;
  // The exit status once it exits (-1 when it did not exit normally within `seconds`).
  int wait_exit(int seconds);
  bool running();

 private:
  pid_t pid_ = -1;
  int stderr_fd_ = -1;
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

struct ExitResult {
  int status = -1;
  std::string output;  // stdout and stderr together
};
// Runs `binary` with `args` (a shell word list) to completion, for start-up failures and one-shot commands.
ExitResult run_binary(const std::string& binary, const std::string& args);
// The same for gpuguard-webhook.
ExitResult run_webhook(const std::string& args);

}  // namespace gpuguard::test

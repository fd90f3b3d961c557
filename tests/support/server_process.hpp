#pragma once
// A gpuguard server binary started for a test, known by the port it reports: the webhook, the extender and
// the audit controller.
#include <sys/types.h>

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

// The command line WebhookProcess starts.
std::vector<std::string> webhook_argv(std::vector<std::string> extra_args = {});

// A user no other process has (derived from this process's ID), for a test that must count a user's tasks:
// serves_or_says_why_at_each_task_limit runs programs as it, the server's own test a forked child. A file only
// root may read (a private key) must be given to it first.
uid_t own_test_user();

// Starts `argv` (a server program, as ServerProcess would) once at each RLIMIT_NPROC from 1 to `most` tasks,
// each time as own_test_user(), so that no more than that many of its threads can exist (setpriv(1) and
// prlimit(1): this needs root; the sanitizers' leak check, which starts a thread at exit, is off). At every
// limit it must either serve and, at SIGTERM, exit 0, or exit 1 logging why it cannot start; never hang, never
// die by a signal (an abort). Each limit is CHECKed here; returns how many of them it served under.
int serves_or_says_why_at_each_task_limit(const std::vector<std::string>& argv, unsigned most);

// Runs gpuguard-webhook with `args` (a shell word list) to completion.
ExitResult run_webhook(const std::string& args);

}  // namespace gpuguard::test

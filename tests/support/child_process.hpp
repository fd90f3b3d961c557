#pragma once
// One child process a test starts (a gpuguard program, a peer, a stand-in), and ends whatever the test comes
// to: every harness starts its children here, so that none outlives its test and each keeps its log.
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace gpuguard::test {

struct ChildOptions {
  std::vector<std::string> env{};  // NAME=value entries added to the test's own environment
  std::filesystem::path log{};     // where its stderr goes; empty: a file of its own, removed with it
  std::filesystem::path cgroup{};  // a cgroup directory it joins before it executes; empty: the test's own
};

class ChildProcess {
 public:
  // Starts argv[0] (a path, or a name looked up in PATH). Throws when it cannot be started.
  explicit ChildProcess(std::vector<std::string> argv, ChildOptions options = {});
  // SIGKILL, then reaped, when it still runs.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // False once it has exited (then reaped, its status kept for wait_exit).
  bool running();
  void signal(int number) const;
  // Its exit status once it exits; -1 when a signal ended it, -2 when it still runs after `limit` (it is
  // killed with this object). Either of those prints the end of its log, for the test's report.
  int wait_exit(std::chrono::milliseconds limit);
  // SIGTERM, then wait_exit; a status other than 0 prints the end of its log.
  int terminate(std::chrono::milliseconds limit = std::chrono::seconds(30));

  std::string log() const;
  // The port of `"address":"127.0.0.1:N"` in the first log line whose message is `message` ("listening",
  // "serving probes and metrics"), waiting for that line. Throws, with the log, when it does not come.
  unsigned short logged_port(const std::string& message,
                             std::chrono::milliseconds limit = std::chrono::seconds(10)) const;
  // A field of /proc/PID/status in KiB, such as "VmRSS" or "VmHWM" (the peak); 0 when absent.
  std::size_t status_kib(const std::string& field) const;
  // Its threads, each as "TID NAME", from /proc/PID/task.
  std::vector<std::string> threads() const;
  // True when its main thread is the only one the kernel may give a process-directed `signal` (every other
  // thread has it in its SigBlk mask of /proc/PID/task/TID/status).
  bool main_thread_alone_takes(int signal) const;

 private:
  // Each starts `program` with its stderr on `log_fd`; 0, or the errno of what failed.
  int spawn(const std::string& program, char* const* argv, char* const* envp, int log_fd);
  int fork_into(const std::filesystem::path& cgroup, const std::string& program, char* const* argv, char* const* envp,
                int log_fd);
  void show_log_end(const std::string& why) const;

  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;  // as waitpid gave it, once reaped
  std::filesystem::path log_;
  bool own_log_ = false;
};

struct ExitResult {
  int status = -1;
  std::string output;  // stdout and stderr together
};
// Runs `binary` with `args` (a shell word list) to completion, for start-up failures and one-shot commands.
ExitResult run_binary(const std::string& binary, const std::string& args);

}  // namespace gpuguard::test

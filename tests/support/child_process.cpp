// Starting, watching and ending the processes tests start (child_process.hpp says why).
#include "child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

extern char** environ;

namespace gpuguard::test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

// argv[0] as a path: itself when it holds a slash, else the first match on PATH. Found before the fork,
// as the child may only make async-signal-safe calls.
std::string executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path == nullptr ? "/usr/bin:/bin" : path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path candidate = fs::path(dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  throw std::runtime_error(name + " is not on PATH");
}

fs::path own_log() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp == nullptr ? "/tmp" : tmp) + "/gpuguard-test-child-XXXXXX";
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0) throw std::runtime_error("cannot make a log file in " + pattern);
  ::close(fd);
  return pattern;
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> args, ChildOptions options)
    : log_(std::move(options.log)), own_log_(log_.empty()) {
  const std::string program = executable(args.at(0));
  if (own_log_) log_ = own_log();
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (auto& e : options.env) envp.push_back(e.data());
  envp.push_back(nullptr);
  // Emptied here, before the constructor returns: what the test reads next is this process's log, never
  // the one before it in the same file.
  const int out = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int error = out < 0                  ? errno
                    : options.cgroup.empty() ? spawn(program, argv.data(), envp.data(), out)
                                             : fork_into(options.cgroup, program, argv.data(), envp.data(), out);
  if (out >= 0) ::close(out);
  if (error != 0) {
    pid_ = -1;
    std::error_code ignored;
    if (own_log_) fs::remove(log_, ignored);
    throw std::runtime_error("cannot start " + program + ": " + std::strerror(error));
  }
}

int ChildProcess::spawn(const std::string& program, char* const* argv, char* const* envp, int log_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDERR_FILENO);
  const int error = ::posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv, envp);
  posix_spawn_file_actions_destroy(&actions);
  return error;
}

int ChildProcess::fork_into(const fs::path& cgroup, const std::string& program, char* const* argv, char* const* envp,
                            int log_fd) {
  // posix_spawn has no step between the fork and the exec to join a cgroup in: this child forks, and
  // makes only async-signal-safe calls until it executes.
  const std::string procs = (cgroup / "cgroup.procs").string();
  pid_ = ::fork();
  if (pid_ < 0) return errno;
  if (pid_ == 0) {
    const int fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ::write(fd, "0", 1) != 1) ::_exit(125);
    if (::dup2(log_fd, STDERR_FILENO) < 0) ::_exit(125);
    ::execve(program.c_str(), argv, envp);
    ::_exit(126);
  }
  return 0;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (own_log_) {
    std::error_code ignored;
    fs::remove(log_, ignored);
  }
}

bool ChildProcess::running() {
  if (pid_ <= 0 || reaped_) return false;
  if (::waitpid(pid_, &status_, WNOHANG) != pid_) return true;
  reaped_ = true;  // its status kept for wait_exit
  return false;
}

void ChildProcess::signal(int number) const {
  if (pid_ > 0 && !reaped_) ::kill(pid_, number);
}

int ChildProcess::wait_exit(std::chrono::milliseconds limit) {
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      show_log_end("did not exit within " + std::to_string(limit.count()) + " ms");
      return -2;
    }
    std::this_thread::sleep_for(20ms);
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  show_log_end("ended by signal " + std::to_string(WTERMSIG(status_)));
  return -1;
}

int ChildProcess::terminate(std::chrono::milliseconds limit) {
  signal(SIGTERM);
  const int code = wait_exit(limit);
  // A sanitizer's report (ThreadSanitizer exits 66) is a program's last words on stderr.
  if (code > 0) show_log_end("exited " + std::to_string(code));
  return code;
}

std::string ChildProcess::log() const {
  std::ifstream in(log_);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

unsigned short ChildProcess::logged_port(const std::string& message, std::chrono::milliseconds limit) const {
  const std::string marker = "127.0.0.1:";
  const auto deadline = std::chrono::steady_clock::now() + limit;
  do {
    // Exited (a zombie not yet reaped): the line will not come.
    siginfo_t exited{};
    const bool gone = reaped_ || (::waitid(P_PID, static_cast<id_t>(pid_), &exited, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                                  exited.si_pid == pid_);
    std::istringstream lines(log());
    for (std::string line; std::getline(lines, line);) {
      const auto entry = nlohmann::json::parse(line, nullptr, false);
      if (!entry.is_object() || entry.value("msg", "") != message) continue;
      const std::string address = entry.value("address", "");
      if (address.starts_with(marker)) return static_cast<unsigned short>(std::stoi(address.substr(marker.size())));
    }
    if (gone) break;
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < deadline);
  throw std::runtime_error("no \"" + message + "\" line with an address on 127.0.0.1 in the log of " +
                           std::to_string(pid_) + ":\n" + log());
}

std::size_t ChildProcess::status_kib(const std::string& field) const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(field + ":")) return std::stoul(line.substr(field.size() + 1));
  }
  return 0;
}

namespace {

// "TID NAME" of each thread of `pid` that `keep` chooses from its /proc/PID/task/TID/status.
template <typename Keep>
std::vector<std::string> threads_where(pid_t pid, Keep keep) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "status");
    std::string name;
    std::string blocked;
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("Name:\t")) name = line.substr(6);
      if (line.starts_with("SigBlk:\t")) blocked = line.substr(8);
    }
    if (!blocked.empty() && keep(std::stoull(blocked, nullptr, 16))) {
      found.push_back(task.path().filename().string() + " " + name);
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

std::vector<std::string> ChildProcess::threads() const {
  return threads_where(pid_, [](unsigned long long) { return true; });
}

bool ChildProcess::main_thread_alone_takes(int signal) const {
  const std::vector<std::string> taking =
      threads_where(pid_, [signal](unsigned long long blocked) { return (blocked >> (signal - 1) & 1) == 0; });
  return taking.size() == 1 && taking[0].starts_with(std::to_string(pid_) + " ");
}

void ChildProcess::show_log_end(const std::string& why) const {
  const std::string text = log();
  std::cerr << "child " << pid_ << " " << why << "; the end of its log:\n"
            << text.substr(text.size() > 16384 ? text.size() - 16384 : 0) << "\n";
}

ExitResult run_binary(const std::string& binary, const std::string& args) {
  ExitResult result;
  // stderr joins stdout first, so `args` may still send it elsewhere.
  FILE* pipe = ::popen((binary + " 2>&1 " + args).c_str(), "r");
  if (pipe == nullptr) return result;
  char chunk[4096];
  while (std::size_t n = std::fread(chunk, 1, sizeof chunk, pipe)) result.output.append(chunk, n);
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace gpuguard::test

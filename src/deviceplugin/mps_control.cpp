// `gpuguard-device-plugin mps-control`: NVIDIA's MPS control daemon, one per GPU that sharing.mps shares,
// for the chart's MPS DaemonSet. It reads the device plugin's own config and flags, so the GPUs it serves
// are the ones the plugin advertises replicas of. Per GPU: the compute mode EXCLUSIVE_PROCESS, a tmpfs of
// its own as the daemon's /dev/shm, the daemon started with CUDA_VISIBLE_DEVICES naming that GPU alone,
// one replica's limits as its defaults, then the readiness file the plugin waits for. Each daemon is asked
// for its defaults every --check-interval; one that does not answer loses its readiness file (its replicas
// turn Unhealthy) and is started again. SIGTERM: readiness removed, quit, the compute mode DEFAULT again.
// The pure part (paths, limits, commands) is mps.cpp.
#include "mps_control.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>
#include <boost/program_options.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/deviceplugin/flags.hpp"
#include "gpuguard/deviceplugin/mps.hpp"
#include "gpuguard/discovery/discovery.hpp"
#include "gpuguard/log/log.hpp"

extern char** environ;

namespace gpuguard::deviceplugin {

using discovery::discover;
using discovery::Discovery;
using discovery::host_path;
namespace {

namespace fs = std::filesystem;
namespace po = boost::program_options;
using namespace std::chrono_literals;

constexpr auto kCommandTimeout = 30s;

struct Tools {
  std::string nvidia_smi, mps_control, shm_size;
};

struct Ran {
  int status = -1;  // the exit status; -1 when it could not run, or was killed at the timeout
  std::string output;
};

std::string describe(const std::vector<std::string>& argv, const std::string& input) {
  std::string text;
  for (const std::string& arg : argv) text.append(text.empty() ? "" : " ").append(arg);
  if (!input.empty()) text.append(" <<< ").append(input);
  return text;
}

// Runs argv[0] (looked up in PATH) with this process's environment less its CUDA_* variables, plus `env`;
// writes `input` to its stdin; its output goes to `output_file` (not a pipe: nvidia-cuda-mps-control -d
// leaves a daemon behind that would hold a pipe open). With `shm`, the program runs in a mount namespace of
// its own with `shm` bound on /dev/shm, which the daemon it starts keeps.
Ran run(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& input,
        const fs::path& output_file, const fs::path* shm = nullptr) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, "CUDA_", 5) != 0) environment.emplace_back(*entry);
  }
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> envp, args;
  for (std::string& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& arg : argv_copy) args.push_back(arg.data());
  args.push_back(nullptr);

  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return {-1, std::string("pipe: ") + std::strerror(errno)};
  const int out = ::open(output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    ::close(in[0]);
    ::close(in[1]);
    return {-1, output_file.string() + ": " + std::strerror(errno)};
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: async-signal-safe calls only until exec.
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (shm != nullptr) {
      if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0 ||
          ::mount(shm->c_str(), "/dev/shm", nullptr, MS_BIND, nullptr) != 0) {
        constexpr char kWhy[] = "gpuguard: cannot bind the GPU's shm on /dev/shm in a mount namespace of its own\n";
        [[maybe_unused]] const auto written = ::write(STDERR_FILENO, kWhy, sizeof kWhy - 1);
        ::_exit(126);
      }
    }
    ::execvpe(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out);
  if (pid < 0) {
    ::close(in[1]);
    return {-1, std::string("fork: ") + std::strerror(errno)};
  }
  // A command is one short line: it fits the pipe's buffer, so this write does not wait on the child.
  [[maybe_unused]] const auto written = ::write(in[1], input.data(), input.size());
  ::close(in[1]);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + kCommandTimeout;
  pid_t waited = 0;
  while ((waited = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  Ran ran;
  if (waited == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    ran.output = "no answer within " + std::to_string(kCommandTimeout.count()) + " s; killed. ";
  } else if (WIFEXITED(status)) {
    ran.status = WEXITSTATUS(status);
  }
  std::ifstream file(output_file);
  ran.output += std::string(std::istreambuf_iterator<char>(file), {});
  if (ran.status == 127) ran.output += "(" + argv[0] + " not found)";
  return ran;
}

class Daemon {
 public:
  Daemon(MpsGpu gpu, const fs::path& root, const Tools& tools)
      : gpu_(std::move(gpu)), paths_(mps_paths(root, gpu_.uuid)), tools_(tools) {}

  // Everything up to readiness; throws with the step that failed.
  void start() {
    for (const fs::path& dir : {paths_.pipe, paths_.log, paths_.shm}) fs::create_directories(dir);
    must({tools_.nvidia_smi, "-i", gpu_.uuid, "-c", "EXCLUSIVE_PROCESS"}, {}, "");
    exclusive_ = true;
    mount_shm();
    must({tools_.mps_control, "-d"}, env(), "", &paths_.shm);
    started_ = true;
    for (const std::string& command : mps_default_commands(gpu_)) must({tools_.mps_control}, env(), command);
    if (!(std::ofstream(paths_.ready) << gpu_.uuid << " " << gpu_.replicas << " replicas\n")) {
      throw std::runtime_error("GPU " + gpu_.uuid + ": cannot write " + paths_.ready.string());
    }
    log::info("MPS daemon ready", {{"gpu", gpu_.uuid},
                                   {"replicas", gpu_.replicas},
                                   {"active_thread_percentage", mps_thread_percentage(1, gpu_.replicas)},
                                   {"pipe", paths_.pipe.string()}});
  }

  bool answers() {
    return run({tools_.mps_control}, env(), "get_default_active_thread_percentage", paths_.log / "gpuguard-check.out")
               .status == 0;
  }

  void not_ready() {
    std::error_code ec;
    fs::remove(paths_.ready, ec);
  }

  // Undoes what start() did, in reverse; readiness first, so that the plugin stops handing out replicas
  // before the daemon goes.
  void stop() {
    not_ready();
    if (started_) {
      const Ran quit = run({tools_.mps_control}, env(), "quit", paths_.log / "gpuguard-quit.out");
      if (quit.status != 0) log::warn("MPS daemon: quit failed", {{"gpu", gpu_.uuid}, {"output", quit.output}});
      started_ = false;
    }
    if (mounted_ && ::umount2(paths_.shm.c_str(), MNT_DETACH) == 0) mounted_ = false;
    if (exclusive_) {
      const Ran mode =
          run({tools_.nvidia_smi, "-i", gpu_.uuid, "-c", "DEFAULT"}, {}, "", paths_.log / "gpuguard-mode.out");
      if (mode.status != 0) {
        log::warn("MPS: the compute mode was not put back to DEFAULT", {{"gpu", gpu_.uuid}, {"output", mode.output}});
      }
      exclusive_ = false;
    }
    log::info("MPS daemon stopped", {{"gpu", gpu_.uuid}});
  }

  const std::string& uuid() const { return gpu_.uuid; }

 private:
  std::vector<std::string> env() const {
    return {"CUDA_VISIBLE_DEVICES=" + gpu_.uuid, "CUDA_MPS_PIPE_DIRECTORY=" + paths_.pipe.string(),
            "CUDA_MPS_LOG_DIRECTORY=" + paths_.log.string()};
  }

  void must(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& input,
            const fs::path* shm = nullptr) {
    const Ran ran = run(argv, env, input, paths_.log / "gpuguard-step.out", shm);
    if (ran.status != 0) {
      throw std::runtime_error("GPU " + gpu_.uuid + ": " + describe(argv, input) + ": exit " +
                               std::to_string(ran.status) + ": " + ran.output);
    }
  }

  // A tmpfs of this GPU's own: its daemon's and its clients' /dev/shm. Mounted afresh at each start, so a
  // daemon started again does not find a dead one's segments.
  void mount_shm() {
    ::umount2(paths_.shm.c_str(), MNT_DETACH);
    const std::string options = "size=" + tools_.shm_size + ",mode=1777";
    if (::mount("tmpfs", paths_.shm.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options.c_str()) != 0) {
      throw std::runtime_error("GPU " + gpu_.uuid + ": mounting a tmpfs (" + options + ") on " + paths_.shm.string() +
                               ": " + std::strerror(errno));
    }
    mounted_ = true;
  }

  MpsGpu gpu_;
  MpsPaths paths_;
  const Tools& tools_;
  bool exclusive_ = false;  // the compute mode is set
  bool mounted_ = false;    // the shm tmpfs
  bool started_ = false;    // nvidia-cuda-mps-control -d returned 0
};

// Waits up to `timeout` for SIGTERM or SIGINT (blocked, so they wait to be taken); true when one came.
bool stop_signalled(std::chrono::milliseconds timeout) {
  const sigset_t stop = cli::stop_signals();
  const timespec wait{static_cast<time_t>(timeout.count() / 1000),
                      static_cast<long>((timeout.count() % 1000) * 1'000'000)};
  return ::sigtimedwait(&stop, nullptr, &wait) > 0;
}

}  // namespace

int run_mps_control_command(const std::vector<std::string>& args) {
  po::options_description description(
      "gpuguard-device-plugin mps-control: an NVIDIA MPS control daemon for each GPU that the config's\n"
      "sharing.mps shares, each seeing its GPU alone, with its own /dev/shm under --mps-root, one replica's\n"
      "limits as its defaults, and a readiness file the plugin waits for. Takes the device plugin's config\n"
      "file and flags. Runs until SIGTERM: exit 0 after stopping the daemons, 1 when one cannot start, 2 on\n"
      "bad flags.\n\nOptions");
  add_flags(description);
  description.add_options()("help,h", "this text")("nvidia-smi", po::value<std::string>()->default_value("nvidia-smi"),
                                                   "nvidia-smi, to set each GPU's compute mode")(
      "mps-control", po::value<std::string>()->default_value("nvidia-cuda-mps-control"),
      "NVIDIA's MPS control program")("shm-size", po::value<std::string>()->default_value("1g"),
                                      "the size of each GPU's /dev/shm tmpfs")(
      "check-interval", po::value<unsigned>()->default_value(5), "seconds between asking each daemon for its defaults");
  const cli::Parsed parsed = cli::parse_subcommand("gpuguard-device-plugin mps-control", description, args);
  if (!parsed.flags) return parsed.exit_status;
  const po::variables_map& flags = *parsed.flags;
  std::vector<std::string> warnings;
  const auto config = config_from(flags, warnings);
  if (!config) return 2;
  const Tools tools{flags["nvidia-smi"].as<std::string>(), flags["mps-control"].as<std::string>(),
                    flags["shm-size"].as<std::string>()};
  const std::chrono::milliseconds interval = std::chrono::seconds(std::max(1U, flags["check-interval"].as<unsigned>()));

  // From here SIGTERM and SIGINT wait to be taken by stop_signalled, at any step.
  const sigset_t stop = cli::stop_signals();
  ::sigprocmask(SIG_BLOCK, &stop, nullptr);

  for (const std::string& warning : warnings) log::warn("config file", {{"reason", warning}});
  const Discovery found = discover(config->discovery, config->host_root);
  const GpuPlan plan = plan_gpu_resources(found.gpus, config->mig_strategy, config->resource_name, config->sharing);
  if (plan.error) {
    log::error("MPS: cannot start", {{"reason", *plan.error}});
    return 1;
  }
  const fs::path root = host_path(config->host_root, config->gpu.mps_root);
  std::vector<Daemon> daemons;
  for (const MpsGpu& gpu : mps_gpus(plan)) daemons.emplace_back(gpu, root, tools);
  if (daemons.empty()) {
    log::info("no GPU is shared with MPS on this node (sharing.mps): idle until stopped");
    while (!stop_signalled(1h)) {
    }
    return 0;
  }
  std::size_t started = 0;
  try {
    for (Daemon& daemon : daemons) {
      daemon.start();
      ++started;
    }
  } catch (const std::exception& e) {
    log::error("MPS: cannot start", {{"reason", e.what()}});
    for (std::size_t i = 0; i <= started && i < daemons.size(); ++i) daemons[i].stop();
    return 1;
  }
  while (!stop_signalled(interval)) {
    for (Daemon& daemon : daemons) {
      if (daemon.answers()) continue;
      daemon.not_ready();
      log::warn("MPS daemon does not answer: its replicas are Unhealthy, starting it again", {{"gpu", daemon.uuid()}});
      try {
        daemon.start();
      } catch (const std::exception& e) {
        log::error("MPS daemon did not start again; tried at the next check", {{"reason", e.what()}});
      }
    }
  }
  for (Daemon& daemon : daemons) daemon.stop();
  log::info("stopped");
  return 0;
}

}  // namespace gpuguard::deviceplugin

// The real gpuguard-mask-check, run as runc runs a createRuntime hook (the container's state on its stdin)
// against a real mount namespace laid out as runc leaves one then: a stand-in for the host's /run (a tmpfs
// holding an MPS root) outside the container's root, bound below the root, with a mask mounted where it
// belongs, elsewhere, or nowhere. The namespace is a forked child's, unshared and private: its mounts go
// with it, and the child is killed and reaped whatever the test comes to. Needs root (CAP_SYS_ADMIN).
#include <catch2/catch.hpp>

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "child_process.hpp"

namespace fs = std::filesystem;
using gpuguard::test::run_binary;

namespace {

// A child in a mount namespace of its own: `host` is a tmpfs holding run/nvidia/mps, bound at <rootfs>/h
// (the root bound on itself first, as runc does);
// a mask (a tmpfs) is mounted at <rootfs>/<mask> where `mask` is not empty. It says the MPS root's device
// ("major:minor") on a pipe, then waits to be killed.
class MountNamespace {
 public:
  MountNamespace(const fs::path& host, const fs::path& rootfs, const std::string& mask) {
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(pipe_fds[0]);
      ::_exit(lay_out(host, rootfs, mask, pipe_fds[1]));
    }
    ::close(pipe_fds[1]);
    char buffer[64] = {};
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer - 1);
    ::close(pipe_fds[0]);
    if (n > 0) device_.assign(buffer, static_cast<std::size_t>(n));
  }
  ~MountNamespace() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  MountNamespace(const MountNamespace&) = delete;
  MountNamespace& operator=(const MountNamespace&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& device() const { return device_; }

 private:
  // In the child: never returns to Catch, whatever fails.
  static int lay_out(const fs::path& host, const fs::path& rootfs, const std::string& mask, int out) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 10;
    if (::mount("tmpfs", host.c_str(), "tmpfs", 0, "size=64k") != 0) return 11;
    // The root a mount of its own, as runc makes it before the container's mounts.
    if (::mount(rootfs.c_str(), rootfs.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) return 17;
    std::error_code ec;
    fs::create_directories(host / "run/nvidia/mps", ec);
    fs::create_directories(rootfs / "h", ec);
    if (ec) return 12;
    if (::mount(host.c_str(), (rootfs / "h").c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) return 13;
    if (!mask.empty()) {
      fs::create_directories(rootfs / mask, ec);
      if (::mount("tmpfs", (rootfs / mask).c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555"))
        return 14;
    }
    struct stat status {};
    if (::stat((host / "run/nvidia/mps").c_str(), &status) != 0) return 15;
    const std::string device = std::to_string(major(status.st_dev)) + ":" + std::to_string(minor(status.st_dev));
    if (::write(out, device.data(), device.size()) != static_cast<ssize_t>(device.size())) return 16;
    ::close(out);
    ::pause();
    return 0;
  }

  pid_t pid_ = -1;
  std::string device_;
};

// A directory of the test's own, removed with it.
class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("gpuguard-mask-check-" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct HookRun {
  int status;
  std::string output;
};

// The hook as runc runs it: the state on stdin, the MPS root's place in its arguments.
HookRun run_hook(const fs::path& dir, const std::string& state, const std::string& device,
                 const std::string& extra = "") {
  std::ofstream(dir / "state.json") << state;
  const auto result = run_binary(GPUGUARD_MASK_CHECK_BIN, extra + " -- /run/nvidia/mps " + device +
                                                              " /run/nvidia/mps < " + (dir / "state.json").string());
  return {result.status, result.output};
}

std::string state_of(pid_t pid, const fs::path& bundle) {
  return R"({"ociVersion":"1.2.0","id":"c","status":"creating","pid":)" + std::to_string(pid) + R"(,"bundle":")" +
         bundle.string() + R"(","annotations":{"io.kubernetes.container.name":"node-exporter"}})";
}

}  // namespace

TEST_CASE("mask check: the real hook passes a mask that landed, fails one that did not, and says where") {
  REQUIRE(::geteuid() == 0);  // a mount namespace of its own: CAP_SYS_ADMIN
  const TempDir dir;
  const fs::path host = dir.path() / "host", bundle = dir.path() / "bundle", rootfs = bundle / "rootfs";
  fs::create_directories(host);
  fs::create_directories(rootfs);
  std::ofstream(bundle / "config.json") << R"({"ociVersion":"1.2.0","root":{"path":"rootfs"},"mounts":[]})";

  SECTION("the mask over the root, below the mount: the create goes on") {
    const MountNamespace ns(host, rootfs, "h/run/nvidia/mps");
    REQUIRE(!ns.device().empty());
    const HookRun run = run_hook(dir.path(), state_of(ns.pid(), bundle), ns.device());
    INFO(run.output);
    CHECK(run.status == 0);
    CHECK(run.output.empty());
  }
  SECTION("the mask elsewhere: the create fails, naming where the root shows") {
    const MountNamespace ns(host, rootfs, "elsewhere/run/nvidia/mps");
    REQUIRE(!ns.device().empty());
    const HookRun run = run_hook(dir.path(), state_of(ns.pid(), bundle), ns.device());
    CHECK(run.status == 1);
    CHECK_THAT(run.output, Catch::Contains("no mask landed (/h/run/nvidia/mps (/run/nvidia/mps))"));
  }
  SECTION("no mask at all: the create fails, as one it cannot check") {
    const MountNamespace ns(host, rootfs, "");
    REQUIRE(!ns.device().empty());
    const HookRun run = run_hook(dir.path(), state_of(ns.pid(), bundle), ns.device());
    CHECK(run.status == 1);
    CHECK_THAT(run.output,
               Catch::Contains("cannot be checked: its process's mounts show no mask at all below its root"));
  }
  SECTION("a process whose mounts are not the container's fails the create, as one it cannot check") {
    // This test's own process: no mount at the container's root, so not where runc made its mounts (a VM's
    // runtime, or one that moved into the root already), whatever else its mounts show.
    const MountNamespace ns(host, rootfs, "h/run/nvidia/mps");
    REQUIRE(!ns.device().empty());
    HookRun run = run_hook(dir.path(), state_of(::getpid(), bundle), ns.device());
    CHECK(run.status == 1);
    CHECK_THAT(run.output, Catch::Contains("whose place cannot be checked: its process's mounts show no mount at its "
                                           "root (" +
                                           rootfs.string() + ")"));
    run = run_hook(dir.path(), state_of(::getpid(), bundle), ns.device(), "--unknown=allow");
    CHECK(run.status == 0);
  }
  SECTION("a state or bundle it cannot read fails the create, unless nodeEnforcementUnknown allows") {
    const MountNamespace ns(host, rootfs, "h/run/nvidia/mps");
    REQUIRE(!ns.device().empty());
    HookRun run = run_hook(dir.path(), "{\"pid\": ", ns.device());
    CHECK(run.status == 1);
    CHECK_THAT(run.output, Catch::Contains("whose place cannot be checked: the runtime's state: not JSON"));
    run = run_hook(dir.path(), state_of(ns.pid(), dir.path() / "no-bundle"), ns.device());
    CHECK(run.status == 1);
    CHECK_THAT(run.output, Catch::Contains("config.json (" + (dir.path() / "no-bundle").string()));
    run = run_hook(dir.path(), state_of(ns.pid(), dir.path() / "no-bundle"), ns.device(), "--unknown=allow");
    CHECK(run.status == 0);
    run = run_hook(dir.path(), state_of(0, bundle), ns.device());
    CHECK_THAT(run.output, Catch::Contains("the runtime's state names no process"));
    run = run_hook(dir.path(), "{\"pid\":1,\"bundle\":\"" + std::string(5 << 20, 'a') + "\"}", ns.device());
    CHECK(run.status == 1);
    CHECK_THAT(run.output, Catch::Contains("the runtime's state is over 4194304 bytes"));
  }
  SECTION("arguments not the enforcer's: exit 2 with the usage") {
    const auto run = run_binary(GPUGUARD_MASK_CHECK_BIN, "< /dev/null");
    CHECK(run.status == 2);
    CHECK_THAT(run.output, Catch::Contains("usage: gpuguard-mask-check"));
  }
}

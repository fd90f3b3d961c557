// gpuguard-mask-check: the createRuntime hook the node enforcer adds to each container it masks on CRI-O
// (include/gpuguard/enforcement/mask_hook.hpp says why a hook). runc runs it on the host, as root, with the
// container's state on stdin, once it has made the container's mounts and before the container's process
// runs. It reads the container's root from its bundle's config.json and the mounts of the container's
// process, and exits 1 with the reason on stderr, which runc passes on, where an MPS root shows without a
// mask over it; 0 otherwise. Every input is read as a stream within a bound. Linked statically where the
// build allows (docs/architecture.md#dependencies): the host runs it, not the enforcer's image.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <streambuf>
#include <string>
#include <vector>

#include "gpuguard/enforcement/mask_hook.hpp"
#include "gpuguard/k8s/host_path.hpp"

namespace {

using namespace gpuguard;

// A file descriptor read as a stream, at most `limit` bytes: past them the stream ends and `over` is set.
class CappedInput final : public std::streambuf {
 public:
  CappedInput(int fd, std::size_t limit) : fd_(fd), left_(limit) {}
  bool over() const { return over_; }
  bool failed() const { return failed_; }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    if (left_ == 0) {
      char probe = 0;
      over_ = ::read(fd_, &probe, 1) > 0;
      return traits_type::eof();
    }
    ssize_t n = 0;
    do {
      n = ::read(fd_, buffer_.data(), std::min(buffer_.size(), left_));
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      failed_ = n < 0;
      return traits_type::eof();
    }
    left_ -= static_cast<std::size_t>(n);
    setg(buffer_.data(), buffer_.data(), buffer_.data() + n);
    return traits_type::to_int_type(*gptr());
  }

 private:
  int fd_;
  std::size_t left_;
  bool over_ = false, failed_ = false;
  std::array<char, 65536> buffer_{};
};

// The values at `paths` of the JSON on `fd`, within `limit` bytes; nullopt with `why` otherwise.
std::optional<std::vector<std::string>> read_json(int fd, std::size_t limit, const std::vector<std::string>& paths,
                                                  const std::string& what, std::string& why) {
  CappedInput buffer(fd, limit);
  std::istream in(&buffer);
  std::optional<std::vector<std::string>> values = enforcement::json_values(in, paths, why);
  if (buffer.over()) {
    why = what + " is over " + std::to_string(limit) + " bytes";
    return std::nullopt;
  }
  if (buffer.failed()) {
    why = what + " cannot be read: " + std::strerror(errno);
    return std::nullopt;
  }
  if (!values) why = what + ": " + why;
  return values;
}

// The mounts of `pid` that the check reads (at or below the container's root: the one at the root, the
// masks, those on an MPS root's filesystem), at most kMountinfoMax bytes of them, read a line at a time (the kernel
// bounds a line, and the whole at kMountinfoReadMax here). Which lie below the container's root is the check's to say
// (unmasked_roots): the runtime's own mounts are not the container's.
constexpr std::size_t kMountinfoReadMax = std::size_t{1} << 30;
std::optional<std::string> read_mounts(const std::string& pid, const std::string& rootfs,
                                       const enforcement::MaskHookCall& call, std::string& why) {
  const std::string path = "/proc/" + pid + "/mountinfo";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    why = "its mounts (" + path + ") cannot be read: " + std::strerror(errno);
    return std::nullopt;
  }
  CappedInput buffer(fd, kMountinfoReadMax);
  std::istream in(&buffer);
  std::string kept, line;
  // A line at or below the root, and that is the root itself, a mask, or on an MPS root's filesystem: the
  // runtime's own mounts, and the other pods' tmpfs volumes that a bind of the host's / shows below the
  // root, are not kept.
  const auto wanted = [&](const std::string& text) {
    const enforcement::MountFields fields = enforcement::mount_fields(text);
    if (fields.point == rootfs) return true;
    if (!k8s::is_or_under(fields.point, rootfs)) return false;
    return enforcement::is_mask_line(text) ||
           std::any_of(call.places.begin(), call.places.end(),
                       [&](const auto& place) { return place.device == fields.device; });
  };
  while (std::getline(in, line) && kept.size() <= enforcement::kMountinfoMax) {
    if (wanted(line)) kept.append(line).push_back('\n');
  }
  ::close(fd);
  if (buffer.failed() || buffer.over()) {
    why = "its mounts (" + path + ") cannot be read whole" + (buffer.over() ? " (over 1 GiB)" : "");
    return std::nullopt;
  }
  if (kept.size() > enforcement::kMountinfoMax) {
    why = "its mounts that matter are over " + std::to_string(enforcement::kMountinfoMax) + " bytes";
    return std::nullopt;
  }
  return kept;
}

// Reads the container's root and mounts; the reason where they cannot be read, else empty.
std::string check(const enforcement::MaskHookCall& call, std::string& rootfs, std::string& mounts) {
  std::string why;
  const auto state = read_json(STDIN_FILENO, enforcement::kHookStateMax, {"pid", "bundle"}, "the runtime's state", why);
  if (!state) return why;
  const std::string& pid = (*state)[0];
  const std::string& bundle = (*state)[1];
  if (pid.empty() || pid == "0" || pid.find_first_not_of("0123456789") != std::string::npos) {
    return "the runtime's state names no process";
  }
  const std::string config_path = bundle + "/config.json";
  if (!bundle.starts_with('/')) return "the runtime's state names no bundle, or not as an absolute path";
  const int config = ::open(config_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (config < 0) return "the bundle's config.json (" + config_path + ") cannot be read";
  const auto root = read_json(config, enforcement::kHookConfigMax, {"root/path"}, config_path, why);
  ::close(config);
  if (!root) return why;
  const std::string lexical = enforcement::container_rootfs(bundle, (*root)[0], why);
  if (lexical.empty()) return why;
  // runc mounts the root where its links lead, and the mountinfo says so.
  std::array<char, PATH_MAX> resolved{};
  if (::realpath(lexical.c_str(), resolved.data()) == nullptr) {
    return "the container's root (" + lexical + ") cannot be resolved: " + std::strerror(errno);
  }
  rootfs = resolved.data();
  const std::optional<std::string> read = read_mounts(pid, rootfs, call, why);
  if (!read) return why;
  mounts = *read;
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  std::string why;
  const std::optional<enforcement::MaskHookCall> call = enforcement::parse_mask_hook_args(args, why);
  if (!call) {
    std::cerr << "gpuguard-mask-check: " << why << "\n";
    return 2;
  }
  std::string rootfs, mounts;
  std::string problem;
  try {
    problem = check(*call, rootfs, mounts);
  } catch (const std::exception& e) {
    problem = std::string("the check's own error: ") + e.what();
  }
  const std::string refusal = enforcement::mask_hook_verdict(*call, problem, mounts, rootfs);
  if (refusal.empty()) return 0;
  std::cerr << refusal << "\n";
  return 1;
}

// Host paths resolved inside a host root (include/gpuguard/files/in_root.hpp says why).
#include "gpuguard/files/in_root.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace gpuguard::files {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxLinks = 40;  // the kernel's own limit, past which it answers ELOOP

// A directory descriptor (O_PATH: it opens nothing but the name), closed when replaced or dropped.
class Dir {
 public:
  Dir() = default;
  explicit Dir(int fd) : fd_(fd) {}
  Dir(Dir&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Dir& operator=(Dir&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Dir(const Dir&) = delete;
  Dir& operator=(const Dir&) = delete;
  ~Dir() { reset(); }
  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  Dir child(const std::string& name) const {
    return Dir(::openat(fd_, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  }

 private:
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

std::string joined(const std::vector<std::string>& parts) {
  std::string path;
  for (const std::string& part : parts) path.append("/").append(part);
  return path.empty() ? "/" : path;
}

// Pushes a path's parts on `pending` so that the first is taken first.
void push_parts(std::vector<std::string>& pending, std::string_view path) {
  std::vector<std::string> parts;
  while (!path.empty()) {
    const std::size_t slash = path.find('/');
    if (slash != 0) parts.emplace_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  pending.insert(pending.end(), parts.rbegin(), parts.rend());
}

}  // namespace

Followed follow_in_root(const fs::path& root, std::string_view absolute, std::size_t* steps_left) {
  const fs::path base = root.empty() ? fs::path("/") : root;
  Followed followed;
  std::size_t steps = std::min(kFollowStepsMax, steps_left != nullptr ? *steps_left : kFollowStepsMax);
  const std::size_t allowed = steps;
  const auto spend = [&] {
    if (steps == 0) return false;
    --steps;
    return true;
  };
  const Dir top(::open(base.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  // `resolved`: every part a directory, a file or a part that does not exist, never a link. The first
  // `present` of them are directories there, and `dir` is the last of those (the root when none is).
  std::vector<std::string> resolved;
  std::size_t present = 0;
  Dir dir(top.open() ? ::dup(top.fd()) : -1);
  const auto reopen = [&] {
    dir = Dir(top.open() ? ::dup(top.fd()) : -1);
    for (std::size_t i = 0; i < present && dir.open(); ++i) {
      if (!spend()) return false;
      dir = dir.child(resolved[i]);
    }
    if (!dir.open()) present = 0;  // changed while read: what follows is taken as written
    return true;
  };
  std::vector<std::string> pending;
  push_parts(pending, absolute);
  int links = 0;
  while (!pending.empty()) {
    if (!spend()) {
      followed.over_budget = true;
      break;
    }
    const std::string part = std::move(pending.back());
    pending.pop_back();
    if (part == ".") continue;
    if (part == "..") {
      if (resolved.empty()) continue;  // at the root, stays there
      resolved.pop_back();
      if (present > resolved.size()) {
        present = resolved.size();
        if (!reopen()) {
          followed.over_budget = true;
          break;
        }
      }
      continue;
    }
    struct stat status {};
    const bool here = present == resolved.size() && dir.open() &&
                      ::fstatat(dir.fd(), part.c_str(), &status, AT_SYMLINK_NOFOLLOW) == 0;
    if (here && S_ISLNK(status.st_mode)) {
      char target[PATH_MAX];
      const ssize_t length = ::readlinkat(dir.fd(), part.c_str(), target, sizeof target);
      if (++links > kMaxLinks || length <= 0 || static_cast<std::size_t>(length) >= sizeof target) {
        followed.loops = true;
        break;
      }
      std::string link = joined(resolved);
      followed.links.push_back(link.append(link == "/" ? "" : "/").append(part));
      const std::string_view to(target, static_cast<std::size_t>(length));
      if (to.starts_with('/')) {
        resolved.clear();
        present = 0;
        dir = Dir(top.open() ? ::dup(top.fd()) : -1);
      }
      push_parts(pending, to);
      continue;
    }
    if (here && S_ISDIR(status.st_mode)) {
      Dir child = dir.child(part);
      if (child.open()) {
        dir = std::move(child);
        ++present;
      }
    }
    resolved.push_back(part);
  }
  if (steps_left != nullptr) *steps_left -= allowed - steps;
  if (followed.loops || followed.over_budget) return followed;
  followed.path = joined(resolved);
  return followed;
}

std::optional<fs::path> in_root(const fs::path& root, std::string_view absolute) {
  if (root.empty() || root == "/") return fs::path(absolute);
  const Followed followed = follow_in_root(root, absolute);
  if (followed.loops || followed.over_budget) return std::nullopt;
  return root / fs::path(followed.path).relative_path();
}

}  // namespace gpuguard::files

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

// One walk of a path inside the root, a part at a time, each part a step of the budget.
class Walk {
 public:
  Walk(const fs::path& base, std::size_t steps)
      : top_(::open(base.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)), dir_(at_top()), steps_(steps) {}

  Followed follow(std::string_view absolute) {
    push_parts(pending_, absolute);
    while (!pending_.empty()) {
      if (!spend()) {
        followed_.over_budget = true;
        break;
      }
      const std::string part = std::move(pending_.back());
      pending_.pop_back();
      if (!take(part)) break;
    }
    if (!followed_.loops && !followed_.over_budget) followed_.path = joined(resolved_);
    return std::move(followed_);
  }
  std::size_t steps_left() const { return steps_; }

 private:
  Dir at_top() const { return Dir(top_.open() ? ::dup(top_.fd()) : -1); }

  bool spend() {
    if (steps_ == 0) return false;
    --steps_;
    return true;
  }

  // `dir_` opened again down the `present_` directories, after a step up; false when over budget.
  bool reopen() {
    dir_ = at_top();
    for (std::size_t i = 0; i < present_ && dir_.open(); ++i) {
      if (!spend()) return false;
      dir_ = dir_.child(resolved_[i]);
    }
    if (!dir_.open()) present_ = 0;  // changed while read: what follows is taken as written
    return true;
  }

  // One part of the path; false when the walk ends with it.
  bool take(const std::string& part) {
    if (part == ".") return true;
    if (part == "..") return up();
    struct stat status {};
    const bool here = present_ == resolved_.size() && dir_.open() &&
                      ::fstatat(dir_.fd(), part.c_str(), &status, AT_SYMLINK_NOFOLLOW) == 0;
    if (here && S_ISLNK(status.st_mode)) return through_link(part);
    if (here && S_ISDIR(status.st_mode)) {
      Dir child = dir_.child(part);
      if (child.open()) {
        dir_ = std::move(child);
        ++present_;
      }
    }
    resolved_.push_back(part);
    return true;
  }

  bool up() {
    if (resolved_.empty()) return true;  // at the root, stays there
    resolved_.pop_back();
    if (present_ > resolved_.size()) {
      present_ = resolved_.size();
      if (!reopen()) {
        followed_.over_budget = true;
        return false;
      }
    }
    return true;
  }

  // The link's target takes the link's place among the parts still to walk.
  bool through_link(const std::string& part) {
    char target[PATH_MAX];
    const ssize_t length = ::readlinkat(dir_.fd(), part.c_str(), target, sizeof target);
    if (++links_ > kMaxLinks || length <= 0 || static_cast<std::size_t>(length) >= sizeof target) {
      followed_.loops = true;
      return false;
    }
    std::string link = joined(resolved_);
    followed_.links.push_back(link.append(link == "/" ? "" : "/").append(part));
    const std::string_view to(target, static_cast<std::size_t>(length));
    if (to.starts_with('/')) {
      resolved_.clear();
      present_ = 0;
      dir_ = at_top();
    }
    push_parts(pending_, to);
    return true;
  }

  const Dir top_;
  Dir dir_;
  // Every part a directory, a file or a part that does not exist, never a link. The first `present_` of them
  // are directories there, and `dir_` is the last of those (the root when none is).
  std::vector<std::string> resolved_;
  std::size_t present_ = 0;
  std::vector<std::string> pending_;  // what is still to walk, the next part last
  int links_ = 0;
  std::size_t steps_;
  Followed followed_;
};

}  // namespace

Followed follow_in_root(const fs::path& root, std::string_view absolute, std::size_t* steps_left) {
  const std::size_t allowed = std::min(kFollowStepsMax, steps_left != nullptr ? *steps_left : kFollowStepsMax);
  Walk walk(root.empty() ? fs::path("/") : root, allowed);
  Followed followed = walk.follow(absolute);
  if (steps_left != nullptr) *steps_left -= allowed - walk.steps_left();
  return followed;
}

std::optional<fs::path> in_root(const fs::path& root, std::string_view absolute) {
  if (root.empty() || root == "/") return fs::path(absolute);
  const Followed followed = follow_in_root(root, absolute);
  if (followed.loops || followed.over_budget) return std::nullopt;
  return root / fs::path(followed.path).relative_path();
}

}  // namespace gpuguard::files

// Host paths resolved inside a host root (include/gpuguard/files/in_root.hpp says why).
#include "gpuguard/files/in_root.hpp"

#include <algorithm>

namespace gpuguard::files {

namespace fs = std::filesystem;

namespace {
constexpr int kMaxLinks = 40;  // the kernel's own limit, past which it answers ELOOP
}  // namespace

Followed follow_in_root(const fs::path& root, std::string_view absolute) {
  const fs::path base = root.empty() ? fs::path("/") : root;
  Followed followed;
  fs::path resolved;  // relative to the root, every part of it a directory or a file, not a link
  std::vector<fs::path> pending;
  for (const auto& part : fs::path(absolute).relative_path()) pending.push_back(part);
  std::reverse(pending.begin(), pending.end());
  for (int links = 0; !pending.empty();) {
    const fs::path part = pending.back();
    pending.pop_back();
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      resolved = resolved.parent_path();  // at the root, stays there
      continue;
    }
    const fs::path candidate = resolved / part;
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(base / candidate, ec))) {
      if (++links > kMaxLinks) {
        followed.loops = true;
        return followed;
      }
      const fs::path target = fs::read_symlink(base / candidate, ec);
      if (ec) {
        followed.loops = true;
        return followed;
      }
      followed.links.push_back("/" + candidate.string());
      if (target.is_absolute()) resolved.clear();
      const fs::path relative = target.relative_path();
      const std::vector<fs::path> parts(relative.begin(), relative.end());
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) pending.push_back(*it);
      continue;
    }
    resolved = candidate;
  }
  followed.path = "/" + resolved.string();
  return followed;
}

std::optional<fs::path> in_root(const fs::path& root, std::string_view absolute) {
  if (root.empty() || root == "/") return fs::path(absolute);
  const Followed followed = follow_in_root(root, absolute);
  if (followed.loops) return std::nullopt;
  return root / fs::path(followed.path).relative_path();
}

}  // namespace gpuguard::files

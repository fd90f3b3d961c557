// Host paths resolved inside a host root (include/gpuguard/files/in_root.hpp says why).
#include "gpuguard/files/in_root.hpp"

#include <algorithm>
#include <vector>

namespace gpuguard::files {

namespace fs = std::filesystem;

namespace {
constexpr int kMaxLinks = 40;  // the kernel's own limit, past which it answers ELOOP
}  // namespace

std::optional<fs::path> in_root(const fs::path& root, std::string_view absolute) {
  if (root.empty() || root == "/") return fs::path(absolute);
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
    if (fs::is_symlink(fs::symlink_status(root / candidate, ec))) {
      if (++links > kMaxLinks) return std::nullopt;
      const fs::path target = fs::read_symlink(root / candidate, ec);
      if (ec) return std::nullopt;
      if (target.is_absolute()) resolved.clear();
      const fs::path relative = target.relative_path();
      const std::vector<fs::path> parts(relative.begin(), relative.end());
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) pending.push_back(*it);
      continue;
    }
    resolved = candidate;
  }
  return root / resolved;
}

}  // namespace gpuguard::files

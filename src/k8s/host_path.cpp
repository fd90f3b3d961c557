// Host paths resolved lexically (include/gpuguard/k8s/host_path.hpp).
#include "gpuguard/k8s/host_path.hpp"

#include <vector>

namespace gpuguard::k8s {

std::string lexical_path(std::string_view path) {
  std::vector<std::string_view> parts;
  while (!path.empty()) {
    const std::size_t slash = path.find('/');
    const std::string_view part = path.substr(0, slash);
    path = slash == std::string_view::npos ? std::string_view{} : path.substr(slash + 1);
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string normal;
  for (const std::string_view part : parts) normal.append("/").append(part);
  return normal.empty() ? "/" : normal;
}

bool is_or_under(std::string_view path, std::string_view dir) {
  if (dir == "/") return path.starts_with('/');  // the root: every absolute path lies under it
  return path == dir || (path.starts_with(dir) && path.size() > dir.size() && path[dir.size()] == '/');
}

}  // namespace gpuguard::k8s

// The node report's HostFiles over a directory that holds the host's / (host_root.hpp says why links are
// resolved by hand).
#include "gpuguard/nodereport/host_root.hpp"

#include <algorithm>
#include <fstream>

#include "gpuguard/files/in_root.hpp"
#include "gpuguard/files/read_file.hpp"

namespace gpuguard::nodereport {

namespace fs = std::filesystem;

std::optional<fs::path> HostRoot::resolve(const std::string& path) const { return files::in_root(root_, path); }

std::optional<std::string> HostRoot::read(const std::string& path) const {
  const auto resolved = resolve(path);
  if (!resolved) return std::nullopt;
  std::error_code ec;
  if (!fs::is_regular_file(*resolved, ec)) return std::nullopt;
  return files::read_file(*resolved);
}

std::optional<std::string> HostRoot::read_range(const std::string& path, std::uint64_t offset,
                                                std::size_t length) const {
  const auto resolved = resolve(path);
  std::error_code ec;
  if (!resolved || !fs::is_regular_file(*resolved, ec)) return std::nullopt;
  std::ifstream in(*resolved, std::ios::binary);
  if (!in.seekg(static_cast<std::streamoff>(offset))) return std::nullopt;
  std::string bytes(length, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(length));
  bytes.resize(static_cast<std::size_t>(in.gcount()));
  return bytes;
}

std::vector<std::string> HostRoot::names_in(
    const std::string& directory,
    const std::function<bool(const fs::directory_entry&, const std::string&)>& keep) const {
  std::vector<std::string> names;
  const auto resolved = resolve(directory);
  if (!resolved) return names;
  std::error_code ec;
  for (fs::directory_iterator it(*resolved, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::string host_path = directory;
    host_path.append("/").append(name);
    if (keep(*it, host_path)) names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> HostRoot::list(const std::string& directory) const {
  return names_in(directory, [this](const fs::directory_entry&, const std::string& host_path) {
    const auto inside = resolve(host_path);
    std::error_code ec;  // an entry gone or a dangling link is not a file; the listing goes on
    return inside && fs::is_regular_file(*inside, ec);
  });
}

std::vector<std::string> HostRoot::subdirectories(const std::string& directory) const {
  // Directories themselves, not links to them: a walk that follows no link cannot loop.
  return names_in(directory, [](const fs::directory_entry& entry, const std::string&) {
    std::error_code ec;
    return entry.is_directory(ec) && !entry.is_symlink(ec);
  });
}

bool HostRoot::exists(const std::string& path) const {
  const auto resolved = resolve(path);
  std::error_code ec;
  return resolved && fs::exists(*resolved, ec);
}

}  // namespace gpuguard::nodereport

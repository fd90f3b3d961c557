#pragma once
// The host's files as the node report reads them: below a root directory (the host's / mounted
// read-only into the device plugin's pod, or a fixture), with symbolic links resolved inside that root,
// so that an absolute link on the host never reads the container's own files instead.
#include <filesystem>
#include <functional>

#include "gpuguard/nodereport/report.hpp"

namespace gpuguard::nodereport {

class HostRoot : public HostFiles {
 public:
  explicit HostRoot(std::filesystem::path root) : root_(std::move(root)) {}
  std::optional<std::string> read(const std::string& path) const override;
  std::optional<std::string> read_range(const std::string& path, std::uint64_t offset,
                                        std::size_t length) const override;
  std::vector<std::string> list(const std::string& directory) const override;
  std::vector<std::string> subdirectories(const std::string& directory) const override;
  bool exists(const std::string& path) const override;

 private:
  // The path below the root that a host path leads to, following links inside the root; nullopt when
  // it leads nowhere or loops.
  std::optional<std::filesystem::path> resolve(const std::string& path) const;
  // The names of a directory's entries that `keep` (the entry, and the host path it names) keeps, sorted.
  std::vector<std::string> names_in(
      const std::string& directory,
      const std::function<bool(const std::filesystem::directory_entry&, const std::string&)>& keep) const;
  std::filesystem::path root_;
};

}  // namespace gpuguard::nodereport

// Atomic file writes (include/gpuguard/files/write_file.hpp).
#include "gpuguard/files/write_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <stdexcept>
#include <string>

namespace gpuguard::files {

void write_file_atomically(const std::filesystem::path& path, std::string_view content, std::filesystem::perms mode) {
  const std::filesystem::path directory = path.parent_path();
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) throw std::runtime_error("cannot create the directory " + directory.string() + ": " + ec.message());
  // A name no other writer has (mkstemp): two programs writing the same host path, each as PID 1 of its own
  // pod (two releases, a DaemonSet's surge), would otherwise share one temporary file. Built by appending:
  // GCC 12 warns falsely (-Wrestrict) on a chain of operator+ here.
  std::string name = (directory / ".").string();
  name.append(path.filename().string()).append(".XXXXXX");
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw std::runtime_error("cannot create a file in " + directory.string() + ": " + std::strerror(errno));
  const std::filesystem::path temporary = name;
  // The reason is read before the clean-up, which may set errno again.
  const auto fail = [&](const std::string& what, int error) {
    ::close(fd);
    std::filesystem::remove(temporary, ec);
    throw std::runtime_error(what + " " + temporary.string() + ": " + std::strerror(error));
  };
  for (std::size_t written = 0; written < content.size();) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write", n < 0 ? errno : ENOSPC);
    written += static_cast<std::size_t>(n);
  }
  // 0644 unless told (mkstemp makes 0600): what an ofstream made under the usual umask.
  const auto bits = static_cast<mode_t>(mode == std::filesystem::perms::unknown ? std::filesystem::perms(0644) : mode);
  if (::fchmod(fd, bits) != 0) fail("cannot set the mode of", errno);
  if (::close(fd) != 0) {
    const int error = errno;
    std::filesystem::remove(temporary, ec);
    throw std::runtime_error("cannot write " + temporary.string() + ": " + std::strerror(error));
  }
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(temporary, ec);
    throw std::runtime_error("cannot move " + temporary.string() + " to " + path.string() + ": " + why);
  }
}

}  // namespace gpuguard::files

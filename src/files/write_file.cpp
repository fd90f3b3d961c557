// Atomic file writes (include/gpuguard/files/write_file.hpp).
#include "gpuguard/files/write_file.hpp"

#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <string>

namespace gpuguard::files {

void write_file_atomically(const std::filesystem::path& path, std::string_view content, std::filesystem::perms mode) {
  const std::filesystem::path directory = path.parent_path();
  // Built by appending: GCC 12 warns falsely (-Wrestrict) on a chain of operator+ here.
  std::string name = ".";
  name.append(path.filename().string()).append(".").append(std::to_string(::getpid()));
  const std::filesystem::path temporary = directory / name;
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) throw std::runtime_error("cannot create the directory " + directory.string() + ": " + ec.message());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << content;
    out.close();
    if (!out) {
      std::filesystem::remove(temporary, ec);
      throw std::runtime_error("cannot write " + temporary.string());
    }
  }
  if (mode != std::filesystem::perms::unknown) std::filesystem::permissions(temporary, mode, ec);
  if (!ec) std::filesystem::rename(temporary, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(temporary, ec);
    throw std::runtime_error("cannot move " + temporary.string() + " to " + path.string() + ": " + why);
  }
}

}  // namespace gpuguard::files

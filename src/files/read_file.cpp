#include "gpuguard/files/read_file.hpp"

#include <fstream>
#include <sstream>

namespace gpuguard::files {

std::optional<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return std::move(content).str();
}

}  // namespace gpuguard::files

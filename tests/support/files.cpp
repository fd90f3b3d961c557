#include "files.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gpuguard::test {

std::filesystem::path fixtures_dir() { return GPUGUARD_FIXTURES_DIR; }

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream content;
  content << in.rdbuf();
  return std::move(content).str();
}

nlohmann::json read_json(const std::filesystem::path& path) { return nlohmann::json::parse(read_file(path)); }

std::vector<std::filesystem::path> fixture_cases(const std::string& table) {
  std::vector<std::filesystem::path> cases;
  for (const auto& entry : std::filesystem::directory_iterator(fixtures_dir() / table)) {
    if (entry.is_directory()) cases.push_back(entry.path());
  }
  std::sort(cases.begin(), cases.end());
  if (cases.empty()) throw std::runtime_error("no fixtures under " + (fixtures_dir() / table).string());
  return cases;
}

}  // namespace gpuguard::test

#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpuguard::test {

std::filesystem::path fixtures_dir();
std::string read_file(const std::filesystem::path& path);
nlohmann::json read_json(const std::filesystem::path& path);
// The case folders under fixtures/<table>, sorted by name.
std::vector<std::filesystem::path> fixture_cases(const std::string& table);

}  // namespace gpuguard::test

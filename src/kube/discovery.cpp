// Choosing a served version of an API group from its discovery document (kube/discovery.hpp).
#include "gpuguard/kube/discovery.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace gpuguard::kube {

GroupDiscovery choose_group_version(unsigned status, std::string_view body, const std::vector<std::string>& known) {
  GroupDiscovery result;
  if (status == 404) {
    result.outcome = GroupDiscovery::Outcome::not_served;
    return result;
  }
  if (status / 100 != 2) return result;
  const nlohmann::json group = nlohmann::json::parse(body, nullptr, false);
  if (!group.is_object() || group.value("kind", "") != "APIGroup") return result;
  const auto versions = group.find("versions");
  if (versions == group.end() || !versions->is_array()) return result;
  std::vector<std::string> served;
  for (const auto& entry : *versions) {
    if (entry.is_object() && entry.contains("version") && entry["version"].is_string()) {
      served.push_back(entry["version"].get<std::string>());
    }
  }
  for (const std::string& version : served) {
    if (!result.served.empty()) result.served += ",";
    result.served += version;
  }
  const auto newest = std::find_if(known.begin(), known.end(), [&served](const std::string& version) {
    return std::find(served.begin(), served.end(), version) != served.end();
  });
  if (newest == known.end()) {
    result.outcome = GroupDiscovery::Outcome::not_served;
    return result;
  }
  result.outcome = GroupDiscovery::Outcome::served;
  result.version = *newest;
  return result;
}

std::string group_of_versioned_path(std::string_view path) {
  constexpr std::string_view kPrefix = "/apis/";
  constexpr std::string_view kVersion = "/{version}/";
  if (path.substr(0, kPrefix.size()) != kPrefix) return {};
  const std::size_t end = path.find(kVersion, kPrefix.size());
  if (end == std::string_view::npos || end == kPrefix.size()) return {};
  return std::string(path.substr(kPrefix.size(), end - kPrefix.size()));
}

}  // namespace gpuguard::kube

#include "offline.hpp"

#include <iostream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "gpuguard/files/read_file.hpp"
#include "gpuguard/policy/policy_watcher.hpp"
#include "gpuguard/webhook/webhook_metrics.hpp"

namespace gpuguard::webhook {

bool read_source(const std::string& source, std::string& text) {
  if (source == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    return !std::cin.bad();
  }
  auto content = files::read_file(source);
  if (!content) return false;
  text = std::move(*content);
  return true;
}

std::shared_ptr<const policy::Policy> load_policy(const std::string& command,
                                                  const std::optional<std::filesystem::path>& dir) {
  try {
    WebhookMetrics unused_metrics(command);
    return policy::PolicyWatcher(dir, unused_metrics).current();
  } catch (const std::exception& e) {
    std::cerr << "gpuguard-webhook " << command << ": " << e.what() << "\n";
    return nullptr;
  }
}

bool load_claims(const std::string& command, const std::string& source, claims::ClaimCache& cache) {
  std::string text;
  const nlohmann::json list =
      read_source(source, text) ? nlohmann::json::parse(text, nullptr, false) : nlohmann::json();
  if (!list.is_object() || !list.contains("items") || !list["items"].is_array()) {
    std::cerr << "gpuguard-webhook " << command << ": " << source
              << " is not a list of ResourceClaims and ResourceClaimTemplates\n";
    return false;
  }
  const std::size_t items = list["items"].size();
  if (const std::size_t taken = cache.load_list(list); taken != items) {
    std::cerr << "gpuguard-webhook " << command << ": " << source << " holds " << items - taken
              << " objects that are neither ResourceClaims nor ResourceClaimTemplates\n";
    return false;
  }
  return true;
}

}  // namespace gpuguard::webhook

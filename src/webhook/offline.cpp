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

bool load_claims(const std::string& command, const std::string& source, ClaimCache& cache) {
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

std::string create_review_for(nlohmann::json pod) {
  std::string ns = "default", name;
  if (const auto metadata = pod.find("metadata"); metadata != pod.end() && metadata->is_object()) {
    if (const auto n = metadata->find("namespace"); n != metadata->end() && n->is_string()) ns = n->get<std::string>();
    if (const auto n = metadata->find("name"); n != metadata->end() && n->is_string()) name = n->get<std::string>();
  }
  const nlohmann::json review = {{"apiVersion", "admission.k8s.io/v1"},
                                 {"kind", "AdmissionReview"},
                                 {"request",
                                  {{"uid", "00000000-0000-0000-0000-000000000000"},
                                   {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                                   {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
                                   {"namespace", ns},
                                   {"name", name},
                                   {"operation", "CREATE"},
                                   {"userInfo", {{"username", "gpuguard-review"}}},
                                   {"object", std::move(pod)},
                                   {"dryRun", true}}}};
  return review.dump();
}

}  // namespace gpuguard::webhook

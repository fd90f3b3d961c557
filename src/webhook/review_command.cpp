#include "review_command.hpp"

#include <iostream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "gpuguard/admission/base64.hpp"
#include "gpuguard/admission/review.hpp"
#include "gpuguard/files/read_file.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/policy/policy.hpp"
#include "gpuguard/policy/policy_watcher.hpp"
#include "gpuguard/webhook/webhook_metrics.hpp"

namespace gpuguard::webhook {
namespace {

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

// A Pod as `kubectl get pod -o json` or a manifest gives it, wrapped the way the apiserver sends a create.
std::string wrap_pod_in_create_review(nlohmann::json pod) {
  const std::string ns = pod["metadata"].value("namespace", "default");
  const std::string name = pod["metadata"].value("name", "");
  nlohmann::json review = {{"apiVersion", "admission.k8s.io/v1"},
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

// The decoded JSON Patch of a response, or an empty array when it has none.
nlohmann::json patch_of(const nlohmann::json& response) {
  const auto& inner = response["response"];
  if (!inner.contains("patch")) return nlohmann::json::array();
  return nlohmann::json::parse(admission::base64_decode(inner["patch"].get<std::string>()).value_or("[]"));
}

}  // namespace

int run_review_command(const std::string& source, const std::optional<std::filesystem::path>& policy_dir) {
  std::string text;
  if (!read_source(source, text)) {
    std::cerr << "gpuguard-webhook review: cannot read " << (source == "-" ? "standard input" : source) << "\n";
    return 1;
  }
  const auto document = nlohmann::json::parse(text, nullptr, false);
  if (document.is_object() && document.value("kind", "") == "Pod" && document.value("apiVersion", "") == "v1") {
    text = wrap_pod_in_create_review(document);
  }
  log::set_level(log::Level::warn);  // standard error is for problems here; standard output is the result
  std::shared_ptr<const policy::Policy> policy;
  try {
    WebhookMetrics unused_metrics("review");
    policy = policy::PolicyWatcher(policy_dir, unused_metrics).current();
  } catch (const std::exception& e) {
    std::cerr << "gpuguard-webhook review: " << e.what() << "\n";
    return 1;
  }
  const admission::ReviewOutcome outcome = admission::review(std::move(text), *policy);
  if (!outcome.ok) {
    std::cerr << "gpuguard-webhook review: invalid AdmissionReview: " << outcome.body << "\n";
    return 1;
  }
  const nlohmann::json response = nlohmann::json::parse(outcome.body);
  const nlohmann::json printed = {{"review", response}, {"patch", patch_of(response)}};
  std::cout << printed.dump(2) << "\n";
  return 0;
}

}  // namespace gpuguard::webhook

#include "review_command.hpp"

#include <boost/program_options.hpp>

#include <filesystem>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "gpuguard/admission/base64.hpp"
#include "gpuguard/admission/review.hpp"
#include "gpuguard/audit/pod_audit.hpp"
#include "gpuguard/log/log.hpp"
#include "offline.hpp"

namespace gpuguard::webhook {
namespace {

namespace po = boost::program_options;

// The decoded JSON Patch of a response, or an empty array when it has none.
nlohmann::json patch_of(const nlohmann::json& response) {
  const auto& inner = response["response"];
  if (!inner.contains("patch")) return nlohmann::json::array();
  return nlohmann::json::parse(admission::base64_decode(inner["patch"].get<std::string>()).value_or("[]"));
}

}  // namespace

int run_review_command(const std::vector<std::string>& args) {
  constexpr const char* kUsage =
      "usage: gpuguard-webhook review [--policy-dir DIR] [--claims FILE] FILE|-\n"
      "  FILE: an AdmissionReview, or a bare Pod (`kubectl get pod NAME -o json`; - for standard input); prints\n"
      "  the response and its JSON Patch decoded, through the same code path as the server\n"
      "  --policy-dir DIR: a policy as the mounted ConfigMap holds it, one file per key (default: the defaults)\n"
      "  --claims FILE: `kubectl get resourceclaims,resourceclaimtemplates -A -o json`, to resolve DRA claims\n";
  po::options_description options;
  options.add_options()("help", "")("policy-dir", po::value<std::string>())("claims", po::value<std::string>())(
      "review", po::value<std::string>());
  po::positional_options_description positional;
  positional.add("review", 1);
  po::variables_map flags;
  try {
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), flags);
    po::notify(flags);
  } catch (const po::error& e) {
    std::cerr << "gpuguard-webhook review: " << e.what() << "\n" << kUsage;
    return 2;
  }
  if (flags.count("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (!flags.count("review")) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string source = flags["review"].as<std::string>();
  std::string text;
  if (!read_source(source, text)) {
    std::cerr << "gpuguard-webhook review: cannot read " << (source == "-" ? "standard input" : source) << "\n";
    return 1;
  }
  const auto document = nlohmann::json::parse(text, nullptr, false);
  if (document.is_object() && document.value("kind", "") == "Pod" && document.value("apiVersion", "") == "v1") {
    const auto& metadata = document.contains("metadata") && document["metadata"].is_object() ? document["metadata"]
                                                                                             : nlohmann::json::object();
    text = audit::create_review_for(text, metadata.value("namespace", ""), metadata.value("name", ""));
  }
  log::set_level(log::Level::warn);  // standard error is for problems here; standard output is the result
  std::optional<std::filesystem::path> policy_dir;
  if (flags.count("policy-dir")) policy_dir = flags["policy-dir"].as<std::string>();
  const auto policy = load_policy("review", policy_dir);
  if (!policy) return 1;
  claims::ClaimCache claims;
  if (flags.count("claims") && !load_claims("review", flags["claims"].as<std::string>(), claims)) return 1;
  const admission::ReviewOutcome outcome =
      admission::review(std::move(text), *policy, flags.count("claims") ? &claims : nullptr);
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

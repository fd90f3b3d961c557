#pragma once
// What the webhook's offline commands (review, audit) share: reading their input, the policy of a
// --policy-dir, and the claims of a file.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "gpuguard/claims/claim_cache.hpp"
#include "gpuguard/policy/policy.hpp"

namespace gpuguard::webhook {

// A file, or standard input for "-"; false when it cannot be read.
bool read_source(const std::string& source, std::string& text);

// The policy in `dir` as the server would load it (the defaults without a directory); nullptr after
// printing why to standard error, prefixed by `command`.
std::shared_ptr<const policy::Policy> load_policy(const std::string& command,
                                                  const std::optional<std::filesystem::path>& dir);

// The claims in a list file (`kubectl get resourceclaims,resourceclaimtemplates -A -o json`) into `cache`;
// false after printing why to standard error.
bool load_claims(const std::string& command, const std::string& source, claims::ClaimCache& cache);

}  // namespace gpuguard::webhook

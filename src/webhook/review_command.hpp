#pragma once
#include <filesystem>
#include <optional>
#include <string>

namespace gpuguard::webhook {

// `gpuguard-webhook review [--policy-dir DIR] FILE|-`: reviews an AdmissionReview, or a bare Pod wrapped
// into a CREATE review, through admission::review() exactly as the server does, with the policy in DIR
// (defaults without). Prints {"review": <response>, "patch": <decoded JSON Patch>}. Returns the process
// exit code: 0 answered, 1 not a valid review, an invalid policy or unreadable input.
int run_review_command(const std::string& source, const std::optional<std::filesystem::path>& policy_dir);

}  // namespace gpuguard::webhook

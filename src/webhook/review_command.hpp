#pragma once
#include <string>
#include <vector>

namespace gpuguard::webhook {

// `gpuguard-webhook review [--policy-dir DIR] [--claims FILE] FILE|-`: reviews an AdmissionReview, or a bare
// Pod wrapped into a CREATE review, through admission::review() exactly as the server does, with the
// policy in DIR (defaults without) and the DRA claims in FILE (as `kubectl get
// resourceclaims,resourceclaimtemplates -A -o json` prints them; without it, claims are unknown). Prints
// {"review": <response>, "patch": <decoded JSON Patch>}. Exit status: 0 answered, 1 not a valid review,
// an invalid policy or unreadable input, 2 bad usage.
int run_review_command(const std::vector<std::string>& args);

}  // namespace gpuguard::webhook

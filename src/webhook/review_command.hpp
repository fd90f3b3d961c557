#pragma once
#include <string>

namespace gpuguard::webhook {

// `gpuguard-webhook review FILE|-`: reviews an AdmissionReview, or a bare Pod wrapped into a CREATE
// review, through admission::review() exactly as the server does. Prints {"review": <response>,
// "patch": <decoded JSON Patch>}. Returns the process exit code: 0 answered, 1 not a valid review or
// unreadable input.
int run_review_command(const std::string& source);

}  // namespace gpuguard::webhook

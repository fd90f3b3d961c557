#pragma once
#include <string>
#include <vector>

namespace gpuguard::webhook {

// `gpuguard-webhook audit [--policy-dir DIR] [--claims FILE] [--output table|json] FILE|-`: every container
// of a PodList (as `kubectl get pods -A -o json` prints it) that can see GPUs it did not ask for, with the
// door and what the webhook would do under the policy in DIR, decided by the admission core itself
// (admission::examine). --claims takes `kubectl get resourceclaims,resourceclaimtemplates -A -o json` to
// resolve DRA claims. Exit status: 0 nothing exposed, 1 something is, 2 bad usage or unreadable input.
int run_audit_command(const std::vector<std::string>& args);

}  // namespace gpuguard::webhook

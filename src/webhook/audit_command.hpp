#pragma once
#include <string>
#include <vector>

namespace gpuguard::webhook {

// `gpuguard-webhook audit [--policy-dir DIR] [--claims FILE] [--nodes FILE] [--output table|json] FILE|-`:
// every container of a PodList (as `kubectl get pods -A -o json` prints it) that can see GPUs it did not
// ask for, with the door and what the webhook would do under the policy in DIR, decided by the admission
// core itself (admission::examine). --claims takes `kubectl get resourceclaims,resourceclaimtemplates -A
// -o json` to resolve DRA claims; --nodes takes `kubectl get nodes -o json` and adds the nodes whose
// GPUIsolation condition (kept by the device plugin) is not True. Exit status: 0 nothing exposed and every reporting
// node holds, 1 otherwise, 2 bad usage or unreadable input.
int run_audit_command(const std::vector<std::string>& args);

}  // namespace gpuguard::webhook

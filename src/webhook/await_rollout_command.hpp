#pragma once
// `gpuguard-webhook await-rollout`: the chart's post-delete hook, which holds `helm uninstall` until the node
// cleanup's DaemonSet has a ready pod on every node, each ready once its node has forgotten gpuguard.
#include <string>
#include <vector>

namespace gpuguard::webhook {

// Exit status 0 once the DaemonSet is rolled out on every node it should run on (webhook::arming::
// daemonset_rollout), 1 when it is not within --timeout or cannot be read, 2 on bad flags.
int run_await_rollout_command(int argc, char** argv);

}  // namespace gpuguard::webhook

#pragma once
#include <string>
#include <vector>

namespace gpuguard::webhook {

// `gpuguard-webhook arm [options]`: waits until the webhook's Deployment has a replica available, then
// sets its webhook configuration's failurePolicy to Fail and the backstop binding's validationActions to
// Deny (webhook::arming); with --verify-only (a release armed already) only waits and probes. Exit status 0
// once armed (or shown reachable), 1 when no replica became available or the probe was not answered in time
// or the API refused, 2 on bad flags.
int run_arm_command(int argc, char** argv);

}  // namespace gpuguard::webhook

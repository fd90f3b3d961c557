#pragma once
#include <string>
#include <vector>

namespace gpuguard::webhook {

// `gpuguard-webhook audit-controller [options]`: the in-cluster audit (audit::AuditLoop), with probes and
// metrics over plain HTTP, until SIGTERM. Exit status 0 after an orderly stop, 1 when it cannot start,
// 2 on bad flags.
int run_audit_controller_command(int argc, char** argv);

}  // namespace gpuguard::webhook

#pragma once
// The node-report subcommand of gpuguard-device-plugin.
#include <string>
#include <vector>

namespace gpuguard::deviceplugin {

// args: what follows "node-report" on the command line. Returns the exit status.
int run_node_report_command(const std::vector<std::string>& args);

}  // namespace gpuguard::deviceplugin

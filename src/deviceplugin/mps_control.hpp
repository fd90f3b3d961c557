#pragma once
// The mps-control subcommand of gpuguard-device-plugin: NVIDIA's MPS control daemon per shared GPU.
#include <string>
#include <vector>

namespace gpuguard::deviceplugin {

// args: what follows "mps-control" on the command line. Returns the exit status.
int run_mps_control_command(const std::vector<std::string>& args);

}  // namespace gpuguard::deviceplugin

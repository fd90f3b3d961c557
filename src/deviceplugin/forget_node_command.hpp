#pragma once
// The forget-node subcommand of gpuguard-device-plugin: after an uninstall, removes from a node what the
// plugin wrote there, so that nothing of gpuguard goes on acting on it (docs/operations.md, "Uninstall").
#include <filesystem>
#include <string>
#include <vector>

#include "gpuguard/deviceplugin/config.hpp"

namespace gpuguard::deviceplugin {

// What forget_node removed, and what it left and why.
struct Forgotten {
  std::vector<std::filesystem::path> removed;
  std::vector<std::string> kept;
};

// Removes, under config.host_root: the plugin's CDI spec and its none spec in cdi_root, the NFD feature
// file (the config's, else the chart's path), and the MPS root, unless something is mounted under it.
Forgotten forget_node(const PluginConfig& config);

// args: what follows "forget-node" on the command line. Returns the exit status.
int run_forget_node_command(const std::vector<std::string>& args);

}  // namespace gpuguard::deviceplugin

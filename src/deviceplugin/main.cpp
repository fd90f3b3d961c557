// gpuguard-device-plugin: serves NVIDIA GPUs (by UUID, whole, as MIG devices, time-sliced or MPS replicas)
// and host devices such as /dev/fuse to the kubelet.
#include <boost/program_options.hpp>

#include <iostream>

#include "forget_node_command.hpp"
#include "gpuguard/cli/apiserver_flags.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/deviceplugin/flags.hpp"
#include "mps_control.hpp"
#include "node_report_command.hpp"
#include "plugin_service.hpp"

namespace {

// --check-config: what the plugin would run with, without discovering or serving anything.
void print_config(const gpuguard::deviceplugin::PluginConfig& config, const std::vector<std::string>& warnings) {
  using namespace gpuguard::deviceplugin;
  for (const std::string& warning : warnings) std::cout << "warning: " << warning << "\n";
  std::string strategies;
  for (Strategy s : config.gpu.strategies) {
    if (!strategies.empty()) strategies += ',';
    strategies += strategy_name(s);
  }
  std::cout << "resource " << config.resource_name << ", MIG strategy " << mig_strategy_name(config.mig_strategy)
            << ", device list strategy " << strategies << "\n";
  for (const auto& shared : config.sharing.resources) {
    std::string devices = "all devices";
    if (shared.devices.kind == SharedDevices::Kind::count) {
      devices = "the first " + std::to_string(shared.devices.count) + " device(s)";
    } else if (shared.devices.kind == SharedDevices::Kind::list) {
      devices.clear();
      for (const std::string& ref : shared.devices.refs) devices += (devices.empty() ? "devices " : ",") + ref;
    }
    std::cout << (config.sharing.strategy == SharingStrategy::mps ? "mps " : "time-slicing ") << shared.name << " x"
              << shared.replicas << ", " << devices << (shared.rename.empty() ? "" : " as " + shared.rename) << "\n";
  }
  if (config.sharing.strategy == SharingStrategy::mps && !config.sharing.resources.empty()) {
    std::cout << "mps root " << config.gpu.mps_root << " (a daemon per GPU: gpuguard-device-plugin mps-control)\n";
  }
  for (const HostDevice& device : config.host_devices) {
    std::cout << "host device " << device.resource << ": " << device.patterns.size() << " path(s), " << device.slots
              << " slot(s)\n";
  }
  std::cout << "config OK\n";
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  using namespace gpuguard;
  if (argc >= 2 && std::string(argv[1]) == "node-report")
    return deviceplugin::run_node_report_command({argv + 2, argv + argc});
  if (argc >= 2 && std::string(argv[1]) == "mps-control")
    return deviceplugin::run_mps_control_command({argv + 2, argv + argc});
  if (argc >= 2 && std::string(argv[1]) == "forget-node")
    return deviceplugin::run_forget_node_command({argv + 2, argv + argc});
  po::options_description description(
      "gpuguard-device-plugin: a kubelet device plugin (v1beta1) for NVIDIA GPUs by UUID, MIG devices,\n"
      "time-sliced GPUs, and host devices such as /dev/fuse.\n\n"
      "  gpuguard-device-plugin node-report [--host-root DIR] [--value none|void] [--format text|json]\n"
      "      does the value the webhook injects keep GPUs out on this node? (node-report --help)\n"
      "  gpuguard-device-plugin mps-control [the same flags]\n"
      "      an NVIDIA MPS control daemon per GPU that sharing.mps shares (mps-control --help)\n"
      "  gpuguard-device-plugin forget-node [the same flags] [--wait]\n"
      "      after an uninstall, removes what the plugin wrote on this node (forget-node --help)\n\nOptions");
  deviceplugin::add_flags(description);
  cli::add_apiserver_flags(description);
  description.add_options()("check-config", po::bool_switch(),
                            "read the config file and the flags, print what they come to, and exit: 0 when valid, 2 "
                            "when not");
  const cli::Parsed parsed =
      cli::parse_command_line("gpuguard-device-plugin", GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;
  std::vector<std::string> warnings;
  const auto config = deviceplugin::config_from(*parsed.flags, warnings);
  if (!config) return 2;
  if ((*parsed.flags)["check-config"].as<bool>()) {
    print_config(*config, warnings);
    return 0;
  }
  std::optional<kube::ApiServer> apiserver;
  if (!config->node_name.empty()) {
    try {
      apiserver = cli::api_server(*parsed.flags);
    } catch (const std::exception& e) {
      std::cerr << "gpuguard-device-plugin: --node-name needs the Kubernetes API: " << e.what() << "\n";
      return 2;
    }
  }
  return cli::run_service([&] { deviceplugin::serve(*config, warnings, apiserver); });
}

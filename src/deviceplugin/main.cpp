// gpuguard-device-plugin: serves NVIDIA GPUs (by UUID, whole, as MIG devices or as time-sliced replicas)
// and host devices such as /dev/fuse to the kubelet.
#include <boost/program_options.hpp>

#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/deviceplugin/flags.hpp"
#include "plugin_service.hpp"

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  using namespace gpuguard;
  po::options_description description(
      "gpuguard-device-plugin: a kubelet device plugin (v1beta1) for NVIDIA GPUs by UUID, MIG devices,\n"
      "time-sliced GPUs, and host devices such as /dev/fuse.\n\nOptions");
  deviceplugin::add_flags(description);
  const cli::Parsed parsed =
      cli::parse_command_line("gpuguard-device-plugin", GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;
  std::vector<std::string> warnings;
  const auto config = deviceplugin::config_from(*parsed.flags, warnings);
  if (!config) return 2;
  return cli::run_service([&] { deviceplugin::serve(*config, warnings); });
}

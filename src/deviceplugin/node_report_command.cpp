// `gpuguard-device-plugin node-report`: the node report (nodereport/) once, for an admin or a test.
#include "node_report_command.hpp"

#include <boost/program_options.hpp>

#include <iostream>

#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/nodereport/host_root.hpp"

namespace gpuguard::deviceplugin {

int run_node_report_command(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  po::options_description description(
      "gpuguard-device-plugin node-report: does the NVIDIA_VISIBLE_DEVICES value the webhook injects keep GPUs\n"
      "out of containers on this node? Judged from the host's files: NVIDIA's toolkit config and version, the\n"
      "container runtime's default runtime, the CDI specs. Exits 0 when honoured or not acted on, 3 when\n"
      "it leaks or breaks pods, 2 on bad flags.\n\nOptions");
  description.add_options()("help,h", "this text")(
      "host-root", po::value<std::string>()->default_value("/"),
      "a directory holding the host's files at their paths (the chart mounts the ones the report reads, "
      "read-only, under /host)")("value", po::value<std::string>()->default_value("none"),
                                 "the value the webhook injects: none or void")(
      "format", po::value<std::string>()->default_value("text"), "text or json");
  const cli::Parsed parsed = cli::parse_subcommand("gpuguard-device-plugin node-report", description, args);
  if (!parsed.flags) return parsed.exit_status;
  const po::variables_map& flags = *parsed.flags;
  const std::string value = flags["value"].as<std::string>();
  const std::string format = flags["format"].as<std::string>();
  if ((value != "none" && value != "void") || (format != "text" && format != "json")) {
    std::cerr << "gpuguard-device-plugin node-report: --value is none or void, --format text or json\n";
    return 2;
  }
  const nodereport::Report report =
      nodereport::judge(nodereport::HostRoot(flags["host-root"].as<std::string>()), value);
  std::cout << (format == "json" ? nodereport::to_json(report) : nodereport::to_text(report));
  return report.value_honoured() ? 0 : 3;
}

}  // namespace gpuguard::deviceplugin

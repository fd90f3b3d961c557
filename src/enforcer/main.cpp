// gpuguard-node-enforcer: gives every container exactly the GPUs the kubelet allocated it, when the
// container runtime creates it (NRI), whichever way the pod got past admission.
#include <boost/program_options.hpp>

#include <malloc.h>

#include <iostream>
#include <optional>
#include <string>

#include "enforcer_service.hpp"
#include "gpuguard/cli/apiserver_flags.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/policy/policy.hpp"

namespace po = boost::program_options;
using namespace gpuguard;

namespace {

constexpr const char* kProgram = "gpuguard-node-enforcer";
constexpr const char* kUsage =
    "gpuguard-node-enforcer: an NRI plugin of the node's container runtime (containerd 2.0 and later, CRI-O 1.30\n"
    "and later). At each container's creation it compares what the container would see of the node's GPUs (its\n"
    "NVIDIA_VISIBLE_DEVICES, device nodes, mounts and CDI devices) with what the kubelet allocated it (the\n"
    "pod-resources API), and sets NVIDIA_VISIBLE_DEVICES to exactly those GPUs, or refuses the create, as the\n"
    "policy's nodeEnforcement says; at registration it reports the running containers that see more.\n\n"
    "Usage:\n"
    "  gpuguard-node-enforcer [options]\n\n"
    "Options";

bool valid_index(const std::string& index) {
  return index.size() == 2 && std::isdigit(static_cast<unsigned char>(index[0])) &&
         std::isdigit(static_cast<unsigned char>(index[1]));
}

bool valid_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '.' || c == '+' || c == '-';
  });
}

void add_flags(po::options_description& description) {
  description.add_options()("nri-socket", po::value<std::string>()->default_value("/var/run/nri/nri.sock"),
                            "the runtime's NRI socket")(
      "nri-unserved-after", po::value<unsigned>()->default_value(30),
      "seconds with no NRI socket to connect to (none, or nothing listening) before the runtime is taken to "
      "serve no NRI: the enforcer is then ready, and reports the node not enforced (1 to 3600)")(
      "plugin-name", po::value<std::string>()->default_value("gpuguard"),
      "the plugin's name, as the runtime's required_plugins names it")(
      "plugin-index", po::value<std::string>()->default_value("50"),
      "two digits: the runtime calls plugins in ascending index, so after those that add devices")(
      "pod-resources-socket", po::value<std::string>()->default_value("/var/lib/kubelet/pod-resources/kubelet.sock"),
      "the kubelet's pod-resources API")(
      "kubelet-root", po::value<std::string>()->default_value("/var/lib/kubelet"),
      "the kubelet's directory on the host: what lies in a pod's volumes under it, the pod's containers can make "
      "a link, so a hostPath below one is not judged as written")(
      "host-root", po::value<std::string>()->default_value("/"),
      "where the host's /proc/driver/nvidia, /etc/cdi and /var/run/cdi are")(
      "policy-dir", po::value<std::string>(),
      "the mounted gpuguard-policy ConfigMap: nodeEnforcement, its exemptions and gpuResources are read, re-read on "
      "change (default: enforce, no exemption)")("metrics-address",
                                                 po::value<std::string>()->default_value("0.0.0.0:8080"),
                                                 "IP:port of /healthz, /readyz and /metrics, plain HTTP")(
      "exempt-service-accounts", po::value<std::string>(),
      "namespace/name pairs, comma-separated, exempt besides the policy's exemptions; namespace/name:key=value "
      "exempts only that account's pods carrying that label (the chart names its own device plugin's, node "
      "report's, host-devices plugin's, MPS daemons' and the enforcer's)")(
      "mps-root", po::value<std::string>(),
      "the device plugin's MPS root on the host (its --mps-root; default /run/gpuguard/mps): a bind mount of it, "
      "of a GPU's directory under it, or of a directory above it reaches MPS servers (NVIDIA's /run/nvidia/mps "
      "is held too)")(
      "mask-hook-dir", po::value<std::string>(),
      "a host directory, mounted at the same path: gpuguard-mask-check is copied there at the start, and on CRI-O "
      "each container given masks over MPS roots gets it as a createRuntime hook, which fails the create where a "
      "mask did not land (default: none; on CRI-O such a container is refused)")(
      "node-name", po::value<std::string>(),
      "this node's name: the report of running containers is also a Node event (needs the API; default: none)")(
      "break-glass-configmap", po::value<std::string>(),
      "NAMESPACE/NAME of a ConfigMap watched through the API: while it exists, every container is created as it is, "
      "nothing enforced or refused (the chart's: <release namespace>/<release>-break-glass; default: none)");
}

// Each step reads its flags into the configuration, or says why it cannot (the message after "<program>: ").
using Problem = std::optional<std::string>;

Problem read_nri_flags(const po::variables_map& flags, enforcer::EnforcerConfig& config) {
  config.nri_socket = flags["nri-socket"].as<std::string>();
  const unsigned unserved_after = flags["nri-unserved-after"].as<unsigned>();
  if (unserved_after < 1 || unserved_after > 3600) return "--nri-unserved-after must be 1 to 3600 seconds";
  config.nri_unserved_after = std::chrono::seconds(unserved_after);
  config.plugin_name = flags["plugin-name"].as<std::string>();
  config.plugin_index = flags["plugin-index"].as<std::string>();
  if (!valid_index(config.plugin_index)) return "--plugin-index must be two digits, such as 50";
  if (!valid_name(config.plugin_name)) return "--plugin-name may hold only letters, digits and _ . + -";
  return std::nullopt;
}

Problem read_node_flags(const po::variables_map& flags, enforcer::EnforcerConfig& config) {
  config.pod_resources_socket = flags["pod-resources-socket"].as<std::string>();
  config.host_root = flags["host-root"].as<std::string>();
  config.kubelet_root = flags["kubelet-root"].as<std::string>();
  if (!config.kubelet_root.is_absolute()) return "--kubelet-root must be an absolute path on the host";
  config.policy_dir = cli::path_flag(flags, "policy-dir");
  config.metrics_address = flags["metrics-address"].as<std::string>();
  if (flags.count("node-name")) config.node_name = flags["node-name"].as<std::string>();
  if (flags.count("mask-hook-dir")) {
    config.mask_hook_dir = flags["mask-hook-dir"].as<std::string>();
    if (!config.mask_hook_dir->is_absolute()) return "--mask-hook-dir must be an absolute path on the host";
  }
  if (flags.count("mps-root")) {
    const std::string root = flags["mps-root"].as<std::string>();
    if (!root.starts_with('/')) return "--mps-root must be an absolute path on the host";
    config.mps_roots.push_back(root);
  }
  return std::nullopt;
}

Problem read_exemptions(const po::variables_map& flags, enforcer::EnforcerConfig& config) {
  if (!flags.count("exempt-service-accounts")) return std::nullopt;
  const std::string accounts = flags["exempt-service-accounts"].as<std::string>();
  const policy::PolicyParse parsed = policy::parse_policy({{"nodeEnforcementExemptServiceAccounts", accounts}});
  if (!parsed.policy) return "--exempt-service-accounts: " + parsed.error;
  config.exempt_service_accounts = parsed.policy->node_enforcement_exempt_service_accounts;
  return std::nullopt;
}

// The API server, and the break glass, which is read through it.
Problem read_api_flags(const po::variables_map& flags, enforcer::EnforcerConfig& config) {
  if (flags.count("break-glass-configmap")) {
    const std::string configmap = flags["break-glass-configmap"].as<std::string>();
    const std::size_t slash = configmap.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == configmap.size() ||
        configmap.find('/', slash + 1) != std::string::npos) {
      return "--break-glass-configmap must be NAMESPACE/NAME";
    }
    config.break_glass_namespace = configmap.substr(0, slash);
    config.break_glass_name = configmap.substr(slash + 1);
  }
  if (cli::apiserver_known(flags)) {
    try {
      config.apiserver = cli::api_server(flags);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  }
  if (!config.break_glass_name.empty() && !config.apiserver) {
    return "--break-glass-configmap needs the API (--apiserver-url, or run in a pod)";
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  // A request can be 4 MiB, held once (include/gpuguard/nri/wire.hpp). glibc raises its mmap threshold to the largest
  // block freed so far, so after one such request the next comes from the heap and stays there; a fixed
  // threshold keeps every large block mapped apart, and given back when freed (docs/benchmarks.md).
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  po::options_description description(kUsage);
  cli::add_apiserver_flags(description);
  add_flags(description);
  const cli::Parsed parsed = cli::parse_command_line(kProgram, GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;

  enforcer::EnforcerConfig config;
  for (const auto& step : {read_nri_flags, read_node_flags, read_exemptions, read_api_flags}) {
    if (const Problem problem = step(*parsed.flags, config)) {
      std::cerr << kProgram << ": " << *problem << "\n";
      return 2;
    }
  }
  return cli::run_service([&] { enforcer::serve(config); });
}

// The await-rollout command: the chart's node cleanup at `helm uninstall` (docs/operations.md, "Uninstall").
// Its DaemonSet runs `gpuguard-device-plugin forget-node` on every node, ready once that node has forgotten
// gpuguard; Helm waits for a hook Job, not a DaemonSet, so this Job waits for the DaemonSet, and the
// uninstall ends when every node is clean or says, at --timeout, that some are not.
#include "await_rollout_command.hpp"

#include <boost/program_options.hpp>

#include <chrono>
#include <iostream>
#include <string_view>
#include <thread>

#include "gpuguard/cli/apiserver_flags.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/k8s/names.hpp"
#include "gpuguard/kube/request.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/webhook/arming.hpp"

namespace gpuguard::webhook {
namespace {

namespace po = boost::program_options;
using namespace std::chrono_literals;

constexpr const char* kProgram = "gpuguard-webhook await-rollout";
constexpr const char* kUsage =
    "gpuguard-webhook await-rollout: waits until a DaemonSet has a ready pod of its current template on every\n"
    "node it should run on, as kubectl rollout status does. The chart runs it as a post-delete hook after its\n"
    "node cleanup's DaemonSet, whose pods are ready once their node has forgotten gpuguard, so that helm\n"
    "uninstall ends with every node clean. Exits 0 then, 1 when that is not so within --timeout (saying how\n"
    "many nodes are left and how to see which) or the DaemonSet cannot be read, 2 on bad flags.\n\n"
    "Usage:\n"
    "  gpuguard-webhook await-rollout --namespace NS --daemonset NAME [--timeout SECONDS]\n\n"
    "In a pod it reaches the Kubernetes API with its service account; elsewhere give --apiserver-url,\n"
    "--token-file and --ca-file.\n\n"
    "Options";
constexpr auto kRequestTimeout = 10s;
constexpr auto kPoll = 2s;

}  // namespace

int run_await_rollout_command(int argc, char** argv) {
  po::options_description description(kUsage);
  cli::add_apiserver_flags(description);
  description.add_options()("namespace", po::value<std::string>(), "the DaemonSet's namespace")(
      "daemonset", po::value<std::string>(), "the DaemonSet, in --namespace")(
      "timeout", po::value<unsigned>()->default_value(240), "seconds to wait; then exit 1");
  const cli::Parsed parsed = cli::parse_command_line(kProgram, GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;
  const po::variables_map& flags = *parsed.flags;
  // Each names an object in a request's path, so each must be a name the API server could hold (RFC 1123).
  for (const char* required : {"namespace", "daemonset"}) {
    if (flags.count(required) == 0) {
      std::cerr << kProgram << ": --" << required << " is required (see --help)\n";
      return 2;
    }
    const std::string& value = flags[required].as<std::string>();
    const bool valid =
        std::string_view(required) == "namespace" ? k8s::is_dns_label(value) : arming::is_deployment_name(value);
    if (!valid) {
      std::cerr << kProgram << ": --" << required << " \"" << value << "\" is not a " << required << "'s name\n";
      return 2;
    }
  }
  kube::ApiServer api;
  if (const int status = cli::require_api_server(kProgram, flags, api); status != 0) return status;
  const std::string ns = flags["namespace"].as<std::string>();
  const std::string daemonset = flags["daemonset"].as<std::string>();
  const std::string path = "/apis/apps/v1/namespaces/" + ns + "/daemonsets/" + daemonset;
  const std::string name = ns + "/" + daemonset;
  const unsigned timeout_s = flags["timeout"].as<unsigned>();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::string last;
  for (;;) {
    const kube::Reply reply = kube::send_request(
        api, {"GET", path, "", "", std::string("gpuguard-await-rollout/") + GPUGUARD_VERSION, ""}, kRequestTimeout);
    arming::Availability rollout;
    if (reply.status == 200) {
      rollout = arming::daemonset_rollout(reply.body);
    } else {
      rollout.waiting = "cannot read the DaemonSet: " + std::to_string(reply.status) + " " + reply.error;
    }
    if (rollout.available) break;
    if (rollout.waiting != last) {
      log::info("waiting for the DaemonSet", {{"daemonset", name}, {"waiting", rollout.waiting}});
      last = rollout.waiting;
    }
    if (std::chrono::steady_clock::now() + kPoll > deadline) {
      std::string next = "kubectl -n ";
      next.append(ns).append(" describe daemonset ").append(daemonset).append("; kubectl -n ").append(ns);
      next.append(" get pods -o wide: the nodes whose pod is not ready");
      log::error("the DaemonSet is not ready on every node",
                 {{"daemonset", name}, {"waiting", rollout.waiting}, {"timeout_s", timeout_s}, {"next", next}});
      return 1;
    }
    std::this_thread::sleep_for(kPoll);
  }
  log::info("the DaemonSet is ready on every node", {{"daemonset", name}});
  return 0;
}

}  // namespace gpuguard::webhook

// The await-rollout command: the chart's node cleanup at `helm uninstall` (docs/operations.md, "Uninstall").
// Its DaemonSet runs `gpuguard-device-plugin forget-node` on every GPU node, ready once that node has forgotten
// gpuguard; Helm waits for a hook Job, not a DaemonSet, so this Job waits for the DaemonSet, and the
// uninstall ends when every node is clean or says, at --timeout, that some are not.
#include "await_rollout_command.hpp"

#include <boost/program_options.hpp>

#include <chrono>
#include <iostream>
#include <string_view>
#include <thread>
#include <vector>

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
    "uninstall ends with every node clean. Exits 0 then, 1 when that is not so within --timeout (naming the\n"
    "nodes whose pod is not ready, the first 20, and counting them) or the DaemonSet cannot be read, 2 on bad\n"
    "flags.\n\n"
    "Usage:\n"
    "  gpuguard-webhook await-rollout --namespace NS --daemonset NAME [--timeout SECONDS]\n\n"
    "In a pod it reaches the Kubernetes API with its service account; elsewhere give --apiserver-url,\n"
    "--token-file and --ca-file.\n\n"
    "Options";
constexpr auto kRequestTimeout = 10s;
constexpr auto kPoll = 2s;
// When it is not done in time, the nodes whose pod is not ready are named, this many, and counted, over pages
// of this many pods, at most this many pages: bounded, whatever the cluster's size.
constexpr std::size_t kNamed = 20;
constexpr int kPageSize = 100;
constexpr int kPages = 100;

kube::Reply get(const kube::ApiServer& api, const std::string& path) {
  return kube::send_request(api, {"GET", path, "", "", std::string("gpuguard-await-rollout/") + GPUGUARD_VERSION, ""},
                            kRequestTimeout);
}

// Where the DaemonSet's pods are not ready, as "N not ready: node, node, ...", or why that cannot be said. Helm
// deletes the DaemonSet once this hook has failed, so its log is where an admin finds the nodes left.
std::string where_not_ready(const kube::ApiServer& api, const std::string& ns, const std::string& daemonset_json) {
  const std::string selector = arming::daemonset_pod_selector(daemonset_json);
  if (selector.empty()) return "unknown: the DaemonSet has no selector to list its pods by";
  std::vector<std::string> named;
  std::size_t count = 0;
  std::string next;
  for (int page = 0; page < kPages; ++page) {
    std::string path = "/api/v1/namespaces/" + ns + "/pods?labelSelector=" + kube::percent_encode(selector) +
                       "&limit=" + std::to_string(kPageSize);
    if (!next.empty()) path.append("&continue=").append(kube::percent_encode(next));
    const kube::Reply reply = get(api, path);
    if (reply.status != 200) {
      return "unknown: cannot list its pods: " + std::to_string(reply.status) + " " + reply.error;
    }
    arming::PodsNotReady pods = arming::pods_not_ready(reply.body);
    if (!pods.error.empty()) return "unknown: " + pods.error;
    count += pods.where.size();
    for (std::string& where : pods.where) {
      if (named.size() < kNamed) named.push_back(std::move(where));
    }
    next = std::move(pods.next);
    if (next.empty()) break;
  }
  std::string said = std::to_string(count) + (next.empty() ? "" : " or more") + " not ready";
  for (std::size_t i = 0; i < named.size(); ++i) said.append(i == 0 ? ": " : ", ").append(named[i]);
  if (named.size() < count) said.append(", ...");
  return said;
}

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
    const kube::Reply reply = get(api, path);
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
      log::error("the DaemonSet is not ready on every node",
                 {{"daemonset", name},
                  {"waiting", rollout.waiting},
                  {"timeout_s", timeout_s},
                  {"nodes", reply.status == 200 ? where_not_ready(api, ns, reply.body) : "unknown"}});
      return 1;
    }
    std::this_thread::sleep_for(kPoll);
  }
  log::info("the DaemonSet is ready on every node", {{"daemonset", name}});
  return 0;
}

}  // namespace gpuguard::webhook

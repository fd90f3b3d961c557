// The arm command: the chart's post-install hook. Until it has run, the webhook configuration admits pods
// the webhook cannot review (failurePolicy Ignore) and the backstop only warns, so an install whose pods
// never become ready (an image that cannot be pulled, a bad value) refuses no pod anywhere.
#include "arm_command.hpp"

#include <boost/program_options.hpp>

#include <chrono>
#include <functional>
#include <iostream>
#include <thread>

#include "gpuguard/cli/apiserver_flags.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/kube/request.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/webhook/arming.hpp"

namespace gpuguard::webhook {
namespace {

namespace po = boost::program_options;
using namespace std::chrono_literals;

constexpr const char* kProgram = "gpuguard-webhook arm";
constexpr const char* kUsage =
    "gpuguard-webhook arm: waits until the webhook's Deployment has a replica available, then sets the webhook\n"
    "configuration's failurePolicy to Fail and the backstop binding's validationActions to Deny. The chart runs\n"
    "it as a post-install and post-upgrade hook, so that nothing refuses pods before a replica can answer.\n\n"
    "Usage:\n"
    "  gpuguard-webhook arm --namespace NS --deployment NAME [--webhook-configuration NAME]\n"
    "                       [--backstop-binding NAME] [options]\n\n"
    "In a pod it reaches the Kubernetes API with its service account; elsewhere give --apiserver-url,\n"
    "--token-file and --ca-file.\n\n"
    "Options";
constexpr auto kRequestTimeout = 10s;
constexpr auto kPoll = 2s;

kube::Reply get(const kube::ApiServer& api, const std::string& path) {
  return kube::send_request(api, {"GET", path, "", "", std::string("gpuguard-arm/") + GPUGUARD_VERSION, ""},
                            kRequestTimeout);
}

// Arms one object: GET it, decide, PATCH. False, after saying why, when it cannot be armed.
bool arm_object(const kube::ApiServer& api, const std::string& path, const std::string& what,
                const std::function<arming::Step(std::string_view)>& decide) {
  const kube::Reply current = get(api, path);
  if (current.status != 200) {
    log::error("cannot read what to arm", {{"object", what}, {"status", current.status}, {"reason", current.error}});
    return false;
  }
  const arming::Step step = decide(current.body);
  if (!step.error.empty()) {
    log::error("cannot arm", {{"object", what}, {"reason", step.error}});
    return false;
  }
  if (!step.patch) {
    log::info("armed already", {{"object", what}});
    return true;
  }
  const kube::Reply patched = kube::send_request(
      api,
      {"PATCH", path, "application/json-patch+json", *step.patch, std::string("gpuguard-arm/") + GPUGUARD_VERSION, ""},
      kRequestTimeout);
  if (patched.status != 200) {
    log::error("cannot arm", {{"object", what}, {"status", patched.status}, {"reason", patched.error}});
    return false;
  }
  log::info("armed", {{"object", what}, {"patch", *step.patch}});
  return true;
}

void add_arm_flags(po::options_description& description) {
  cli::add_apiserver_flags(description);
  description.add_options()("namespace", po::value<std::string>(), "the webhook's namespace")(
      "deployment", po::value<std::string>(), "the webhook's Deployment, in --namespace")(
      "webhook-configuration", po::value<std::string>(),
      "the MutatingWebhookConfiguration to set to failurePolicy Fail; none when not given")(
      "webhook", po::value<std::string>()->default_value("visible-devices.gpuguard.io"),
      "the webhook of that configuration")("backstop-binding", po::value<std::string>(),
                                           "the ValidatingAdmissionPolicyBinding to set to Deny; none when not given")(
      "timeout", po::value<unsigned>()->default_value(300),
      "seconds to wait for an available replica; then exit 1 and leave everything as it is");
}

// 0, or 2 after saying which flag is missing.
int check_arm_flags(const po::variables_map& flags) {
  for (const char* required : {"namespace", "deployment"}) {
    if (flags.count(required) == 0 || flags[required].as<std::string>().empty()) {
      std::cerr << kProgram << ": --" << required << " is required (see --help)\n";
      return 2;
    }
  }
  if (flags.count("webhook-configuration") == 0 && flags.count("backstop-binding") == 0) {
    std::cerr << kProgram << ": nothing to arm: give --webhook-configuration, --backstop-binding or both\n";
    return 2;
  }
  return 0;
}

// What the Deployment says of its replicas, or why it cannot be read.
arming::Availability read_availability(const kube::ApiServer& api, const std::string& deployment_path) {
  const kube::Reply reply = get(api, deployment_path);
  if (reply.status == 200) return arming::deployment_availability(reply.body);
  arming::Availability availability;
  if (reply.status == 404) {
    availability.waiting = "the Deployment is not there yet";
  } else {
    availability.waiting = "cannot read the Deployment: " + std::to_string(reply.status);
    if (!reply.error.empty()) availability.waiting.append(" ").append(reply.error);
  }
  return availability;
}

// True once the webhook's Deployment has a replica available; false, after saying why, at --timeout.
bool wait_for_replica(const kube::ApiServer& api, const po::variables_map& flags) {
  const std::string ns = flags["namespace"].as<std::string>();
  const std::string deployment = flags["deployment"].as<std::string>();
  const std::string deployment_path = "/apis/apps/v1/namespaces/" + ns + "/deployments/" + deployment;
  const std::string deployment_name = ns + "/" + deployment;
  const unsigned timeout_s = flags["timeout"].as<unsigned>();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::string last;
  for (;;) {
    const arming::Availability availability = read_availability(api, deployment_path);
    if (availability.available) break;
    if (availability.waiting != last) {
      log::info("waiting for a replica of the webhook",
                {{"deployment", deployment_name}, {"waiting", availability.waiting}});
      last = availability.waiting;
    }
    if (std::chrono::steady_clock::now() + kPoll > deadline) {
      std::string next_step = "fix the Deployment (kubectl -n ";
      next_step.append(ns).append(" describe deployment ").append(deployment).append("), then run helm upgrade again");
      log::error("no replica of the webhook became available: nothing was armed, so nothing refuses pods for it",
                 {{"deployment", deployment_name},
                  {"waiting", availability.waiting},
                  {"timeout_s", timeout_s},
                  {"next", next_step}});
      return false;
    }
    std::this_thread::sleep_for(kPoll);
  }
  log::info("a replica of the webhook is available", {{"deployment", deployment_name}});
  return true;
}

// Arms what the flags name; false when any of it could not be armed.
bool arm_named(const kube::ApiServer& api, const po::variables_map& flags) {
  bool armed = true;
  if (flags.count("webhook-configuration") != 0) {
    const std::string configuration = flags["webhook-configuration"].as<std::string>();
    const std::string webhook = flags["webhook"].as<std::string>();
    armed = arm_object(api, "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/" + configuration,
                       "MutatingWebhookConfiguration " + configuration,
                       [&webhook](std::string_view json) { return arming::webhook_step(json, webhook); });
  }
  if (flags.count("backstop-binding") != 0) {
    const std::string binding = flags["backstop-binding"].as<std::string>();
    armed = arm_object(api, "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/" + binding,
                       "ValidatingAdmissionPolicyBinding " + binding, arming::binding_step) &&
            armed;
  }
  return armed;
}

}  // namespace

int run_arm_command(int argc, char** argv) {
  po::options_description description(kUsage);
  add_arm_flags(description);
  const cli::Parsed parsed = cli::parse_command_line(kProgram, GPUGUARD_VERSION, description, argc, argv);
  if (!parsed.flags) return parsed.exit_status;
  const po::variables_map& flags = *parsed.flags;
  if (const int status = check_arm_flags(flags); status != 0) return status;
  kube::ApiServer api;
  if (const int status = cli::require_api_server(kProgram, flags, api); status != 0) return status;
  if (!wait_for_replica(api, flags)) return 1;
  return arm_named(api, flags) ? 0 : 1;
}

}  // namespace gpuguard::webhook

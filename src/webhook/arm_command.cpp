// The arm command: the chart's post-install hook. Until it has run, the webhook configuration admits pods
// the webhook cannot review (failurePolicy Ignore) and the backstop only warns, so an install whose pods
// never become ready (an image that cannot be pulled, a bad value) refuses no pod anywhere. On an upgrade of
// a release armed already, it runs with --verify-only: the same wait and probe, arming nothing, so that an
// upgrade after which the API server no longer reaches the webhook fails and says so, not passes unseen.
#include "arm_command.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "gpuguard/cli/apiserver_flags.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/k8s/names.hpp"
#include "gpuguard/kube/event.hpp"
#include "gpuguard/kube/request.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/webhook/arming.hpp"

namespace gpuguard::webhook {
namespace {

namespace po = boost::program_options;
using namespace std::chrono_literals;

constexpr const char* kProgram = "gpuguard-webhook arm";
constexpr const char* kUsage =
    "gpuguard-webhook arm: waits until the webhook's Deployment has a replica available and, with\n"
    "--probe-namespace, until a pod created there as a server-side dry run comes back as the webhook answered it\n"
    "(so the API server can call it), ten times in a row (with --each-apiserver, through each API server in\n"
    "turn, twice each at least) and, with --service, until each ready endpoint of the\n"
    "webhook's Service has answered naming its pod, then sets the webhook configuration's failurePolicy to\n"
    "Fail and the backstop binding's validationActions to Deny. The chart runs it as a post-install and\n"
    "post-upgrade hook, so that nothing refuses pods before the API server can have them reviewed. When that is\n"
    "not shown within --timeout, or a pod comes back unanswered after the webhook has answered one, it arms\n"
    "nothing, says why, records a Warning Event on the Deployment, and exits 1. With --verify-only (a release\n"
    "armed already) it waits and probes alike and arms nothing; when that is not shown, it says so, records a\n"
    "Warning Event NotReached on the Deployment, and exits 1, so that the upgrade fails.\n\n"
    "Usage:\n"
    "  gpuguard-webhook arm --namespace NS --deployment NAME [--webhook-configuration NAME]\n"
    "                       [--backstop-binding NAME] [options]\n"
    "  gpuguard-webhook arm --namespace NS --deployment NAME --probe-namespace NS --verify-only [options]\n\n"
    "In a pod it reaches the Kubernetes API with its service account; elsewhere give --apiserver-url,\n"
    "--token-file and --ca-file.\n\n"
    "Options";
constexpr auto kRequestTimeout = 10s;
constexpr auto kPoll = 2s;
// The probe arms only on this many answers in a row, each a new connection to the API server, kConfirm apart,
// and a miss after the first answer leaves it unarmed: one answer can come from the one API server, of several
// behind a load balancer, that reaches the webhook. With --service it goes on, still in a row, until every
// ready endpoint of the webhook's Service has answered (arming.hpp, "Replicas told apart").
constexpr int kAnswersInARow = 10;
constexpr auto kConfirm = 300ms;
// With --each-apiserver the probes go to each API server in turn, at its own address, and the run of answers
// goes on until each has answered this many times: several API servers are no longer met by chance.
constexpr int kAnswersEachApiServer = 2;

// What a hook that could not show the webhook reachable leaves, and says: arming, nothing armed; verifying
// (--verify-only), the release armed as it was, so the pods the webhook should review are refused while this
// lasts (under failurePolicy Fail every one it covers; by the backstop alone, those it should have patched).
struct Failure {
  const char* left;    // ends the log's error
  const char* reason;  // the Warning Event's
  const char* event;   // the Event's message, before why
};
constexpr Failure kNotArmed{
    "nothing was armed, so nothing refuses pods for it", "NotArmed",
    "gpuguard did not arm the webhook configuration and the backstop, so nothing refuses pods for it: "};
constexpr Failure kNotReached{
    "it was armed already and is left so: until the API server reaches the webhook, the pods it should review are "
    "refused",
    "NotReached",
    "gpuguard is armed, but the API server was not shown to call its webhook after this release changed; until it "
    "does, the pods the webhook should review are refused: "};

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
      "probe-namespace", po::value<std::string>(),
      "a namespace the webhook covers, where a pod is created as a server-side dry run until it comes back as the "
      "webhook answered it; not given: a replica available is enough")(
      "service", po::value<std::string>(),
      "the webhook's Service, in --namespace: the probe goes on until each of its ready endpoints (the "
      "webhook's replicas, which name their pods) has answered; not given: replicas are not told apart")(
      "each-apiserver", po::bool_switch(),
      "probe through each API server the EndpointSlice default/kubernetes names (the one the API servers write), "
      "in turn, at its own address, its certificate checked as the API's host (in a pod, the Service's address), "
      "until each has answered twice within the run; without that slice, through the Service alone, as when not "
      "given, which meets several API servers only by chance; needs --probe-namespace")(
      "probe-image", po::value<std::string>()->default_value("gpuguard-arm-probe"),
      "the image the probe pod names (never pulled: a dry run runs nothing); the chart passes its own, which "
      "a registry allowlist admits")(
      "timeout", po::value<unsigned>()->default_value(300),
      "seconds to wait for an available replica and the probe; then exit 1 and leave everything as it is")(
      "verify-only", po::bool_switch(),
      "the release is armed already: wait for a replica and probe through --probe-namespace as when arming, "
      "and arm nothing; exit 1, with a Warning Event NotReached, when the API server is not shown to call the "
      "webhook");
}

// 0, or 2 after saying which flag is missing or is not the name of what it names.
int check_arm_flags(const po::variables_map& flags) {
  for (const char* required : {"namespace", "deployment"}) {
    if (flags.count(required) == 0 || flags[required].as<std::string>().empty()) {
      std::cerr << kProgram << ": --" << required << " is required (see --help)\n";
      return 2;
    }
  }
  // Each names an object in a request's path, so each must be a name the API server could hold (RFC 1123),
  // which cannot reach beyond its place in that path. An empty --probe-namespace says no probe.
  struct Name {
    const char* flag;
    bool (*valid)(std::string_view);
    const char* what;
    bool empty_allowed;
  };
  for (const Name& name :
       {Name{"namespace", k8s::is_dns_label, "a namespace's name", false},
        Name{"deployment", arming::is_deployment_name, "a Deployment's name", false},
        Name{"service", k8s::is_dns_label, "a Service's name", false},
        Name{"webhook-configuration", k8s::is_dns_subdomain, "a MutatingWebhookConfiguration's name", false},
        Name{"backstop-binding", k8s::is_dns_subdomain, "a ValidatingAdmissionPolicyBinding's name", false},
        Name{"probe-namespace", k8s::is_dns_label, "a namespace's name", true}}) {
    if (flags.count(name.flag) == 0) continue;
    const std::string& value = flags[name.flag].as<std::string>();
    if (value.empty() && name.empty_allowed) continue;
    if (!name.valid(value)) {
      std::cerr << kProgram << ": --" << name.flag << " \"" << value << "\" is not " << name.what << "\n";
      return 2;
    }
  }
  const bool names_something = flags.count("webhook-configuration") != 0 || flags.count("backstop-binding") != 0;
  if (flags["each-apiserver"].as<bool>() &&
      (flags.count("probe-namespace") == 0 || flags["probe-namespace"].as<std::string>().empty())) {
    std::cerr << kProgram << ": --each-apiserver needs --probe-namespace: it is how the probe goes\n";
    return 2;
  }
  if (flags["verify-only"].as<bool>()) {
    if (names_something) {
      std::cerr << kProgram
                << ": --verify-only arms nothing: give it without --webhook-configuration and --backstop-binding\n";
      return 2;
    }
    if (flags.count("probe-namespace") == 0 || flags["probe-namespace"].as<std::string>().empty()) {
      std::cerr << kProgram << ": --verify-only needs --probe-namespace: it shows the API server calls the webhook\n";
      return 2;
    }
    return 0;
  }
  if (flags.count("service") != 0 &&
      (flags.count("probe-namespace") == 0 || flags["probe-namespace"].as<std::string>().empty())) {
    std::cerr << kProgram << ": --service needs --probe-namespace: its replicas are heard through the probe\n";
    return 2;
  }
  if (!names_something) {
    std::cerr << kProgram << ": nothing to arm: give --webhook-configuration, --backstop-binding or both\n";
    return 2;
  }
  return 0;
}

// What the Deployment says of its replicas, or why it cannot be read.
arming::Availability read_availability(const kube::ApiServer& api, const std::string& deployment_path,
                                       bool rolled_out) {
  const kube::Reply reply = get(api, deployment_path);
  if (reply.status == 200) return arming::deployment_availability(reply.body, rolled_out);
  arming::Availability availability;
  if (reply.status == 404) {
    availability.waiting = "the Deployment is not there yet";
  } else {
    availability.waiting = "cannot read the Deployment: " + std::to_string(reply.status);
    if (!reply.error.empty()) availability.waiting.append(" ").append(reply.error);
  }
  return availability;
}

// The webhook's Deployment (--namespace, --deployment), as the API server serves it.
std::string deployment_path(const po::variables_map& flags) {
  return "/apis/apps/v1/namespaces/" + flags["namespace"].as<std::string>() + "/deployments/" +
         flags["deployment"].as<std::string>();
}

// True once the webhook's Deployment has a replica available; false, after saying why, at the deadline.
bool wait_for_replica(const kube::ApiServer& api, const po::variables_map& flags,
                      std::chrono::steady_clock::time_point deadline, const Failure& failure) {
  const std::string ns = flags["namespace"].as<std::string>();
  const std::string deployment = flags["deployment"].as<std::string>();
  const std::string deployment_name = ns + "/" + deployment;
  const std::string path = deployment_path(flags);
  const unsigned timeout_s = flags["timeout"].as<unsigned>();
  std::string last;
  for (;;) {
    // Replicas told apart (--service): an older version's replicas, which name no pod, gone first.
    const arming::Availability availability = read_availability(api, path, flags.count("service") != 0);
    if (availability.available) break;
    if (availability.waiting != last) {
      log::info("waiting for a replica of the webhook",
                {{"deployment", deployment_name}, {"waiting", availability.waiting}});
      last = availability.waiting;
    }
    if (std::chrono::steady_clock::now() + kPoll > deadline) {
      std::string next_step = "fix the Deployment (kubectl -n ";
      next_step.append(ns).append(" describe deployment ").append(deployment).append("), then run helm upgrade again");
      log::error(std::string("no replica of the webhook became available: ") + failure.left,
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

// Records why the webhook was not shown reachable as a Warning Event on its Deployment, for `kubectl describe`.
void record_failure(const kube::ApiServer& api, const po::variables_map& flags, const Failure& failure,
                    const std::string& why) {
  const std::string ns = flags["namespace"].as<std::string>();
  const std::string deployment = flags["deployment"].as<std::string>();
  // Its UID, read again here: the Deployment may have been made again while the hook waited.
  const kube::Reply read = get(api, deployment_path(flags));
  const kube::WarningEvent event{
      {"apps/v1", "Deployment", ns, deployment, read.status == 200 ? arming::metadata_uid(read.body) : ""},
      ns,
      failure.reason,
      failure.event + why,
      "gpuguard-arm",
      "",
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()};
  const kube::Reply reply =
      kube::send_request(api,
                         {"POST", kube::events_path(ns), "application/json", kube::warning_event_json(event),
                          std::string("gpuguard-arm/") + GPUGUARD_VERSION, ""},
                         kRequestTimeout);
  if (reply.status != 201) {
    log::warn("cannot record the Event", {{"status", reply.status}, {"reason", reply.error}});
  }
}

// Which ready replicas of the webhook (endpoints of --service) have not answered yet: `what` is empty once
// each has, or without --service. `refused`: the API server will not list them (401, 403, 404), which no
// wait mends.
struct Unheard {
  std::string what;
  bool refused = false;
};
Unheard unheard_replicas(const kube::ApiServer& api, const po::variables_map& flags,
                         const std::set<std::string>& heard) {
  if (flags.count("service") == 0) return {};
  const std::string service = flags["service"].as<std::string>();
  const kube::Reply reply = get(api, "/apis/discovery.k8s.io/v1/namespaces/" + flags["namespace"].as<std::string>() +
                                         "/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D" + service);
  if (reply.status != 200) {
    const bool refused = reply.status == 401 || reply.status == 403 || reply.status == 404;
    return {"cannot list the endpoints of Service " + service + ": " + std::to_string(reply.status) + " " + reply.error,
            refused};
  }
  const arming::ReadyReplicas ready = arming::ready_replicas(reply.body);
  if (!ready.error.empty()) return {"cannot read the endpoints of Service " + service + ": " + ready.error, false};
  if (ready.names.empty()) return {"Service " + service + " lists no ready endpoint yet", false};
  std::string unheard;
  for (const std::string& name : ready.names) {
    if (heard.count(name) == 0) unheard.append(unheard.empty() ? "" : ", ").append(name);
  }
  return {unheard.empty() ? "" : "ready replicas of Service " + service + " not heard from yet: " + unheard, false};
}

// Why the timeout came while the webhook was answering: before its ten answers in a row, or with replicas
// (`unheard`) not heard from after them.
std::string timed_out_answering(int in_a_row, int answers_wanted, const std::string& unheard) {
  if (in_a_row < answers_wanted) {
    return "the timeout came after " + std::to_string(in_a_row) + " of the " + std::to_string(answers_wanted) +
           " answers in a row the webhook must give";
  }
  return "the timeout came after " + std::to_string(in_a_row) + " answers in a row, with " + unheard +
         ": the API server's calls may not reach those replicas (a NetworkPolicy that admits it to some nodes "
         "only), or they do not name themselves (--replica)";
}

// Where the probes go: with --each-apiserver, each API server the EndpointSlice default/kubernetes names (the
// one the API servers write themselves), reached at its own address and checked as `api` is (its host: the
// Service's address or name in a pod, which every API server's certificate names), so that the probes meet
// every one; without that slice (a control plane that writes none), or without the flag, `api` alone. Empty,
// after saying why, when the slice cannot be read.
std::vector<kube::ApiServer> probe_targets(const kube::ApiServer& api, const po::variables_map& flags,
                                           std::string& why) {
  if (!flags["each-apiserver"].as<bool>()) return {api};
  const kube::Reply reply = get(api, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes");
  if (reply.status == 404) {
    log::info("no EndpointSlice default/kubernetes: probing through the Service alone", {{"apiserver", api.url()}});
    return {api};
  }
  if (reply.status != 200) {
    why = "cannot read the API servers, EndpointSlice default/kubernetes: " + std::to_string(reply.status) + " " +
          reply.error;
    return {};
  }
  const std::string verified = api.verify_name.empty() ? api.host : api.verify_name;
  const arming::ApiServers found = arming::api_servers(reply.body, verified);
  if (!found.error.empty() || found.addresses.empty()) {
    why = "cannot read the API servers, EndpointSlice default/kubernetes: " +
          (found.error.empty() ? std::string("none is ready") : found.error);
    return {};
  }
  std::vector<kube::ApiServer> targets;
  std::string listed;
  for (const arming::ApiServerAddress& address : found.addresses) {
    kube::ApiServer target = api;
    target.host = address.host;
    target.port = address.port;
    target.verify_name = verified;
    targets.push_back(std::move(target));
    listed.append(listed.empty() ? "" : ", ").append(targets.back().url());
  }
  log::info("probing through each API server", {{"apiservers", listed}, {"certificates_checked_as", verified}});
  return targets;
}

// One dry-run pod sent through one API server, and what came back; `named`: the API server said in `why`
// (and `waiting`, what the log says while none has answered yet, says it not, so that it changes only when
// what is waited for does).
struct Probed {
  arming::ProbeResult result;
  std::string waiting;
};
Probed probe_once(const kube::ApiServer& through, const std::string& path, const std::string& pod,
                  const std::string& instance, bool named) {
  const kube::Reply reply = kube::send_request(
      through, {"POST", path, "application/json", pod, std::string("gpuguard-arm/") + GPUGUARD_VERSION, ""},
      kRequestTimeout);
  Probed probed{arming::probe_result(reply.status, reply.body, reply.warnings, reply.error, instance), ""};
  probed.waiting = probed.result.why;
  if (named) probed.result.why += " (through API server " + through.url() + ")";
  return probed;
}

// Why a pod the webhook did not answer, after `in_a_row` it did, stops the hook.
std::string missed_after_answers(int in_a_row, const std::string& probe_namespace, const std::string& why) {
  return "the webhook answered " + std::to_string(in_a_row) + " dry-run pod(s) in namespace " + probe_namespace +
         " in a row, then not the next: " + why +
         "; some of the API server's calls may not reach it (several API servers, one of which cannot), or the miss "
         "was passing (a rollout, a dropped connection)";
}

// True once a pod created as a server-side dry run in --probe-namespace comes back as the webhook answered it
// (or when there is no such flag); false, after saying why and recording it, at the deadline.
bool probe_webhook(const kube::ApiServer& api, const po::variables_map& flags,
                   std::chrono::steady_clock::time_point deadline, const Failure& failure) {
  if (flags.count("probe-namespace") == 0 || flags["probe-namespace"].as<std::string>().empty()) return true;
  const std::string probe_namespace = flags["probe-namespace"].as<std::string>();
  const std::string path = "/api/v1/namespaces/" + probe_namespace + "/pods?dryRun=All";
  // The webhook's --instance, as the chart passes it.
  const std::string instance = flags["namespace"].as<std::string>() + "/" + flags["deployment"].as<std::string>();
  const std::string pod = arming::probe_pod_json(flags["deployment"].as<std::string>() + "-arm-probe-",
                                                 flags["probe-image"].as<std::string>());
  const auto not_shown = [&](const std::string& why, const char* next) {
    log::error(std::string("the API server was not shown to call the webhook: ") + failure.left,
               {{"reason", why}, {"next", next}});
    record_failure(api, flags, failure, why);
    return false;
  };
  std::string why_no_targets;
  const std::vector<kube::ApiServer> targets = probe_targets(api, flags, why_no_targets);
  if (targets.empty()) {
    return not_shown(why_no_targets,
                     "let the hook's service account get EndpointSlice default/kubernetes (the chart's Role does), "
                     "or set webhook.armEachApiServer=false, then run helm upgrade again");
  }
  // Each API server answers kAnswersEachApiServer times in turn, and the run is at least kAnswersInARow long.
  const int answers_wanted = std::max<int>(kAnswersInARow, kAnswersEachApiServer * static_cast<int>(targets.size()));
  std::string last;
  std::string unheard;
  std::set<std::string> heard;  // replicas that named themselves; bounded by the answers, at most one a probe
  int in_a_row = 0;
  std::size_t turn = 0;
  for (;;) {
    const auto [result, waiting] =
        probe_once(targets[turn++ % targets.size()], path, pod, instance, flags["each-apiserver"].as<bool>());
    if (result.reached) {
      if (!result.replica.empty()) heard.insert(result.replica);
      if (++in_a_row >= answers_wanted) {
        const auto [now_unheard, refused] = unheard_replicas(api, flags, heard);
        if (refused) {
          return not_shown(now_unheard,
                           "let the hook's service account list EndpointSlices in its namespace (the "
                           "chart's Role does), then run helm upgrade again");
        }
        if (now_unheard.empty()) {
          log::info("the API server calls the webhook", {{"namespace", probe_namespace},
                                                         {"shown_by", result.why},
                                                         {"answers_in_a_row", in_a_row},
                                                         {"apiservers", targets.size()},
                                                         {"replicas_heard", heard.size()}});
          return true;
        }
        if (now_unheard != unheard)
          log::info("probing until each replica of the webhook answers",
                    {{"namespace", probe_namespace}, {"waiting", now_unheard}});
        unheard = now_unheard;
      }
      if (std::chrono::steady_clock::now() + kConfirm > deadline) {
        return not_shown(timed_out_answering(in_a_row, answers_wanted, unheard),
                         "run helm upgrade again, or give the hook a longer webhook.armTimeoutSeconds");
      }
      std::this_thread::sleep_for(kConfirm);
      continue;
    }
    if (in_a_row > 0) {
      // Once the webhook has answered, a pod it did not answer most likely shows an API server that does not
      // reach it. Retrying until a lucky run of answers would arm it all the same.
      return not_shown(missed_after_answers(in_a_row, probe_namespace, result.why),
                       "let every API server reach the webhook (docs/operations.md#install), then run helm upgrade "
                       "again: it probes anew");
    }
    if (waiting != last) {
      log::info("probing whether the API server calls the webhook",
                {{"namespace", probe_namespace}, {"waiting", result.why}});
      last = waiting;
    }
    if (std::chrono::steady_clock::now() + kPoll > deadline) {
      return not_shown("a pod created in namespace " + probe_namespace +
                           " as a server-side dry run did not come back as the webhook answers: " + result.why,
                       "let the API server reach the webhook's pods (docs/operations.md#install), then run helm "
                       "upgrade again");
    }
    std::this_thread::sleep_for(kPoll);
  }
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
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(flags["timeout"].as<unsigned>());
  const bool verify_only = flags["verify-only"].as<bool>();
  const Failure& failure = verify_only ? kNotReached : kNotArmed;
  if (!wait_for_replica(api, flags, deadline, failure)) {
    record_failure(api, flags, failure, "no replica of the webhook became available within --timeout");
    return 1;
  }
  if (!probe_webhook(api, flags, deadline, failure)) return 1;
  if (verify_only) {
    log::info("armed already, and the API server calls the webhook: nothing changed");
    return 0;
  }
  return arm_named(api, flags) ? 0 : 1;
}

}  // namespace gpuguard::webhook

// The decision of `gpuguard-webhook arm` (include/gpuguard/webhook/arming.hpp): JSON in, a JSON Patch out.
#include "gpuguard/webhook/arming.hpp"

#include "gpuguard/admission/review.hpp"
#include "gpuguard/k8s/json_fields.hpp"
#include "gpuguard/k8s/names.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace gpuguard::webhook::arming {
namespace {

using k8s::member;
using nlohmann::json;

std::optional<json> parse_object(std::string_view text) {
  json parsed = json::parse(text, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return std::nullopt;
  return parsed;
}

long long number_at(const json& object, const char* section, const char* key) {
  const auto found = object.find(section);
  if (found == object.end() || !found->is_object()) return 0;
  const auto value = found->find(key);
  return value != found->end() && value->is_number_integer() ? value->get<long long>() : 0;
}

// An EndpointSlice's endpoint that is ready: `ready` not false (absent is ready, as the API defines it). Walked
// by find(), not value(): a pointer through an array of the wrong shape throws parse_error.
bool endpoint_ready(const json& endpoint) {
  if (!endpoint.is_object()) return false;
  const json* conditions = member(endpoint, "conditions");
  const json* ready = conditions != nullptr ? member(*conditions, "ready") : nullptr;
  return ready == nullptr || *ready != false;
}

}  // namespace

bool is_deployment_name(std::string_view name) { return name.size() <= 63 && k8s::is_dns_subdomain(name); }

Availability deployment_availability(std::string_view deployment_json, bool rolled_out) {
  const auto deployment = parse_object(deployment_json);
  if (!deployment) return {false, "the Deployment is not a JSON object"};
  const long long available = number_at(*deployment, "status", "availableReplicas");
  const long long wanted = number_at(*deployment, "spec", "replicas");
  if (available < 1) {
    return {false, std::to_string(available) + " of " + std::to_string(wanted) + " replicas available"};
  }
  if (!rolled_out) return {true, ""};
  const long long generation = number_at(*deployment, "metadata", "generation");
  if (number_at(*deployment, "status", "observedGeneration") < generation) {
    return {false, "the Deployment's controller has not seen its generation " + std::to_string(generation) + " yet"};
  }
  const long long replicas = number_at(*deployment, "status", "replicas");
  const long long updated = number_at(*deployment, "status", "updatedReplicas");
  if (updated < replicas) {
    return {false, "a rollout is under way: " + std::to_string(updated) + " of " + std::to_string(replicas) +
                       " replicas run the current template"};
  }
  return {true, ""};
}

std::string metadata_uid(std::string_view object_json) {
  const auto object = parse_object(object_json);
  return object ? std::string(k8s::string_at(*object, {"metadata", "uid"})) : std::string();
}

Availability daemonset_rollout(std::string_view daemonset_json) {
  const auto daemonset = parse_object(daemonset_json);
  if (!daemonset) return {false, "the DaemonSet is not a JSON object"};
  const long long generation = number_at(*daemonset, "metadata", "generation");
  if (number_at(*daemonset, "status", "observedGeneration") < generation) {
    return {false, "the DaemonSet's controller has not seen its generation " + std::to_string(generation) + " yet"};
  }
  const long long desired = number_at(*daemonset, "status", "desiredNumberScheduled");
  const long long updated = number_at(*daemonset, "status", "updatedNumberScheduled");
  const long long ready = number_at(*daemonset, "status", "numberReady");
  if (updated < desired || ready < desired) {
    return {false, std::to_string(std::min(updated, ready)) + " of " + std::to_string(desired) + " nodes ready"};
  }
  return {true, ""};
}

std::string daemonset_pod_selector(std::string_view daemonset_json) {
  const auto daemonset = parse_object(daemonset_json);
  if (!daemonset) return "";
  const json* labels = member(*daemonset, "spec");
  if (labels != nullptr) labels = member(*labels, "selector");
  if (labels != nullptr) labels = member(*labels, "matchLabels");
  if (labels == nullptr || !labels->is_object()) return "";
  std::string selector;
  for (const auto& [key, value] : labels->items()) {
    if (!value.is_string()) return "";
    if (!selector.empty()) selector += ',';
    selector.append(key).append("=").append(value.get<std::string>());
  }
  return selector;
}

PodsNotReady pods_not_ready(std::string_view pod_list_json) {
  const auto list = parse_object(pod_list_json);
  PodsNotReady page;
  const json* items = list ? member(*list, "items") : nullptr;
  if (items == nullptr || !items->is_array()) {
    page.error = "not a PodList";
    return page;
  }
  const auto text = [](const json* object, const char* key) {
    const json* value = object != nullptr ? member(*object, key) : nullptr;
    return value != nullptr && value->is_string() ? value->get<std::string>() : std::string();
  };
  for (const json& pod : *items) {
    if (!pod.is_object()) continue;
    const json* status = member(pod, "status");
    const json* conditions = status != nullptr ? member(*status, "conditions") : nullptr;
    bool ready = false;
    if (conditions != nullptr && conditions->is_array()) {
      for (const json& condition : *conditions) {
        ready = ready ||
                (condition.is_object() && text(&condition, "type") == "Ready" && text(&condition, "status") == "True");
      }
    }
    if (ready) continue;
    const std::string node = text(member(pod, "spec"), "nodeName");
    page.where.push_back(node.empty() ? "pod " + text(member(pod, "metadata"), "name") + ", on no node" : node);
  }
  page.next = text(member(*list, "metadata"), "continue");
  return page;
}

Step webhook_step(std::string_view configuration_json, std::string_view webhook) {
  const auto configuration = parse_object(configuration_json);
  if (!configuration) return {std::nullopt, "the MutatingWebhookConfiguration is not a JSON object"};
  const auto webhooks = configuration->find("webhooks");
  if (webhooks != configuration->end() && webhooks->is_array()) {
    for (std::size_t i = 0; i < webhooks->size(); ++i) {
      const json& entry = (*webhooks)[i];
      if (!entry.is_object() || entry.value("name", "") != webhook) continue;
      if (entry.value("failurePolicy", "") == "Fail") return {};
      const std::string at = "/webhooks/" + std::to_string(i);
      return {json::array({{{"op", "test"}, {"path", at + "/name"}, {"value", webhook}},
                           {{"op", "replace"}, {"path", at + "/failurePolicy"}, {"value", "Fail"}}})
                  .dump(),
              ""};
    }
  }
  return {std::nullopt, "the MutatingWebhookConfiguration has no webhook named " + std::string(webhook)};
}

Step binding_step(std::string_view binding_json) {
  const auto binding = parse_object(binding_json);
  if (!binding) return {std::nullopt, "the ValidatingAdmissionPolicyBinding is not a JSON object"};
  const auto spec = binding->find("spec");
  if (spec != binding->end() && spec->is_object()) {
    const auto actions = spec->find("validationActions");
    if (actions != spec->end() && *actions == json::array({"Deny"})) return {};
  }
  // Deny alone: the API server refuses Deny together with Warn, and Audit adds nothing once pods are refused.
  return {json::array({{{"op", "add"}, {"path", "/spec/validationActions"}, {"value", json::array({"Deny"})}}}).dump(),
          ""};
}

// What the probe pod is sent with, as a CUDA image sets it; the webhook replaces it in a GPU-less container.
constexpr std::string_view kProbeVariable = "NVIDIA_VISIBLE_DEVICES";
constexpr const char* kProbeValue = "all";

// The probe pod tolerates every taint: with the chart's webhook.gpuNodeTaints, a pod that could land on a
// GPU node goes to the webhook entry the hook arms, and one that could not to another, at Ignore always; so
// the probe shows the entry it arms is called. A dry run, so nothing is scheduled.
std::string probe_pod_json(std::string_view generate_name, std::string_view image) {
  const json restricted = {{"runAsNonRoot", true},
                           {"runAsUser", 65532},
                           {"allowPrivilegeEscalation", false},
                           {"capabilities", {{"drop", json::array({"ALL"})}}},
                           {"seccompProfile", {{"type", "RuntimeDefault"}}}};
  const json resources = {{"cpu", "1m"}, {"memory", "1Mi"}};
  return json{{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"generateName", std::string(generate_name)},
                {"labels", {{"app.kubernetes.io/name", "gpuguard-arm-probe"}}},
                {"annotations", {{std::string(admission::kArmProbeAnnotation), "true"}}}}},
              {"spec",
               {{"automountServiceAccountToken", false},
                {"restartPolicy", "Never"},
                {"tolerations", json::array({{{"operator", "Exists"}}})},
                {"containers", json::array({{{"name", "probe"},
                                             {"image", std::string(image)},
                                             {"env", json::array({{{"name", kProbeVariable}, {"value", kProbeValue}}})},
                                             {"securityContext", restricted},
                                             {"resources", {{"requests", resources}, {"limits", resources}}}}})}}}}
      .dump();
}

namespace {

// A Warning header's text: `299 - "text"` (RFC 7234's warn-code, warn-agent and quoted-string, as the API
// server writes a warning), its escapes undone; nothing when the header is not of that form.
std::optional<std::string> warning_text(std::string_view header) {
  if (header.size() < 8 || header.substr(0, 4) != "299 ") return std::nullopt;
  const auto quote = header.find(" \"", 4);
  if (quote == std::string_view::npos || header.back() != '"' || header.size() < quote + 3) return std::nullopt;
  std::string text;
  const std::string_view quoted = header.substr(quote + 2, header.size() - quote - 3);
  for (std::size_t i = 0; i < quoted.size(); ++i) {
    if (quoted[i] == '\\' && i + 1 < quoted.size()) {
      text.push_back(quoted[++i]);
    } else if (quoted[i] == '"') {
      return std::nullopt;  // the quoted string ended before the header did
    } else {
      text.push_back(quoted[i]);
    }
  }
  return text;
}

// Why the API server refused the probe pod, in its words. A configuration error of a binding whose policy
// fails closed (the backstop's) refuses whatever the binding's validationActions, before arming too.
// kubernetes/kubernetes#130887: a kube-apiserver stops watching ConfigMaps as parameters for good once no
// binding of a policy parameterised by one is left for a second (an uninstall); one without
// kubernetes/kubernetes#134423 then finds none made afterwards.
std::string refusal_words(std::string_view error) {
  std::string why = "the API server refused the probe pod: " + std::string(error);
  if (error.find("failed to configure binding: no params found") != std::string_view::npos) {
    why +=
        " (the binding named finds no parameter: if it is the backstop's and the policy ConfigMap exists, this "
        "API server has stopped watching ConfigMaps as parameters, as a kube-apiserver does until it restarts "
        "once no binding of a policy parameterised by a ConfigMap is left for a second, "
        "kubernetes/kubernetes#130887: restart each API server)";
  }
  return why;
}

// Whether the answer is in the words only gpuguard's webhook uses, whichever release's (first), and what
// showed it or why not.
std::pair<bool, std::string> in_webhook_words(unsigned status, std::string_view body,
                                              const std::vector<std::string>& warnings, std::string_view error) {
  // What only gpuguard's webhook says of this pod (src/admission/decide.cpp; the unit test runs the admission
  // core on the probe pod in each mode to hold these to it), as the API server passes it on.
  constexpr std::string_view kReplaced = "NVIDIA_VISIBLE_DEVICES set in the pod was replaced with";
  constexpr std::string_view kAuditWarning = "would get NVIDIA_VISIBLE_DEVICES=";
  constexpr std::string_view kStrictDenial = "sets NVIDIA_VISIBLE_DEVICES itself, which policy mode strict does not";
  const auto warned = [&warnings](std::string_view first, std::string_view second) {
    return std::any_of(warnings.begin(), warnings.end(), [&](const std::string& warning) {
      return warning.find(first) != std::string::npos && warning.find(second) != std::string::npos;
    });
  };
  if (status == 0) return {false, "no answer from the API server: " + std::string(error)};
  if (status < 200 || status >= 300) {
    if (error.find("admission webhook \"") != std::string_view::npos &&
        error.find(kStrictDenial) != std::string_view::npos) {
      return {true, "the webhook refused the probe pod for setting " + std::string(kProbeVariable) +
                        " itself (policy mode strict): the API server called it"};
    }
    return {false, refusal_words(error)};
  }
  const auto pod = parse_object(body);
  const json* containers = nullptr;
  if (pod) {
    const auto spec = pod->find("spec");
    if (spec != pod->end() && spec->is_object()) {
      const auto found = spec->find("containers");
      if (found != spec->end() && found->is_array()) containers = &*found;
    }
  }
  if (containers == nullptr) return {false, "the API server's answer is not a pod with containers"};
  // The container's value is the last entry of that name, as the kubelet reads a list that names it twice;
  // absent: removed, which the webhook never does.
  std::optional<std::string> value;
  for (const json& container : *containers) {
    const auto env = container.is_object() ? container.find("env") : container.end();
    if (!container.is_object() || env == container.end() || !env->is_array()) continue;
    for (const json& variable : *env) {
      if (variable.is_object() && variable.value("name", "") == kProbeVariable) {
        const auto found = variable.find("value");
        value = found != variable.end() && found->is_string() ? found->get<std::string>() : std::string();
      }
    }
  }
  const std::string sent = std::string(kProbeVariable) + "=" + kProbeValue;
  // Replaced, and the webhook's warning that it replaced it: a policy engine that overwrites the variable
  // (a merge by name, an appended entry) changes the value but says nothing of the kind.
  if (value && *value != kProbeValue && warned(kReplaced, "")) {
    return {true, "the probe pod, sent with " + sent + ", came back with " + std::string(kProbeVariable) + "=" +
                      *value + " and the webhook's warning that it replaced it: the API server called the webhook"};
  }
  // The webhook's own audit warning ("audit: container \"probe\" would get NVIDIA_VISIBLE_DEVICES=none"),
  // not the backstop's, which warns about the same pod when the webhook was not heard (Warn until armed).
  if (warned("audit: ", kAuditWarning)) {
    return {true, "the webhook warned about the probe pod (policy mode audit): the API server called it"};
  }
  // Policy mode off changes nothing and says nothing, but of the probe pod alone (admission/review.hpp).
  if (warned(admission::kArmProbeModeOffWarning, "")) {
    return {true, "the webhook said it admits the probe pod as sent (policy mode off): the API server called it"};
  }
  const std::string not_called =
      " and without the webhook's warning: the API server did not call the webhook for it, or the call failed and "
      "failurePolicy Ignore admitted the pod (a NetworkPolicy or CNI rule that does not let the API server in, a "
      "caBundle that does not match the serving certificate, the probe namespace left out by the webhook's "
      "namespaceSelector)";
  if (!value)
    return {false, "the probe pod came back without " + std::string(kProbeVariable) + ", which it was sent with," +
                       not_called};
  if (*value == kProbeValue) return {false, "the probe pod came back with " + sent + ", as sent," + not_called};
  return {false, "the probe pod, sent with " + sent + ", came back with " + std::string(kProbeVariable) + "=" + *value +
                     " but without the webhook's warning that it replaced it: another mutating webhook or policy sets "
                     "the variable in the probe namespace, before gpuguard's (which then finds nothing to replace) or "
                     "after it, so the API server was not shown to call gpuguard's; name a probe namespace that it "
                     "leaves alone (webhook.armProbeNamespace)"};
}

}  // namespace

std::string replica_identity(std::string_view instance, std::string_view replica) {
  return std::string(instance) + " replica " + std::string(replica);
}

ProbeResult probe_result(unsigned status, std::string_view body, const std::vector<std::string>& warnings,
                         std::string_view error, std::string_view instance) {
  auto [reached, why] = in_webhook_words(status, body, warnings, error);
  ProbeResult result{reached, std::move(why), ""};
  if (!result.reached) return result;
  // This release's webhook, by the name it says (a refusal's warnings come back with it too): another
  // release's webhook, or another mutator, answers in the same words but not this name. A replica that
  // names its pod says the name after it.
  const std::string named = admission::arm_probe_warning(instance);
  const std::string replica_named = admission::arm_probe_warning(replica_identity(instance, ""));
  const auto answered_by = std::find_if(warnings.begin(), warnings.end(), [&](const std::string& warning) {
    const std::optional<std::string> text = warning_text(warning);
    if (!text) return false;
    if (*text == named) return true;
    const std::string_view text_view(*text);
    return text_view.substr(0, replica_named.size()) == replica_named &&
           is_deployment_name(text_view.substr(replica_named.size()));
  });
  if (answered_by != warnings.end()) {
    const std::string text = *warning_text(*answered_by);
    result.replica = text.size() > named.size() ? text.substr(replica_named.size()) : std::string();
    return result;
  }
  std::string others;
  for (const std::string& warning : warnings) {
    if (warning.find("arm probe answered by gpuguard webhook ") != std::string::npos) {
      others.append(others.empty() ? "" : ", ").append(warning);
    }
  }
  const std::string whose =
      others.empty() ? std::string(
                           ", nor any name: a gpuguard webhook that says none answered (another release's, "
                           "older, or one run without --instance)")
                     : " but \"" + others +
                           "\": another gpuguard webhook answered, not this release's (name a probe namespace only "
                           "this release's webhook covers: webhook.armProbeNamespace)";
  return {false,
          "the probe pod came back in a gpuguard webhook's words, without the warning \"" + named +
              "\" that this release's webhook adds" + whose,
          ""};
}

ReadyReplicas ready_replicas(std::string_view endpoint_slices_json) {
  const auto list = parse_object(endpoint_slices_json);
  if (!list || !list->contains("items") || !(*list)["items"].is_array()) {
    return {{}, "the EndpointSliceList has no items"};
  }
  std::set<std::string> names;
  for (const json& slice : (*list)["items"]) {
    const auto endpoints = slice.is_object() ? slice.find("endpoints") : slice.end();
    if (!slice.is_object() || endpoints == slice.end() || !endpoints->is_array()) continue;  // none: null
    for (const json& endpoint : *endpoints) {
      if (!endpoint_ready(endpoint)) continue;
      const json* target = member(endpoint, "targetRef");
      const json* kind = target != nullptr ? member(*target, "kind") : nullptr;
      const json* name = target != nullptr ? member(*target, "name") : nullptr;
      if (kind != nullptr && *kind == "Pod" && name != nullptr && name->is_string() &&
          !name->get<std::string>().empty()) {
        names.insert(name->get<std::string>());
        continue;
      }
      const auto addresses = endpoint.find("addresses");
      const bool addressed =
          addresses != endpoint.end() && addresses->is_array() && !addresses->empty() && addresses->front().is_string();
      names.insert("address " + (addressed ? addresses->front().get<std::string>() : std::string("unknown")));
    }
  }
  return {{names.begin(), names.end()}, ""};
}

ApiServers api_servers(std::string_view endpoint_slice_json, std::string_view verified_host) {
  const auto slice = parse_object(endpoint_slice_json);
  if (!slice) return {{}, "the EndpointSlice is not a JSON object"};
  // The family the verified host is of: only such an address can present a certificate for it and be reached
  // as the Service is (a name: either).
  const bool v6 = verified_host.find(':') != std::string_view::npos;
  const bool v4 =
      !v6 && !verified_host.empty() && verified_host.find_first_not_of("0123456789.") == std::string_view::npos;
  const json* type = member(*slice, "addressType");
  if (type == nullptr || !type->is_string() || (*type != "IPv4" && *type != "IPv6")) {
    return {{}, "the EndpointSlice's addressType is not IPv4 or IPv6"};
  }
  if ((v4 && *type != "IPv4") || (v6 && *type != "IPv6")) {
    return {{}, "the EndpointSlice is of another address family than " + std::string(verified_host)};
  }
  const json* endpoints = member(*slice, "endpoints");
  if (endpoints == nullptr || !endpoints->is_array() || endpoints->empty()) return {{}, ""};  // none: null
  // The https port, or the only one (the kubernetes Service has one, named https).
  std::string port;
  const json* ports = member(*slice, "ports");
  if (ports != nullptr && ports->is_array()) {
    for (const json& entry : *ports) {
      const json* number = entry.is_object() ? member(entry, "port") : nullptr;
      if (number == nullptr || !number->is_number_integer()) continue;
      const long long value = number->get<long long>();
      if (value < 1 || value > 65535) continue;
      const json* name = member(entry, "name");
      if ((name != nullptr && *name == "https") || ports->size() == 1) port = std::to_string(value);
    }
  }
  if (port.empty()) return {{}, "the EndpointSlice has no https port"};
  std::set<ApiServerAddress> found;
  for (const json& endpoint : *endpoints) {
    if (!endpoint_ready(endpoint)) continue;
    const json* addresses = member(endpoint, "addresses");
    if (addresses == nullptr || !addresses->is_array() || addresses->empty() || !addresses->front().is_string() ||
        addresses->front().get<std::string>().empty()) {
      return {{}, "a ready endpoint of the EndpointSlice has no address"};
    }
    found.insert({addresses->front().get<std::string>(), port});
    if (found.size() > kMostApiServers) {
      return {{}, "the EndpointSlice lists more than " + std::to_string(kMostApiServers) + " API servers"};
    }
  }
  return {{found.begin(), found.end()}, ""};
}

}  // namespace gpuguard::webhook::arming

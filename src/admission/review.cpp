#include "gpuguard/admission/review.hpp"

#include <simdjson.h>

#include <algorithm>

#include "decide.hpp"
#include "decode.hpp"
#include "encode.hpp"

namespace gpuguard::admission {
namespace {

// A simdjson parser keeps buffers sized for the largest document it has seen. Each thread keeps one
// for the usual few-KiB reviews; rare large ones (over kReusableParserLimit) get a parser of their own so
// memory does not stay high.
dom::parser& reusable_parser() {
  thread_local dom::parser parser;
  return parser;
}

// Decodes the body with a parser sized for it and hands the Review to `use`; a decode error becomes
// `error` instead.
template <typename Use>
bool with_review(std::string& body, std::string& error, Use&& use) {
  const std::size_t length = body.size();
  body.reserve(length + simdjson::SIMDJSON_PADDING);
  const simdjson::padded_string_view json(body.data(), length, body.capacity());
  try {
    dom::parser large_document_parser;  // allocates nothing until used
    dom::parser& parser = length <= kReusableParserLimit ? reusable_parser() : large_document_parser;
    use(decode_review(parser, json));
    return true;
  } catch (const DecodeError& e) {
    error = e.what();
  }
  return false;
}

std::string_view door_name(Finding::Kind kind) {
  switch (kind) {
    case Finding::Kind::image_default: return "image default";
    case Finding::Kind::user_value: return "user value";
    case Finding::Kind::gpu_user_value: return "user value in a GPU container";
    case Finding::Kind::env_from: return "envFrom in a GPU container";
    case Finding::Kind::privileged: return "privileged";
    case Finding::Kind::host_device_mount: return "host device mount";
    case Finding::Kind::cdi_annotation: return "CDI annotation";
    case Finding::Kind::runtime_class: return "runtime class";
    case Finding::Kind::nvidia_cdi_annotation: return "NVIDIA CDI annotation";
    case Finding::Kind::feature_env_var: return "feature variable";
    case Finding::Kind::unresolved_claim: break;
  }
  return "unresolved DRA claim";
}

std::string_view action_text(policy::Action action) {
  switch (action) {
    case policy::Action::allow: return "nothing (allowed by the policy)";
    case policy::Action::warn: return "warns";
    case policy::Action::deny: break;
  }
  return "denies the pod";
}

// What the webhook does about a finding under the policy in force.
std::string webhook_action(const Finding& finding, const policy::Policy& policy, bool exempt) {
  using Kind = Finding::Kind;
  using policy::Mode;
  if (policy.mode == Mode::off) return "nothing (mode off)";
  if (exempt) return "nothing (exempt namespace or service account)";
  if (policy.mode == Mode::audit) return "warns only (mode audit)";
  const bool strict = policy.mode == Mode::strict;
  switch (finding.kind) {
    case Kind::image_default: return "sets " + policy.visible_devices_value;
    case Kind::user_value: return strict ? "denies the pod" : "replaces it with " + policy.visible_devices_value;
    case Kind::gpu_user_value:
      if (strict) return "denies the pod";
      return policy.strip_user_value_from_gpu_containers ? "removes it"
                                                         : "nothing (stripUserValueFromGpuContainers off)";
    case Kind::env_from: return strict ? "denies the pod" : "warns";
    case Kind::privileged: return std::string(action_text(policy.privileged));
    case Kind::host_device_mount: return std::string(action_text(policy.host_device_mounts));
    case Kind::cdi_annotation: return std::string(action_text(policy.cdi_annotations));
    case Kind::runtime_class: return std::string(action_text(policy.runtime_class_action));
    case Kind::nvidia_cdi_annotation: return std::string(action_text(policy.nvidia_cdi_annotations));
    case Kind::feature_env_var: return std::string(action_text(policy.feature_env_vars));
    case Kind::unresolved_claim: break;
  }
  return "sets " + policy.visible_devices_value + " and warns";
}

}  // namespace

std::string arm_probe_warning(std::string_view instance) {
  // Whole, not cut at 120 characters: two names that began alike would be cut alike. A namespace and a
  // Deployment of at most 63 each keep it under the 256 the API server may cut a warning to.
  return "arm probe answered by gpuguard webhook " + std::string(instance);
}

ReviewOutcome review(std::string body, const policy::Policy& policy, const ClaimLookup* claims,
                     std::string_view instance) {
  ReviewOutcome outcome;
  outcome.ok = with_review(body, outcome.body, [&](const Review& request) {
    Decision decision = decide(request, policy, claims);
    // Said whatever was decided, a refusal included (the API server passes a refusing webhook's warnings on).
    if (!instance.empty() && std::any_of(request.pod.annotations.begin(), request.pod.annotations.end(),
                                         [](const Annotation& a) { return a.key == kArmProbeAnnotation; })) {
      if (policy.mode == policy::Mode::off) decision.warnings.emplace_back(kArmProbeModeOffWarning);
      decision.warnings.push_back(arm_probe_warning(instance));
      outcome.arm_probe = true;
    }
    outcome.body = encode_response(request, decision, policy);
    outcome.uid = std::string(request.uid);
    outcome.operation = std::string(request.operation);
    outcome.allowed = decision.allowed;
    outcome.denial = decision.denial;
    outcome.patched = !decision.patch.empty();
    outcome.warnings = decision.warnings.size();
    outcome.doors = decision.doors;
    for (Mutation mutation : decision.mutations) ++outcome.mutations[static_cast<std::size_t>(mutation)];
  });
  return outcome;
}

Examination examine(std::string body, const policy::Policy& policy, const ClaimLookup* claims) {
  Examination examination;
  examination.ok = with_review(body, examination.error, [&](Review request) {
    // Every door, as enforce finds it; a mirror pod is a static pod, which the webhook never sees.
    policy::Policy finding_all = policy;
    if (finding_all.mode == policy::Mode::off || finding_all.mode == policy::Mode::audit) {
      finding_all.mode = policy::Mode::enforce;
    }
    finding_all.exempt_namespaces.clear();
    finding_all.exempt_service_accounts.clear();
    const bool mirror = request.pod.mirror;
    request.pod.mirror = false;
    const Decision decision = decide(request, finding_all, claims);
    const bool exempt = policy.is_exempt(request.namespace_, request.pod.service_account);
    examination.exempt = exempt;
    examination.mirror = mirror;
    for (const Container* c : decision.gpu_less) {
      examination.gpu_less.push_back({std::string(c->name), std::string(names_of(c->list).field)});
    }
    for (const Finding& finding : decision.findings) {
      examination.exposures.push_back({std::string(finding.container->name),
                                       std::string(names_of(finding.container->list).field),
                                       std::string(door_name(finding.kind)), finding.detail,
                                       mirror ? "nothing (a static pod: the apiserver only sees its mirror)"
                                              : webhook_action(finding, policy, exempt)});
    }
  });
  return examination;
}

}  // namespace gpuguard::admission

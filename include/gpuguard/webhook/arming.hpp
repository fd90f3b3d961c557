#pragma once
// Arming: the install turns the objects that refuse pods on only once the webhook can answer. The chart
// installs the webhook configuration at failurePolicy Ignore and the backstop's binding at Warn and
// Audit; `gpuguard-webhook arm` (a post-install hook) waits until a replica of the webhook is available,
// then patches them to Fail and Deny. This is its decision, pure: the objects as the API serves them in,
// what to do out, so that a first install whose image cannot be pulled refuses no pod anywhere.
#include <optional>
#include <string>
#include <string_view>

namespace gpuguard::webhook::arming {

// Whether a Deployment (its JSON) has a replica available to answer; `waiting` says what is missing.
struct Availability {
  bool available = false;
  std::string waiting;  // "0 of 3 replicas available", "the Deployment is not there yet", ...
};
Availability deployment_availability(std::string_view deployment_json);

// What to send to arm one object: a JSON Patch (RFC 6902) for application/json-patch+json, nothing when it
// is armed already, or the reason it cannot be armed (not JSON, no webhook of that name).
struct Step {
  std::optional<std::string> patch;  // absent: armed already (or `error`)
  std::string error;
};
// failurePolicy Fail on the webhook named `webhook` of a MutatingWebhookConfiguration; the patch tests
// the webhook's name at its index first, so a configuration changed meanwhile is not patched blindly.
Step webhook_step(std::string_view configuration_json, std::string_view webhook);
// validationActions [Deny] on a ValidatingAdmissionPolicyBinding.
Step binding_step(std::string_view binding_json);

}  // namespace gpuguard::webhook::arming

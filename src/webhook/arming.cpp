// The decision of `gpuguard-webhook arm` (include/gpuguard/webhook/arming.hpp): JSON in, a JSON Patch out.
#include "gpuguard/webhook/arming.hpp"

#include <nlohmann/json.hpp>

namespace gpuguard::webhook::arming {
namespace {

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

}  // namespace

Availability deployment_availability(std::string_view deployment_json) {
  const auto deployment = parse_object(deployment_json);
  if (!deployment) return {false, "the Deployment is not a JSON object"};
  const long long available = number_at(*deployment, "status", "availableReplicas");
  const long long wanted = number_at(*deployment, "spec", "replicas");
  if (available >= 1) return {true, ""};
  return {false, std::to_string(available) + " of " + std::to_string(wanted) + " replicas available"};
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

}  // namespace gpuguard::webhook::arming

#include "encode.hpp"

#include <nlohmann/json.hpp>

#include "gpuguard/admission/base64.hpp"

namespace gpuguard::admission {
namespace {

std::string_view op_name(PatchOperation::Op op) {
  switch (op) {
    case PatchOperation::Op::add: return "add";
    case PatchOperation::Op::replace: return "replace";
    case PatchOperation::Op::remove: break;
  }
  return "remove";
}

}  // namespace

std::string encode_patch(const Decision& decision, const Policy& policy) {
  const nlohmann::json entry = {{"name", kVisibleDevices}, {"value", policy.visible_devices_value}};
  nlohmann::json patch = nlohmann::json::array();
  for (const PatchOperation& operation : decision.patch) {
    nlohmann::json op = {{"op", op_name(operation.op)}, {"path", operation.path}};
    if (operation.value == PatchOperation::Value::env_entry) op["value"] = entry;
    if (operation.value == PatchOperation::Value::env_array) op["value"] = nlohmann::json::array({entry});
    patch.push_back(std::move(op));
  }
  return patch.dump();
}

std::string encode_response(const Review& review, const Decision& decision, const Policy& policy) {
  nlohmann::json response = {{"uid", review.uid}, {"allowed", true}};
  if (!decision.patch.empty()) {
    response["patchType"] = "JSONPatch";
    response["patch"] = base64_encode(encode_patch(decision, policy));
  }
  if (!decision.warnings.empty()) response["warnings"] = decision.warnings;
  const nlohmann::json envelope = {
      {"apiVersion", review.api_version}, {"kind", "AdmissionReview"}, {"response", std::move(response)}};
  // Replace, not throw, on invalid UTF-8: simdjson has validated the input, but a response must never fail.
  return envelope.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace gpuguard::admission

// Responses are written directly rather than built as a nlohmann DOM: the shape is fixed and small, and
// building it through a DOM cost more instructions than decoding the whole review (docs/architecture.md).
#include "encode.hpp"

#include "gpuguard/admission/base64.hpp"

namespace gpuguard::admission {
namespace {

// Strings here come from simdjson-validated input (so valid UTF-8) or from our own ASCII text.
void append_json_string(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  std::size_t run_start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(text, run_start, i - run_start);
    run_start = i + 1;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  out.append(text, run_start, text.size() - run_start);
  out += '"';
}

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
  std::string entry = "{\"name\":";
  append_json_string(entry, kVisibleDevices);
  entry += ",\"value\":";
  append_json_string(entry, policy.visible_devices_value);
  entry += '}';

  std::string patch = "[";
  patch.reserve(decision.patch.size() * (64 + entry.size()));  // an operation with its path and value
  for (const PatchOperation& operation : decision.patch) {
    if (patch.size() > 1) patch += ',';
    patch += "{\"op\":\"";
    patch += op_name(operation.op);
    patch += "\",\"path\":";
    append_json_string(patch, operation.path);
    if (operation.value == PatchOperation::Value::env_entry) {
      patch += ",\"value\":";
      patch += entry;
    } else if (operation.value == PatchOperation::Value::env_array) {
      patch += ",\"value\":[";
      patch += entry;
      patch += ']';
    }
    patch += '}';
  }
  patch += ']';
  return patch;
}

std::string encode_response(const Review& review, const Decision& decision, const Policy& policy) {
  const std::string patch = decision.patch.empty() ? std::string() : base64_encode(encode_patch(decision, policy));
  std::string out;
  out.reserve(256 + patch.size());
  out += "{\"apiVersion\":";
  append_json_string(out, review.api_version);
  out += ",\"kind\":\"AdmissionReview\",\"response\":{\"uid\":";
  append_json_string(out, review.uid);
  if (decision.allowed) {
    out += ",\"allowed\":true";
  } else {
    out += ",\"allowed\":false,\"status\":{\"code\":403,\"reason\":\"Forbidden\",\"message\":";
    append_json_string(out, decision.denial);
    out += '}';
  }
  if (!decision.patch.empty()) {
    out += ",\"patchType\":\"JSONPatch\",\"patch\":\"";
    out += patch;
    out += '"';
  }
  if (!decision.warnings.empty()) {
    out += ",\"warnings\":[";
    for (std::size_t i = 0; i < decision.warnings.size(); ++i) {
      if (i > 0) out += ',';
      append_json_string(out, decision.warnings[i]);
    }
    out += ']';
  }
  if (!decision.audit_annotations.empty()) {
    out += ",\"auditAnnotations\":{";
    bool first = true;
    for (const auto& [key, value] : decision.audit_annotations) {
      if (!first) out += ',';
      first = false;
      append_json_string(out, key);
      out += ':';
      append_json_string(out, value);
    }
    out += '}';
  }
  out += "}}";
  return out;
}

}  // namespace gpuguard::admission

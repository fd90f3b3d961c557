// Responses are written directly rather than built as a nlohmann DOM: the shape is fixed and small, and
// building it through a DOM cost more instructions than decoding the whole review (docs/architecture.md).
#include "encode.hpp"

#include <charconv>
#include <iterator>

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

void append_number(std::string& out, std::size_t number) {
  char digits[24];
  const auto [end, ec] = std::to_chars(std::begin(digits), std::end(digits), number);
  out.append(digits, end);
}

// "/spec/containers/2/env/-": field names and numbers only, so nothing in a path needs escaping.
void append_path(std::string& out, const PatchOperation& operation) {
  using Target = PatchOperation::Target;
  out += "\"/spec/";
  out += names_of(operation.container->list).field;
  out += '/';
  append_number(out, operation.container->index);
  out += "/env";
  if (operation.target == Target::env_end) out += "/-";
  if (operation.target == Target::env_entry) {
    out += '/';
    append_number(out, operation.entry);
  }
  out += '"';
}

void append_injected_entry(std::string& out, const Policy& policy) {
  out += "{\"name\":";
  append_json_string(out, kVisibleDevices);
  out += ",\"value\":";
  append_json_string(out, policy.visible_devices_value);
  out += '}';
}

}  // namespace

void encode_patch(const Decision& decision, const Policy& policy, std::string& out) {
  out.clear();
  out += '[';
  for (const PatchOperation& operation : decision.patch) {
    if (out.size() > 1) out += ',';
    out += "{\"op\":\"";
    out += op_name(operation.op);
    out += "\",\"path\":";
    append_path(out, operation);
    if (operation.value == PatchOperation::Value::env_entry) {
      out += ",\"value\":";
      append_injected_entry(out, policy);
    } else if (operation.value == PatchOperation::Value::env_array) {
      out += ",\"value\":[";
      append_injected_entry(out, policy);
      out += ']';
    }
    out += '}';
  }
  out += ']';
}

std::string encode_response(const Review& review, const Decision& decision, const Policy& policy) {
  // The patch text lives only until it is base64-encoded into the response, so each thread reuses one.
  thread_local std::string patch;
  if (!decision.patch.empty()) encode_patch(decision, policy, patch);
  std::string out;
  out.reserve(256 + (decision.patch.empty() ? 0 : (patch.size() + 2) / 3 * 4) +
              decision.warnings.size() * (kMaxWarningLength + 4));
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
    base64_encode(patch, out);
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

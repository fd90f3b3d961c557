// libFuzzer target: AdmissionReview bytes -> admission::review(). Besides "no crash, no sanitizer
// finding", it asserts the properties the apiserver relies on: a response is valid JSON echoing the uid,
// and a patch applies to the object it was computed for and is idempotent on reinvocation.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "gpuguard/admission/base64.hpp"
#include "gpuguard/admission/review.hpp"

using nlohmann::json;
using namespace gpuguard::admission;
using gpuguard::policy::Policy;

namespace {

[[noreturn]] void violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "property violated: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Policy policy;
  const std::string body(reinterpret_cast<const char*>(data), size);
  const ReviewOutcome outcome = review(body, policy);
  if (!outcome.ok) return 0;

  const json response = json::parse(outcome.body, nullptr, false);
  if (response.is_discarded()) violated("response is JSON", outcome.body);
  if (response["response"]["uid"] != outcome.uid) violated("uid echoed", outcome.body);
  if (!outcome.patched) return 0;
  if (response["response"]["patchType"] != "JSONPatch") violated("patchType with patch", outcome.body);

  json document = json::parse(body, nullptr, false);
  if (document.is_discarded()) return 0;  // valid for simdjson, not for nlohmann: nothing to apply to
  const auto patch_text = base64_decode(response["response"]["patch"].get<std::string>());
  if (!patch_text) violated("patch is base64", outcome.body);
  json patched;
  try {
    patched = document["request"]["object"].patch(json::parse(*patch_text));
  } catch (const std::exception& e) {
    violated("patch applies to its object", std::string(e.what()) + " / " + *patch_text);
  }
  document["request"]["object"] = patched;
  const ReviewOutcome again = review(document.dump(), policy);
  if (!again.ok) violated("the patched review is still valid", again.body);
  if (again.patched) violated("reinvocation gives no patch", again.body);
  return 0;
}

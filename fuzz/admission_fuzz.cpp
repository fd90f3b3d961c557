// libFuzzer target: AdmissionReview bytes -> admission::review(). Besides "no crash, no sanitizer
// finding", it asserts the properties the apiserver relies on: a response is valid JSON echoing the uid,
// and a patch applies to the object it was computed for and is idempotent on reinvocation. The same bytes
// go to the arm hook's readings of what the API server sends back (webhook::arming): never a throw, the
// ready replicas sorted and once each, the API servers to probe sorted, once each and bounded, and a replica
// heard only by a pod's name; and to the admission switches' namespace store as a watched Namespace
// (webhook::IgnoredNamespaces): added then deleted leaves nothing counted, and what it counts agrees with
// nlohmann's reading of every document nlohmann accepts.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "gpuguard/admission/base64.hpp"
#include "gpuguard/admission/review.hpp"
#include "gpuguard/kube/store.hpp"
#include "gpuguard/webhook/admission_switches.hpp"
#include "gpuguard/webhook/arming.hpp"

using nlohmann::json;
using namespace gpuguard::admission;
using gpuguard::policy::Policy;

namespace {

[[noreturn]] void violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "property violated: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_arming(const std::string& body) {
  namespace arming = gpuguard::webhook::arming;
  const arming::ReadyReplicas ready = arming::ready_replicas(body);
  if (!std::is_sorted(ready.names.begin(), ready.names.end()) ||
      std::adjacent_find(ready.names.begin(), ready.names.end()) != ready.names.end()) {
    violated("ready replicas sorted, once each", body);
  }
  if (std::any_of(ready.names.begin(), ready.names.end(), [](const std::string& name) { return name.empty(); })) {
    violated("no ready replica without a name", body);
  }
  // The bytes as the kubernetes Service's endpoints: API servers sorted, once each, bounded, each with an
  // address and a port; none with an error.
  const arming::ApiServers servers = arming::api_servers(body, "10.96.0.1");
  if (!std::is_sorted(servers.addresses.begin(), servers.addresses.end()) ||
      std::adjacent_find(servers.addresses.begin(), servers.addresses.end()) != servers.addresses.end() ||
      servers.addresses.size() > arming::kMostApiServers || (!servers.error.empty() && !servers.addresses.empty())) {
    violated("API servers sorted, once each, bounded, none with an error", body);
  }
  for (const arming::ApiServerAddress& server : servers.addresses) {
    if (server.host.empty() || server.port.empty() || std::stoi(server.port) < 1 || std::stoi(server.port) > 65535) {
      violated("an API server with an address and a port", body);
    }
  }
  // The bytes as the answered pod, and as the name a replica says (the API server passes warnings on as sent).
  const std::string said = body.substr(0, 96);
  const arming::ProbeResult result = arming::probe_result(
      201, body,
      {"299 - " +
       json(arming::replica_identity("ns/webhook", said)).dump(-1, ' ', false, json::error_handler_t::replace)},
      "", "ns/webhook");
  if (!result.replica.empty() && (!result.reached || !arming::is_deployment_name(result.replica))) {
    violated("a replica heard only by a pod's name", result.replica);
  }
}

void check_ignored_namespace(const std::string& body) {
  gpuguard::webhook::IgnoredNamespaces store;
  const gpuguard::kube::PaddedText text(body);
  store.apply("ADDED", text.view());
  const auto counts = store.counts();
  if (counts.break_glass + counts.other > 1) violated("one namespace counted once", body);
  const json document = json::parse(body, nullptr, false);
  // Compared where both read the same keys and the same text: no escapes (simdjson matches a key as written,
  // nlohmann as unescaped; the API server writes these keys unescaped), each key once (nlohmann keeps the
  // last duplicate, simdjson finds the first); and where both read the text whole, which the API server's
  // always is: no byte order mark before it (nlohmann skips one, simdjson refuses the text, so the store
  // counts nothing; RFC 8259 forbids adding one), no NUL byte (nlohmann ends the text at the first, simdjson
  // reads on and refuses what follows), and fewer brackets than simdjson's depth limit (1,024), which
  // nlohmann has not. Such texts come from no API server.
  const auto once = [&body](const char* key) { return body.find(key) == body.rfind(key); };
  const bool marked = body.rfind("\xEF\xBB\xBF", 0) == 0;
  if (marked && counts.break_glass + counts.other != 0) violated("a text after a byte order mark counts nothing", body);
  const bool read_alike = !marked && body.find('\0') == std::string::npos &&
                          std::count_if(body.begin(), body.end(), [](char c) { return c == '[' || c == '{'; }) < 1000;
  if (!document.is_discarded() && read_alike && body.find('\\') == std::string::npos &&
      once("\"gpuguard.io/ignore\"") && once("\"metadata\"") && once("\"name\"") && once("\"labels\"")) {
    const json* name = document.is_object() && document.contains("metadata") && document["metadata"].is_object() &&
                               document["metadata"].contains("name")
                           ? &document["metadata"]["name"]
                           : nullptr;
    const json* labels = name && document["metadata"].contains("labels") ? &document["metadata"]["labels"] : nullptr;
    const json* value = labels && labels->is_object() && labels->contains("gpuguard.io/ignore")
                            ? &(*labels)["gpuguard.io/ignore"]
                            : nullptr;
    const bool counted = name && name->is_string() && !name->get<std::string>().empty() && value && value->is_string();
    const bool break_glass = counted && value->get<std::string>() == "break-glass";
    if (counts.break_glass != (break_glass ? 1u : 0u) || counts.other != (counted && !break_glass ? 1u : 0u)) {
      violated("counted as nlohmann reads it", body);
    }
  }
  store.apply("DELETED", text.view());
  if (store.counts().break_glass + store.counts().other != 0) violated("added then deleted leaves nothing", body);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Policy policy;
  const std::string body(reinterpret_cast<const char*>(data), size);
  check_arming(body);
  check_ignored_namespace(body);
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

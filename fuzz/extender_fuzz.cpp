// libFuzzer target: bytes as an ExtenderArgs body, as a watched Pod, and as a watch stream. Besides "no
// crash, no sanitizer finding", it asserts what kube-scheduler and the cache rely on: a 200 answer is
// JSON of the right shape with a score from 0 to 10 for every node asked about, a pod added and then
// deleted leaves the cache as it was, and the cache's On-Demand reader agrees with the DOM reader on every
// document nlohmann accepts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "gpuguard/extender/cluster_state.hpp"
#include "gpuguard/extender/scheduling.hpp"
#include "gpuguard/kube/json_object_splitter.hpp"
#include "gpuguard/kube/store.hpp"

using nlohmann::json;
using namespace gpuguard;

namespace {

[[noreturn]] void violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "property violated: %s: %s\n", what, detail.substr(0, 500).c_str());
  std::abort();
}

void list(kube::Store& store, std::initializer_list<const char*> objects) {
  store.list_begin();
  for (const char* object : objects) store.list_item(kube::PaddedText(object).view());
  store.list_end(true);
}

extender::ClusterState& cluster() {
  static extender::ClusterState state;
  static const bool filled = [] {
    list(state.nodes(), {R"({"metadata":{"name":"n1"},"status":{"allocatable":{"nvidia.com/gpu":"2"}}})",
                         R"({"metadata":{"name":"n2"},"status":{"allocatable":{"nvidia.com/gpu":"4"}}})"});
    list(state.pods(), {R"({"metadata":{"uid":"a"},"spec":{"nodeName":"n1","containers":[
                         {"resources":{"limits":{"nvidia.com/gpu":"1"}}}]},"status":{"phase":"Running"}})"});
    return true;
  }();
  (void)filled;
  return state;
}

void check_verbs(const std::string& body) {
  static const policy::Policy policy;
  const auto filtered = extender::filter(body, cluster(), policy, true);
  if (filtered.status == 400) return;
  if (filtered.status != 200) violated("filter status", std::to_string(filtered.status));
  const json result = json::parse(filtered.body, nullptr, false);
  if (!result.is_object() || !result["FailedNodes"].is_object() || !result["Error"].is_string()) {
    violated("filter result shape", filtered.body);
  }
  const auto prioritized = extender::prioritize(body, cluster(), policy, true);
  if (prioritized.status != 200) violated("prioritize refused what filter took", body);
  const json scores = json::parse(prioritized.body, nullptr, false);
  if (!scores.is_array()) violated("prioritize result shape", prioritized.body);
  for (const json& entry : scores) {
    if (!entry["Host"].is_string() || !entry["Score"].is_number_integer() || entry["Score"] < 0 ||
        entry["Score"] > 10) {
      violated("score out of 0..10", entry.dump());
    }
  }
}

void check_cache(const std::string& body) {
  const auto decoded = extender::decode_pod(kube::PaddedText(body).view());
  json pod = json::parse(body, nullptr, false);
  if (pod.is_discarded()) return;  // no promise beyond "no crash" for what is not JSON
  // The other way round is allowed: simdjson refuses nesting deeper than 1024, nlohmann does not.
  if (decoded && !pod.is_object()) violated("decode_pod took what is not an object", body);
  if (decoded && decoded->requests != extender::pod_requests(pod)) violated("decode_pod's requests", body);
  // A pod with the uid of the one already cached would replace it: a different pod, not this property.
  if (pod.is_object() && pod.contains("metadata") && pod["metadata"].is_object()) pod["metadata"]["uid"] = "fuzzed";
  const kube::PaddedText renamed(pod.dump());
  const auto before = cluster().node("n1").allocated;
  const auto pods = cluster().pod_count();
  cluster().pods().apply("ADDED", renamed.view());
  cluster().pods().apply("DELETED", renamed.view());
  if (cluster().node("n1").allocated != before || cluster().pod_count() != pods)
    violated("add+delete changed the cache", body);
}

void check_splitter(const std::string& body) {
  kube::JsonObjectSplitter splitter;
  std::size_t emitted = 0;
  auto count = [&](std::string_view object) {
    if (object.empty() || object.front() != '{' || object.back() != '}')
      violated("splitter emitted a non-object", std::string(object));
    emitted += object.size();
  };
  const std::size_t half = body.size() / 2;
  if (splitter.feed(std::string_view(body).substr(0, half), count)) {
    splitter.feed(std::string_view(body).substr(half), count);
  }
  if (emitted > body.size()) violated("splitter emitted more than it was given", body);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  check_verbs(body);
  check_cache(body);
  check_splitter(body);
  return 0;
}

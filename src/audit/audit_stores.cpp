// The audit loop's caches: what each keeps of an object, and when that counts as a change.
#include "audit_stores.hpp"

#include <simdjson.h>

#include "gpuguard/log/log.hpp"

namespace gpuguard::audit {

void PodStore::take(Pods& into, std::string_view object, const policy::Policy& policy) {
  std::string error;
  auto pod = audit_pod(object, policy, claims_, error);
  if (!pod) {
    metrics_.count_unreadable_pod();
    log::warn("pod left out of the audit: the admission core cannot read it", {{"reason", error}});
    return;
  }
  std::string key = pod->namespace_ + "/" + pod->name;
  const bool has_claims = pod->has_claims;
  into.insert_or_assign(std::move(key), Entry{std::move(*pod), has_claims ? std::string(object) : std::string()});
}

std::optional<std::string> NodeStore::name_of(std::string_view object) {
  simdjson::dom::parser parser;
  simdjson::dom::element node;
  std::string_view name;
  if (parser.parse(object.data(), object.size()).get(node) != simdjson::SUCCESS ||
      node["metadata"]["name"].get(name) != simdjson::SUCCESS) {
    return std::nullopt;
  }
  return std::string(name);
}

}  // namespace gpuguard::audit

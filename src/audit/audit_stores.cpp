// The audit loop's caches: what each keeps of an object, and when that counts as a change.
#include "audit_stores.hpp"

#include <simdjson.h>

#include "gpuguard/log/log.hpp"

namespace gpuguard::audit {

namespace {

// "namespace/name" of a pod's JSON, read apart from any judgement, so that a pod that cannot be judged
// can still be forgotten.
std::optional<std::string> pod_key(std::string_view object) {
  simdjson::dom::parser parser;
  simdjson::dom::element pod;
  std::string_view ns, name;
  if (parser.parse(object.data(), object.size()).get(pod) != simdjson::SUCCESS ||
      pod["metadata"]["name"].get(name) != simdjson::SUCCESS) {
    return std::nullopt;
  }
  if (pod["metadata"]["namespace"].get(ns) != simdjson::SUCCESS || ns.empty()) ns = "default";
  return std::string(ns) + "/" + std::string(name);
}

}  // namespace

bool PodStore::take(std::string_view object, const policy::Policy& policy) {
  std::string error;
  auto pod = audit_pod(object, policy, claims_, error);
  if (!pod) {
    metrics_.count_unreadable_pod();
    log::warn("pod left out of the audit: the admission core cannot read it",
              {{"pod", pod_key(object).value_or("?")}, {"reason", error}});
    return false;
  }
  pod->findings = shared(std::move(pod->findings));
  std::string key = pod->namespace_ + "/" + pod->name;
  const bool has_claims = pod->has_claims;
  Entry entry{std::make_shared<const PodAudit>(std::move(*pod)), generation_,
              has_claims ? std::string(object) : std::string()};
  const std::lock_guard lock(mutex_);
  pods_.insert_or_assign(std::move(key), std::move(entry));
  return true;
}

std::shared_ptr<const PodFindings> PodStore::shared(std::shared_ptr<const PodFindings> findings) {
  auto& copies = findings_[hash_of(*findings)];
  for (const auto& copy : copies) {
    if (auto held = copy.lock(); held && *held == *findings) return held;
  }
  copies.push_back(findings);
  return findings;
}

void PodStore::forget_unshared_findings() {
  for (auto it = findings_.begin(); it != findings_.end();) {
    std::erase_if(it->second, [](const auto& copy) { return copy.expired(); });
    it = it->second.empty() ? findings_.erase(it) : std::next(it);
  }
}

void PodStore::apply(std::string_view type, std::string_view object) {
  std::shared_ptr<const policy::Policy> policy;
  {
    const std::lock_guard lock(mutex_);
    policy = judged_under_;
  }
  if (!policy) policy = policy_();
  // A pod deleted, or changed into one that cannot be read, is no longer reported as it was.
  if (type == "DELETED" || !take(object, *policy)) {
    if (const auto key = pod_key(object)) {
      const std::lock_guard lock(mutex_);
      if (pods_.erase(*key) > 0) ++changes_;
    }
    return;
  }
  const std::lock_guard lock(mutex_);
  ++changes_;
}

std::vector<Offender> PodStore::offenders(const NodeConditions& nodes, std::size_t& pods) const {
  std::vector<Offender> found;
  const std::lock_guard lock(mutex_);
  pods = pods_.size();
  for (const auto& [key, entry] : pods_) {
    std::shared_ptr<const PodAudit> pod = entry.audit;
    if (!entry.json.empty() && judged_under_) {
      std::string error;
      if (auto again = audit_pod(entry.json, *judged_under_, claims_, error)) {
        pod = std::make_shared<const PodAudit>(std::move(*again));
      }
    }
    const auto node = nodes.find(pod->node);
    std::vector<admission::Exposure> from_node = node_exposures(*pod, node != nodes.end() ? &node->second : nullptr);
    if (from_node.empty() && pod->exposures().empty()) continue;
    found.push_back({std::move(pod), std::move(from_node)});
  }
  return found;
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

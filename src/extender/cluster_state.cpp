#include "gpuguard/extender/cluster_state.hpp"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "gpuguard/k8s/quantity.hpp"
#include "json_fields.hpp"

namespace gpuguard::extender {
namespace {

using nlohmann::json;

// No node has 2^40 of anything. Capping each container's count there keeps every sum below 2^62 (a
// pod spec cannot hold 2^22 containers), however absurd the quantities a pod was created with.
constexpr std::int64_t kLargestCount = std::int64_t{1} << 40;
constexpr std::int64_t kLargestSum = std::int64_t{1} << 62;

// Quantities are strings on the wire; JSON numbers are accepted too.
std::int64_t count_of(const json& quantity) {
  std::int64_t count = 0;
  if (quantity.is_string()) {
    count = k8s::quantity_count(quantity.get_ref<const std::string&>()).value_or(0);
  } else if (quantity.is_number_unsigned()) {
    count = static_cast<std::int64_t>(std::min<std::uint64_t>(quantity.get<std::uint64_t>(), kLargestCount));
  } else if (quantity.is_number()) {
    count = static_cast<std::int64_t>(std::clamp(std::ceil(quantity.get<double>()), 0.0, double(kLargestCount)));
  }
  return std::min(count, kLargestCount);
}

ResourceCounts extended_resources(const json* list) {
  ResourceCounts counts;
  if (list == nullptr || !list->is_object()) return counts;
  for (const auto& [name, quantity] : list->items()) {
    if (name.find('/') == std::string::npos) continue;
    if (const std::int64_t n = count_of(quantity); n > 0) counts[name] = n;
  }
  return counts;
}

ResourceCounts container_requests(const json& container) {
  const json* resources = member(container, "resources");
  if (resources == nullptr) return {};
  ResourceCounts requests = extended_resources(member(*resources, "requests"));
  for (auto& [name, limit] : extended_resources(member(*resources, "limits"))) requests.try_emplace(name, limit);
  return requests;
}

// Saturating, so that no sum can overflow; below the cap (every real cluster) it is exact.
void add_to(ResourceCounts& total, const ResourceCounts& more) {
  for (const auto& [name, n] : more) {
    std::int64_t& sum = total[name];
    sum = n > kLargestSum - sum ? kLargestSum : sum + n;
  }
}

void max_into(ResourceCounts& total, const ResourceCounts& other) {
  for (const auto& [name, n] : other) total[name] = std::max(total[name], n);
}

const json& array_or_empty(const json* value) {
  static const json kEmpty = json::array();
  return value != nullptr && value->is_array() ? *value : kEmpty;
}

bool occupies_node(const json& pod) {
  const std::string_view phase = string_at(pod, {"status", "phase"});
  return !string_at(pod, {"spec", "nodeName"}).empty() && phase != "Succeeded" && phase != "Failed";
}

std::string pod_key(const json& pod) {
  const std::string_view uid = string_at(pod, {"metadata", "uid"});
  if (!uid.empty()) return std::string(uid);
  return std::string(string_at(pod, {"metadata", "namespace"})) + "/" +
         std::string(string_at(pod, {"metadata", "name"}));
}

}  // namespace

ResourceCounts pod_requests(const json& pod) {
  const json* spec = member(pod, "spec");
  if (spec == nullptr) return {};
  ResourceCounts total;
  for (const json& container : array_or_empty(member(*spec, "containers")))
    add_to(total, container_requests(container));
  // The same walk as the scheduler's resource helper: sidecars (restartPolicy Always) run alongside
  // everything after them, a plain init container runs alone beside the sidecars started before it.
  ResourceCounts sidecars, init_peak;
  for (const json& container : array_or_empty(member(*spec, "initContainers"))) {
    ResourceCounts requests = container_requests(container);
    if (string_at(container, {"restartPolicy"}) == "Always") {
      add_to(total, requests);
      add_to(sidecars, requests);
      requests = sidecars;
    } else {
      add_to(requests, sidecars);
    }
    max_into(init_peak, requests);
  }
  max_into(total, init_peak);
  std::erase_if(total, [](const auto& entry) { return entry.second == 0; });
  return total;
}

ResourceCounts node_allocatable(const json& node) {
  const json* status = member(node, "status");
  return extended_resources(status == nullptr ? nullptr : member(*status, "allocatable"));
}

namespace {

// Copies the value at `path` from one object into another, if it is there.
void copy_path(const json& from, json& to, std::initializer_list<std::string_view> path) {
  const json* at = &from;
  for (std::string_view key : path) {
    at = member(*at, key);
    if (at == nullptr) return;
  }
  json* into = &to;
  for (std::string_view key : path) into = &(*into)[std::string(key)];
  *into = *at;
}

json containers_essentials(const json* containers) {
  json kept = json::array();
  for (const json& container : array_or_empty(containers)) {
    json one = json::object();
    copy_path(container, one, {"resources", "requests"});
    copy_path(container, one, {"resources", "limits"});
    copy_path(container, one, {"restartPolicy"});
    kept.push_back(std::move(one));
  }
  return kept;
}

}  // namespace

json pod_essentials(const json& pod) {
  json kept = json::object();
  for (auto key : {"uid", "name", "namespace"}) copy_path(pod, kept, {"metadata", key});
  copy_path(pod, kept, {"spec", "nodeName"});
  copy_path(pod, kept, {"status", "phase"});
  if (const json* spec = member(pod, "spec")) {
    kept["spec"]["containers"] = containers_essentials(member(*spec, "containers"));
    kept["spec"]["initContainers"] = containers_essentials(member(*spec, "initContainers"));
  }
  return kept;
}

json node_essentials(const json& node) {
  json kept = json::object();
  copy_path(node, kept, {"metadata", "name"});
  copy_path(node, kept, {"status", "allocatable"});
  return kept;
}

void ClusterState::add_pod(const json& pod) {
  const std::string key = pod_key(pod);
  remove_pod(key);
  if (!occupies_node(pod)) return;
  PodRecord record{std::string(string_at(pod, {"spec", "nodeName"})), pod_requests(pod)};
  if (record.requests.empty()) return;  // most pods: nothing to count, nothing to keep
  add_to(allocated_[record.node], record.requests);
  pods_.emplace(key, std::move(record));
}

void ClusterState::remove_pod(const std::string& key) {
  const auto found = pods_.find(key);
  if (found == pods_.end()) return;
  auto& on_node = allocated_[found->second.node];
  for (const auto& [name, n] : found->second.requests) {
    std::int64_t& sum = on_node[name];
    sum = std::max<std::int64_t>(sum - n, 0);
    if (sum == 0) on_node.erase(name);
  }
  if (on_node.empty()) allocated_.erase(found->second.node);
  pods_.erase(found);
}

void ClusterState::replace_pods(const std::vector<json>& pods) {
  std::unique_lock lock(mutex_);
  pods_.clear();
  allocated_.clear();
  for (const json& pod : pods) add_pod(pod);
}

void ClusterState::apply_pod_event(std::string_view type, const json& pod) {
  std::unique_lock lock(mutex_);
  if (type == "DELETED") {
    remove_pod(pod_key(pod));
  } else {
    add_pod(pod);  // MODIFIED may mean finished: add_pod drops it then
  }
}

void ClusterState::replace_nodes(const std::vector<json>& nodes) {
  std::unique_lock lock(mutex_);
  nodes_.clear();
  for (const json& node : nodes) nodes_[std::string(string_at(node, {"metadata", "name"}))] = node_allocatable(node);
}

void ClusterState::apply_node_event(std::string_view type, const json& node) {
  std::unique_lock lock(mutex_);
  const std::string name(string_at(node, {"metadata", "name"}));
  if (type == "DELETED") {
    nodes_.erase(name);
  } else {
    nodes_[name] = node_allocatable(node);
  }
}

NodeState ClusterState::node(std::string_view name) const {
  std::shared_lock lock(mutex_);
  NodeState state;
  const std::string key(name);
  if (const auto found = nodes_.find(key); found != nodes_.end()) {
    state.known = true;
    state.allocatable = found->second;
  }
  if (const auto found = allocated_.find(key); found != allocated_.end()) state.allocated = found->second;
  return state;
}

std::size_t ClusterState::pod_count() const {
  std::shared_lock lock(mutex_);
  return pods_.size();
}

std::size_t ClusterState::node_count() const {
  std::shared_lock lock(mutex_);
  return nodes_.size();
}

}  // namespace gpuguard::extender

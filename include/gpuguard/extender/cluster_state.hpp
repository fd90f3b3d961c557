#pragma once
// What the extender knows about the cluster: for every node its allocatable extended resources, and what
// the pods bound to it and not finished occupy. Fed from the Kubernetes API (src/kube) and read by the
// filter and prioritize verbs on the server's threads. No I/O.
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gpuguard::extender {

// Counts of extended resources (names with a '/', such as nvidia.com/gpu) by name; cpu, memory and the
// other built-in resources are not kept.
using ResourceCounts = std::map<std::string, std::int64_t, std::less<>>;

// A Pod's effective request of each extended resource, as the scheduler computes it: the sum over its
// containers and sidecars, or the largest init container (plus the sidecars started before it) if that is
// more. A container's request falls back to its limit, as the apiserver's defaulting does.
ResourceCounts pod_requests(const nlohmann::json& pod);
// status.allocatable of a Node.
ResourceCounts node_allocatable(const nlohmann::json& node);

// The fields of a Pod or Node that ClusterState reads, and nothing else: a listed collection is held in
// this form until the last page arrives (kube::WatchedResource::trim).
nlohmann::json pod_essentials(const nlohmann::json& pod);
nlohmann::json node_essentials(const nlohmann::json& node);

struct NodeState {
  bool known = false;  // listed or watched; false for a name the API has not shown us
  ResourceCounts allocatable;
  ResourceCounts allocated;
};

class ClusterState {
 public:
  // A full list replaces what is known of that kind; a watch event (ADDED, MODIFIED, DELETED) updates it.
  // Pods that are not bound to a node or have finished (Succeeded, Failed) are dropped.
  void replace_pods(const std::vector<nlohmann::json>& pods);
  void apply_pod_event(std::string_view type, const nlohmann::json& pod);
  void replace_nodes(const std::vector<nlohmann::json>& nodes);
  void apply_node_event(std::string_view type, const nlohmann::json& node);

  NodeState node(std::string_view name) const;
  // Pods kept: bound, not finished, and holding at least one extended resource.
  std::size_t pod_count() const;
  std::size_t node_count() const;

 private:
  struct PodRecord {
    std::string node;
    ResourceCounts requests;
  };
  void add_pod(const nlohmann::json& pod);
  void remove_pod(const std::string& key);

  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, PodRecord> pods_;  // by uid
  std::unordered_map<std::string, ResourceCounts> nodes_;
  std::unordered_map<std::string, ResourceCounts> allocated_;  // by node name, kept in step with pods_
};

}  // namespace gpuguard::extender

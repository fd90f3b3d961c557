#pragma once
// What the extender reads of Pods and Nodes: a pod's effective request of extended resources, as the
// scheduler computes it, and a node's allocatable. Two readers share one rule: a DOM (the Pod and Nodes
// inside ExtenderArgs), and JSON text walked once with simdjson On-Demand (the cache's list pages and watch
// events, where a DOM per pod was most of the memory). No I/O.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gpuguard::extender {

// Counts of extended resources (names with a '/', such as nvidia.com/gpu) by name; cpu, memory and the
// other built-in resources are not kept.
using ResourceCounts = std::map<std::string, std::int64_t, std::less<>>;

// One container's requests, a missing request falling back to the limit as the apiserver's defaulting
// does; `sidecar` for an init container with restartPolicy Always.
struct ContainerRequests {
  ResourceCounts requests;
  bool sidecar = false;
};

// The sum over the containers and sidecars, or the largest init container (plus the sidecars started
// before it) if that is more: the scheduler's resource helper.
ResourceCounts effective_requests(const std::vector<ContainerRequests>& containers,
                                  const std::vector<ContainerRequests>& init_containers);

// The quantities a reader could not count as written: not a non-negative quantity (counted as 0), or
// beyond the 2^40 any one count is capped at (counted as 2^40). Bounded whatever the input: the first
// kKept resources in document order, each with why, and whether there were more.
struct Unreadable {
  static constexpr std::size_t kKept = 16;
  struct Entry {
    std::string resource;  // truncated to a qualified name's longest, 317 bytes
    const char* why;       // a static string
  };
  std::vector<Entry> entries;
  bool more = false;

  bool any() const { return !entries.empty(); }
  // True when `resource` is among them, or may be (more than kKept).
  bool names(std::string_view resource) const;
  // The first, for a log line: "nvidia.com/gpu: beyond the 2^40 the extender counts"; "" when none.
  std::string first() const;
  void note(std::string_view resource, const char* why);
};

// From a DOM: a Pod's effective requests, and a Node's status.allocatable.
ResourceCounts pod_requests(const nlohmann::json& pod, Unreadable* unreadable = nullptr);
ResourceCounts node_allocatable(const nlohmann::json& node, Unreadable* unreadable = nullptr);

// What the cache keeps of a Pod. `key` is its uid, or namespace/name without one.
struct PodUsage {
  std::string key;
  std::string node;            // spec.nodeName
  bool occupies_node = false;  // bound, and not Succeeded or Failed
  ResourceCounts requests;
  Unreadable unreadable;
};
struct NodeCapacity {
  std::string name;
  ResourceCounts allocatable;
  Unreadable unreadable;
};

// From JSON text followed by at least kube::kJsonPadding readable bytes (as kube::Store hands it over);
// nullopt when it is not a JSON object. Agrees with the DOM readers on every valid document.
std::optional<PodUsage> decode_pod(std::string_view json);
std::optional<NodeCapacity> decode_node(std::string_view json);

}  // namespace gpuguard::extender

#include "gpuguard/extender/scheduling.hpp"

#include "gpuguard/k8s/json_fields.hpp"

#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpuguard::extender {
namespace {

using k8s::string_at;
using nlohmann::json;

std::int64_t count_in(const ResourceCounts& counts, const std::string& name) {
  const auto found = counts.find(name);
  return found == counts.end() ? 0 : found->second;
}

// ExtenderArgs, checked. Exactly one of the two node forms is used: Nodes (full objects) when the
// extender is not nodeCacheCapable, NodeNames when it is.
struct Args {
  json document;
  ResourceCounts gpus;
  Unreadable unreadable;  // the pod's, objects.hpp
  bool full_nodes = false;
  std::vector<std::string> names;         // in request order, both forms
  std::vector<const json*> node_objects;  // full_nodes only, parallel to names
};

std::optional<std::string> parse_args(std::string_view body, const policy::Policy& policy, Args& args) {
  args.document = json::parse(body.begin(), body.end(), nullptr, false);
  const json& doc = args.document;
  if (doc.is_discarded()) return "ExtenderArgs is not valid JSON";
  if (!doc.is_object()) return "ExtenderArgs must be a JSON object";
  const auto pod = doc.find("Pod");
  if (pod == doc.end() || !pod->is_object()) return "ExtenderArgs.Pod is missing or not an object";
  const auto spec = pod->find("spec");
  if (spec == pod->end() || !spec->is_object()) return "ExtenderArgs.Pod.spec is missing or not an object";
  for (const char* list : {"containers", "initContainers"}) {
    const auto containers = spec->find(list);
    if (containers == spec->end() || containers->is_null()) continue;
    if (!containers->is_array()) return std::string("ExtenderArgs.Pod.spec.") + list + " is not an array";
    for (const json& container : *containers) {
      if (!container.is_object()) return std::string("ExtenderArgs.Pod.spec.") + list + " holds a non-object";
    }
  }
  args.gpus = gpu_request(pod_requests(*pod, &args.unreadable), policy);

  const auto nodes = doc.find("Nodes");
  const auto names = doc.find("NodeNames");
  if (nodes != doc.end() && !nodes->is_null()) {
    const auto items = nodes->is_object() ? nodes->find("items") : nodes->end();
    if (items == nodes->end() || !(items->is_array() || items->is_null())) {
      return "ExtenderArgs.Nodes must be an object with an items array";
    }
    args.full_nodes = true;
    if (items->is_null()) return std::nullopt;
    for (const json& node : *items) {
      const std::string_view name = string_at(node, {"metadata", "name"});
      if (name.empty()) return "ExtenderArgs.Nodes.items holds a node without metadata.name";
      args.names.emplace_back(name);
      args.node_objects.push_back(&node);
    }
    return std::nullopt;
  }
  if (names != doc.end() && !names->is_null()) {
    if (!names->is_array()) return "ExtenderArgs.NodeNames must be an array of strings";
    for (const json& name : *names) {
      if (!name.is_string()) return "ExtenderArgs.NodeNames must be an array of strings";
      args.names.push_back(name.get<std::string>());
    }
    return std::nullopt;
  }
  return "ExtenderArgs names no nodes: Nodes and NodeNames are both null";
}

// The cache knows what is allocated; a full Node object in the request is the freshest allocatable.
NodeState state_of(const Args& args, std::size_t index, const ClusterState& state) {
  NodeState node = state.node(args.names[index]);
  if (args.full_nodes) {
    node.known = true;
    node.unreadable = {};
    node.allocatable = node_allocatable(*args.node_objects[index], &node.unreadable);
  }
  return node;
}

VerbResult bad_request(std::string reason) { return {400, std::move(reason)}; }

}  // namespace

ResourceCounts gpu_request(const ResourceCounts& pod_requests, const policy::Policy& policy) {
  ResourceCounts gpus;
  for (const auto& [name, n] : pod_requests) {
    if (n > 0 && policy.is_gpu_resource(name)) gpus.emplace(name, n);
  }
  return gpus;
}

std::optional<std::string> insufficient_gpus(const ResourceCounts& gpus, const NodeState& node) {
  if (gpus.empty()) return std::nullopt;
  if (!node.known) return "node not (yet) seen by gpuguard-scheduler-extender's watch of the Kubernetes API";
  for (const auto& [name, requested] : gpus) {
    if (node.unreadable.names(name)) {
      return "node's status.allocatable of " + name +
             " is not a count gpuguard-scheduler-extender can take as written (its log says why); no pod asking for "
             "it is placed there";
    }
  }
  std::string reason;
  for (const auto& [name, requested] : gpus) {
    const std::int64_t allocatable = count_in(node.allocatable, name);
    const std::int64_t allocated = count_in(node.allocated, name);
    const std::int64_t free = std::max<std::int64_t>(allocatable - allocated, 0);  // both below 2^62
    if (free >= requested) continue;
    if (!reason.empty()) reason += "; ";
    reason += "insufficient " + name + ": pod requests " + std::to_string(requested) + ", node has " +
              std::to_string(free) + " free (" + std::to_string(allocatable) + " allocatable, " +
              std::to_string(allocated) + " allocated)";
  }
  if (reason.empty()) return std::nullopt;
  return reason;
}

int bin_packing_score(const ResourceCounts& gpus, const NodeState& node) {
  // 128 bits: each count is below 2^62 and a pod asks for a handful of resources, so nothing overflows.
  __int128 allocatable = 0, used = 0;
  for (const auto& [name, requested] : gpus) {
    allocatable += count_in(node.allocatable, name);
    used += __int128{requested} + count_in(node.allocated, name);
  }
  const bool unreadable =
      std::any_of(gpus.begin(), gpus.end(), [&](const auto& g) { return node.unreadable.names(g.first); });
  if (gpus.empty() || allocatable <= 0 || unreadable) return 0;
  // round(used / allocatable x 10) in integers, halves up.
  const __int128 score = (20 * used + allocatable) / (2 * allocatable);
  return static_cast<int>(std::clamp<__int128>(score, 0, 10));
}

VerbResult filter(std::string_view body, const ClusterState& state, const policy::Policy& policy, bool synced) {
  Args args;
  if (auto error = parse_args(body, policy, args)) return bad_request(std::move(*error));
  json result = {{"Nodes", nullptr},
                 {"NodeNames", nullptr},
                 {"FailedNodes", json::object()},
                 {"FailedAndUnresolvableNodes", json::object()},
                 {"Error", ""}};
  if (!synced && !args.gpus.empty()) {
    result["Error"] = "gpuguard-scheduler-extender has not listed pods and nodes from the Kubernetes API yet";
    return {200, result.dump(-1, ' ', false, json::error_handler_t::replace)};
  }
  json passing = json::array();
  // A GPU count the pod cannot have meant is refused on every node by name, not compared as if it were.
  std::optional<std::string> pod_unreadable;
  for (const Unreadable::Entry& entry : args.unreadable.entries) {
    if (!pod_unreadable && policy.is_gpu_resource(entry.resource)) {
      pod_unreadable =
          "pod's request of " + entry.resource + " is " + entry.why + "; gpuguard-scheduler-extender places it nowhere";
    }
  }
  if (!pod_unreadable && args.unreadable.more && !args.gpus.empty()) {
    pod_unreadable =
        "pod's requests hold more quantities not counted as written than gpuguard-scheduler-extender "
        "names; it places the pod nowhere";
  }
  for (std::size_t i = 0; i < args.names.size(); ++i) {
    if (pod_unreadable) {
      result["FailedNodes"][args.names[i]] = *pod_unreadable;
    } else if (auto reason = insufficient_gpus(args.gpus, state_of(args, i, state))) {
      result["FailedNodes"][args.names[i]] = std::move(*reason);
    } else if (args.full_nodes) {
      passing.push_back(*args.node_objects[i]);
    } else {
      passing.push_back(args.names[i]);
    }
  }
  if (args.full_nodes) {
    result["Nodes"] = {{"items", std::move(passing)}};
  } else {
    result["NodeNames"] = std::move(passing);
  }
  return {200, result.dump(-1, ' ', false, json::error_handler_t::replace)};
}

VerbResult prioritize(std::string_view body, const ClusterState& state, const policy::Policy& policy, bool synced) {
  Args args;
  if (auto error = parse_args(body, policy, args)) return bad_request(std::move(*error));
  // Written directly: a DOM of one small object per node cost more than the scoring.
  std::string scores = "[";
  for (std::size_t i = 0; i < args.names.size(); ++i) {
    const int score = synced ? bin_packing_score(args.gpus, state_of(args, i, state)) : 0;
    if (i > 0) scores += ',';
    scores += "{\"Host\":";
    scores += json(args.names[i]).dump(-1, ' ', false, json::error_handler_t::replace);
    scores += ",\"Score\":";
    scores += std::to_string(score);
    scores += '}';
  }
  scores += ']';
  return {200, std::move(scores)};
}

}  // namespace gpuguard::extender

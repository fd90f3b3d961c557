#pragma once
// The scheduler extender's verbs: ExtenderArgs JSON in, ExtenderFilterResult or HostPriorityList JSON out
// (PascalCase keys, as kube-scheduler's Go types have no json tags). No I/O.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gpuguard/extender/cluster_state.hpp"
#include "gpuguard/policy/policy.hpp"

namespace gpuguard::extender {

// The GPUs a pod asks for: its requests of the resources the policy's gpuResources name.
ResourceCounts gpu_request(const ResourceCounts& pod_requests, const policy::Policy& policy);

// Why the node cannot take a pod asking `gpus`, naming the numbers; nullopt when it can.
std::optional<std::string> insufficient_gpus(const ResourceCounts& gpus, const NodeState& node);

// round((requested + allocated) / allocatable x 10) over the resources the pod asks for, clamped to
// 0..10: the fuller the node would be, the higher. 0 for a node without those resources, and for a
// pod that asks for no GPU.
int bin_packing_score(const ResourceCounts& gpus, const NodeState& node);

struct VerbResult {
  unsigned status = 200;  // 400 when the ExtenderArgs cannot be used
  std::string body;       // JSON for 200, the reason for 400
};

// `synced` is false until pods and nodes have been listed once; filter then answers with Error set (the
// scheduler skips an ignorable extender that errs, and retries the pod otherwise), prioritize with all 0.
VerbResult filter(std::string_view body, const ClusterState& state, const policy::Policy& policy, bool synced);
VerbResult prioritize(std::string_view body, const ClusterState& state, const policy::Policy& policy, bool synced);

}  // namespace gpuguard::extender

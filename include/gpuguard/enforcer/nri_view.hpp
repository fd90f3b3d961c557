#pragma once
// NRI's messages as the decision reads them (decision.hpp's ContainerView), read in place from their
// bytes (gpuguard/nri/messages.hpp): the one place that knows both NRI's wire and the pure core, and pure
// itself (nri_response.hpp writes the answer). A view keeps only what the decision reads (judged_variable and the
// others), at most kViewListMax entries of each list and kViewValueMax bytes of each value: a 4 MiB request makes a
// view of a few KiB, and what is past those bounds is counted (ContainerView::unkept), never dropped
// unseen.
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "gpuguard/enforcer/decision.hpp"

namespace gpuguard::enforcer {

inline constexpr std::size_t kViewListMax = 64;
inline constexpr std::size_t kViewValueMax = std::size_t{64} << 10;

// A pod as the enforcer remembers it between events.
struct PodIdentity {
  std::string id, pod_namespace, name, uid;
};
PodIdentity pod_identity(std::string_view pod);

// What a view takes from the pod (its identity, the labels exemptions name, gpuguard's allocation key), kept
// while a Synchronize's chunks come in: a container's pod may come in a later chunk than the container.
struct PodFacts {
  PodIdentity identity;
  std::map<std::string, std::string> labels, annotations;
};
PodFacts pod_facts(std::string_view pod, const std::set<std::string>& label_keys);
void set_pod(ContainerView& view, const PodFacts& pod);

// A container's ID and its sandbox's, from its NRI Container.
struct ContainerIds {
  std::string id, sandbox_id;
};
ContainerIds container_ids(std::string_view container);

// The view of a container from its NRI PodSandbox and Container; `label_keys` are the pod labels the
// policy's exemptions name. nullopt when either message is malformed.
std::optional<ContainerView> view_of(std::string_view pod, std::string_view container, const NodeView& node,
                                     const std::set<std::string>& label_keys);
// The same without its pod (set_pod gives it one).
std::optional<ContainerView> container_view(std::string_view container, const NodeView& node);

// The view of a container as every plugin's merged ContainerAdjustment (the validation phase's) leaves it,
// as containerd's and CRI-O's generator applies one: variables set (the first entry replaced, a missing one
// appended), mounts removed by destination then added, device nodes and CDI devices added, annotations
// added (a removal is not counted on: NRI applies a removal and a set of one key in no fixed order).
// false when the adjustment is malformed.
bool apply_adjustment(ContainerView& view, std::string_view adjustment, const NodeView& node);

}  // namespace gpuguard::enforcer

#pragma once
// NRI's PodSandbox, Container and ContainerAdjustment messages as the node enforcer's decision reads them
// (enforcement::ContainerView), read in place from their bytes by messages.hpp's field numbers: the one
// translation of these messages into the decision's view, pure itself (the plugin and the enforcer's core read
// the same numbers only for the requests' envelopes and a container's name). Everything is bounded as it is read
// (decision.hpp's kPathMax, kListMax, kValueMax, kNameMax): a longer path or value is never copied, only named in the
// view's `unread`, and a view holds at most a fixed size whatever the request holds: a 4 MiB request makes a view of a
// few KiB at most (tests/enforcer/view_bounds_test.cpp).
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "gpuguard/enforcement/decision.hpp"

namespace gpuguard::nri {

// Where a bind mount's host path leads (the node enforcer's node state answers).
using HostPathResolver = std::function<enforcement::HostPathResolution(std::string_view source)>;
// A resolver for hosts without links: every path leads where it says.
enforcement::HostPathResolution as_written(std::string_view source);

// A pod as the enforcer remembers it between events.
struct PodIdentity {
  std::string id, pod_namespace, name, uid;
};
PodIdentity pod_identity(std::string_view pod);

// What a view takes from the pod (its identity, the labels exemptions name, whether it carries gpuguard's
// allocation key), kept while a Synchronize's chunks come in: a container's pod may come in a later chunk.
struct PodFacts {
  PodIdentity identity;
  std::map<std::string, std::string> labels;
  bool allocated_annotation = false;
  bool oversized = false;  // an identity string over kNameMax: the pod cannot be looked up by it
};
PodFacts pod_facts(std::string_view pod, const std::set<std::string>& label_keys);
void set_pod(enforcement::ContainerView& view, const PodFacts& pod);

// A container's ID and its sandbox's, from its NRI Container.
struct ContainerIds {
  std::string id, sandbox_id;
};
ContainerIds container_ids(std::string_view container);

// The view of a container from its NRI PodSandbox and Container; `label_keys` are the pod labels the
// policy's exemptions name. The CDI names NVIDIA's NRI plugin reads from the pod's nvidia.cdi.k8s.io
// annotations for this container are among its cdi_annotation_names. nullopt when either message is malformed.
std::optional<enforcement::ContainerView> view_of(std::string_view pod, std::string_view container,
                                                  const enforcement::NodeView& node,
                                                  const std::set<std::string>& label_keys,
                                                  const HostPathResolver& resolve);
// The same without its pod (set_pod gives it one).
std::optional<enforcement::ContainerView> container_view(std::string_view container, const enforcement::NodeView& node,
                                                         const HostPathResolver& resolve);

// The view of a container as every plugin's merged ContainerAdjustment (the validation phase's) leaves it,
// as containerd's and CRI-O's generator applies one: variables set (the first entry replaced, a missing one
// appended), mounts removed by destination then added, device nodes and CDI devices added, annotations
// added (a removal is not counted on: NRI applies a removal and a set of one key in no fixed order).
// false when the adjustment is malformed.
bool apply_adjustment(enforcement::ContainerView& view, std::string_view adjustment, const enforcement::NodeView& node,
                      const HostPathResolver& resolve);

}  // namespace gpuguard::nri

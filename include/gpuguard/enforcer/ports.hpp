#pragma once
// What the node enforcer's core (enforcer.hpp) needs from outside, as three small ports: where allocations
// come from (the kubelet's pod-resources API), the pod directory (the API server's pods and events), and the
// node's state (its GPUs, toolkit and CDI specs, and where its host paths lead). The program wires the real
// ones (src/enforcer/enforcer_service.cpp); tests wire fakes (tests/enforcer/enforcer_test.cpp).
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "gpuguard/enforcement/allocation.hpp"
#include "gpuguard/enforcement/decision.hpp"

namespace gpuguard::enforcer {

// The pure core's types, as the enforcer's ports speak them.
using enforcement::Allocation;
using enforcement::ContainerView;
using enforcement::Decision;
using enforcement::HostPathResolution;
using enforcement::KubeletAnswer;
using enforcement::NodeView;
using enforcement::PodResources;

// Where allocations come from: the kubelet's pod-resources List.
class PodResourcesSource {
 public:
  virtual ~PodResourcesSource() = default;
  using Wanted = std::function<bool(std::string_view pod_namespace, std::string_view pod_name)>;
  using Take = std::function<void(std::string_view pod_namespace, std::string_view pod_name, PodResources pod)>;
  // Every pod the kubelet lists, read as a stream: each one `wanted` picks is handed to `take`, the others
  // skipped unread, so nothing is held in proportion to the node's pods but what `take` keeps. Returns why
  // the list could not be read within `deadline`, or "" (then the pods not taken are not listed).
  virtual std::string list(std::chrono::milliseconds deadline, const Wanted& wanted, const Take& take) = 0;
  // One pod's answer, where the kubelet serves Get; nullopt where it does not (then List answers).
  virtual std::optional<KubeletAnswer> get(const std::string& pod_namespace, const std::string& pod_name,
                                           std::chrono::milliseconds deadline) = 0;
};

// The pod directory: the API server.
class PodDirectory {
 public:
  virtual ~PodDirectory() = default;
  // The service account of the pod the API server has under that name, where its UID is `uid` (a static
  // pod's mirror has a UID of its own); "" when that cannot be read.
  virtual std::string service_account(const std::string& pod_namespace, const std::string& pod_name,
                                      const std::string& uid) = 0;
  // A Warning event on this node; it may take seconds, and is called off the runtime's thread.
  virtual void node_event(const std::string& message) = 0;
  // A Warning event on a pod, `kubectl describe pod` shows it (reason GPUInfrastructureUnlisted); as node_event.
  virtual void pod_event(const std::string& pod_namespace, const std::string& pod_name, const std::string& uid,
                         const std::string& message) = 0;
};

// The node's state.
class NodeState {
 public:
  virtual ~NodeState() = default;
  // The node as last read, read again first where what it was read from changed (cheap: a stat or two).
  virtual std::shared_ptr<const NodeView> current() = 0;
  // Everything read again.
  virtual void refresh() = 0;
  // Where a host path leads, as runc binds it, with at most `steps_left` lookups (taken from it): one
  // container's mounts share one budget, so what a container's host paths cost the enforcer is bounded.
  virtual HostPathResolution resolve(std::string_view host_path, std::size_t& steps_left) = 0;
  // A host process's mounts (/proc/<pid>/mountinfo), at most enforcement::kMountinfoMax bytes; nullopt, with
  // `why`, where they cannot be read.
  virtual std::optional<std::string> mountinfo(std::uint32_t pid, std::string& why) = 0;
};

}  // namespace gpuguard::enforcer

#pragma once
// gpuguard-node-enforcer's core: the runtime's NRI calls in (nri::Handler), each container's decision
// (decision.hpp) out, with the kubelet's allocation, the pod directory and the node's state through the
// ports of ports.hpp. It holds what lies between calls: the allocations fetched when a sandbox is made
// (allocation_cache.hpp), the one a create found for the validation that follows it, the service accounts
// looked up, the policy merged with the flags' exemptions and the break glass, and the report of running
// containers at registration. Bounded whatever the runtime sends: a request's view is of a fixed size at
// most (container_view.hpp), and a Synchronize keeps decisions, not views, but for the containers whose pod
// is still to come (docs/node-enforcer.md#memory).
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpuguard/enforcer/enforcer_metrics.hpp"
#include "gpuguard/enforcer/ports.hpp"
#include "gpuguard/nri/plugin.hpp"
#include "gpuguard/policy/policy.hpp"

namespace gpuguard::enforcer {

struct EnforcerOptions {
  // namespace/name pairs exempt besides the policy's: gpuguard's own device plugin, which needs every GPU
  // for NVML and is not the pod author's to name.
  std::vector<std::string> exempt_service_accounts;
  // Each CreateContainer is answered within the runtime's 2 s: at most this for the kubelet's answer...
  std::chrono::milliseconds kubelet_deadline{800};
  // ...after waiting at most this for the answer fetched when the pod's sandbox was made.
  std::chrono::milliseconds fetched_wait{400};
  std::size_t prefetch_capacity = 1024;               // sandboxes whose answers are kept...
  std::size_t prefetch_bytes = std::size_t{4} << 20;  // ...and the bytes they keep, in all
  // A Synchronize keeps the views of containers whose pod has not come yet up to this many bytes
  // (enforcement::view_bytes); the containers past it are counted as not judged.
  std::size_t sync_pending_bytes = std::size_t{4} << 20;
  // NRI gives a whole Synchronize, every message of it, one request timeout (2 s): running containers are
  // judged until this long after it began (the kubelet's List included; the node read too where no Configure
  // came first, as in the unit tests), the rest counted as not judged. Registering matters more than the report.
  std::chrono::milliseconds sync_budget{1200};
  // Lookups one container's host paths may cost, all its bind mounts together (files::follow_in_root): a
  // path past it is one the enforcer cannot judge.
  std::size_t resolve_steps = 16384;
  // The mask check's path on the host (gpuguard-mask-check, which the program copies there): on CRI-O, each
  // container given masks gets it as a createRuntime hook (enforcement/mask_hook.hpp). Empty: none, and on
  // CRI-O no mask is written (a container that would need one is refused).
  std::string mask_hook;
};

// What the last registration found of the running containers.
struct RunningReport {
  std::size_t beyond = 0;      // see GPUs beyond their allocation (would be changed or refused now)
  std::size_t privileged = 0;  // privileged: not confined
  std::size_t unjudged = 0;    // not judged (their pod never came, past sync_pending_bytes or sync_budget)
};

class Enforcer final : public nri::Handler {
 public:
  using PolicySource = std::function<std::shared_ptr<const policy::Policy>()>;
  using BreakGlass = std::function<bool()>;  // true: every container is created as it is

  Enforcer(EnforcerOptions options, PodResourcesSource& kubelet, PodDirectory& pods, NodeState& node,
           PolicySource policy, BreakGlass break_glass, EnforcerMetrics& metrics);
  ~Enforcer() override;
  Enforcer(const Enforcer&) = delete;
  Enforcer& operator=(const Enforcer&) = delete;

  void connection(bool registered, bool validating, const std::string& runtime, const std::string& detail) override;
  void synchronize(std::string_view request, bool last) override;
  nri::CreateResult create_container(std::string_view request) override;
  std::optional<std::string> validate(std::string_view request) override;
  std::optional<std::string> start_container(std::string_view request) override;
  void remove_container(std::string_view pod, std::string_view container) override;
  void run_pod_sandbox(std::string_view pod) override;
  void remove_pod_sandbox(std::string_view pod) override;

  // The node read again (the program's poll calls it).
  void refresh_node();
  RunningReport running() const;
  // Lists the kubelet was asked for ahead of containers, since the start.
  std::size_t prefetch_lists();
  // The policy in force: the policy's, with the flags' exemptions and the break glass merged in.
  std::shared_ptr<const policy::Policy> effective_policy();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::enforcer

#pragma once
// The in-cluster audit (`gpuguard-webhook audit-controller`): every running pod kept by list and watch,
// judged as it arrives by audit_pod (the `audit` command's decision), joined at each pass with its node's
// GPUIsolation condition, and written as one PolicyReport per namespace by whichever replica holds the
// Lease. A pod is kept as its PodAudit, not its JSON, so memory follows the pods, not their size; a pod
// with DRA claims also keeps its JSON, to be judged again as claims change. A new policy is applied by
// listing the pods again.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "gpuguard/audit/audit_metrics.hpp"
#include "gpuguard/kube/api_server.hpp"
#include "gpuguard/kube/leader_election.hpp"
#include "gpuguard/policy/policy.hpp"

namespace gpuguard::audit {

struct AuditLoopOptions {
  kube::ApiServer apiserver;
  std::string lease_namespace;
  std::string lease_name = "gpuguard-audit";
  std::string identity;  // unique per process: two processes with one identity would both lead
  kube::LeaseTiming timing;
  bool resource_claims = true;  // list and watch DRA claims (resource.k8s.io/v1)
  // A pass runs when something changed, at most this often, and at least every full_pass.
  std::chrono::milliseconds min_pass_interval{1'000};
  std::chrono::seconds full_pass{60};
  std::chrono::milliseconds request_timeout{3'000};
  std::string user_agent = "gpuguard-audit";
};

using PolicySource = std::function<std::shared_ptr<const policy::Policy>()>;

class AuditLoop {
 public:
  AuditLoop(AuditLoopOptions options, PolicySource policy, AuditMetrics& metrics);
  ~AuditLoop();
  AuditLoop(const AuditLoop&) = delete;
  AuditLoop& operator=(const AuditLoop&) = delete;

  void start();
  // Stops the passes and the watches, then gives the Lease up if this replica holds it, so that another
  // takes over at once rather than after the Lease expires.
  void stop();
  // Pods and nodes (and claims, when watched) have been listed.
  bool synced() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::audit

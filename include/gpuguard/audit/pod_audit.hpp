#pragma once
// The cluster audit's judgement of one pod, shared by `gpuguard-webhook audit` (a PodList from a file) and
// the in-cluster audit loop (pods by list and watch), so that the two cannot disagree: the admission core's
// examine over the pod as the apiserver would send its creation, plus the one door a pod spec cannot show,
// a node whose runtime does not honour the injected value. Pure: text in, records out.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/admission/review.hpp"
#include "gpuguard/nodereport/node_condition.hpp"
#include "gpuguard/policy/policy.hpp"

namespace gpuguard::audit {

// How a pod's containers can see GPUs they did not ask for, and which of them ask for none: the same for
// every replica of a workload, so the audit loop keeps one copy for all the pods that share it.
struct PodFindings {
  std::vector<admission::Exposure> exposures;
  std::vector<admission::ContainerRef> gpu_less;
};
bool operator==(const PodFindings& a, const PodFindings& b);
std::size_t hash_of(const PodFindings& findings);

// What the audit keeps of one pod: who it is, where it runs, and its findings. Small on purpose: the loop
// keeps one per running pod of the cluster.
struct PodAudit {
  std::string namespace_, name, uid, node;
  long long created = 0;    // metadata.creationTimestamp in unix seconds; 0 when absent or unreadable
  bool exempt = false;      // the policy exempts its namespace or service account
  bool mirror = false;      // a static pod's mirror: the webhook never sees it
  bool has_claims = false;  // spec.resourceClaims: its verdict depends on the claims, judged again as they change
  std::shared_ptr<const PodFindings> findings = no_findings();

  const std::vector<admission::Exposure>& exposures() const { return findings->exposures; }
  const std::vector<admission::ContainerRef>& gpu_less() const { return findings->gpu_less; }
  static std::shared_ptr<const PodFindings> no_findings();
};

// A Pod's JSON (as the API serves it) judged under `policy`; nullopt with `error` set when it is not a Pod
// the admission core can read.
std::optional<PodAudit> audit_pod(std::string_view pod_json, const policy::Policy& policy,
                                  const admission::ClaimLookup* claims, std::string& error);

// A CREATE AdmissionReview of the pod, as the apiserver sends it: `pod_json` is the object, verbatim.
std::string create_review_for(std::string_view pod_json, std::string_view pod_namespace, std::string_view pod_name);

inline constexpr std::string_view kNodeDoor = "node runtime";

// The exposures that the pod's node adds: where the node's GPUIsolation condition is not True, every
// container that requests no GPU sees GPUs (or fails to start) whatever the webhook injected. `condition`
// is null for a node that reports none (no gpuguard device plugin there: no GPUs to see).
std::vector<admission::Exposure> node_exposures(const PodAudit& pod, const nodereport::SeenCondition* condition);

// The doors as metric labels and PolicyReport rules: "image-default", "privileged", "node-runtime", ...
std::string_view reason_of(std::string_view door);

// "2026-11-25T09:40:00Z" (RFC 3339, as metav1.Time writes it; fractions and offsets read too) in unix
// seconds; nullopt when it is not such a time.
std::optional<long long> unix_seconds(std::string_view rfc3339);

}  // namespace gpuguard::audit

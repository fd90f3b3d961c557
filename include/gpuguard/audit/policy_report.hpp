#pragma once
// The audit's findings in the languages admins already read: a `wgpolicyk8s.io/v1alpha2` PolicyReport per
// namespace (the API of Kyverno, Policy Reporter and Trivy Operator), with one result per offending pod.
// Pure: the reports' JSON, ready for a server-side apply, and a hash of what they say, so that a report is
// written only when it changes, by whichever replica leads.
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/admission/review.hpp"
#include "gpuguard/audit/pod_audit.hpp"
#include "gpuguard/policy/policy.hpp"

namespace gpuguard::audit {

inline constexpr std::string_view kReportName = "gpuguard-gpu-exposure";
inline constexpr std::string_view kReportSource = "gpuguard";
inline constexpr std::string_view kReportPolicy = "gpu-isolation";
// What marks the reports gpuguard owns (a label), and what they say (an annotation: the hash of the rest).
inline constexpr std::string_view kManagedByLabel = "app.kubernetes.io/managed-by";
inline constexpr std::string_view kManagedByValue = "gpuguard";
inline constexpr std::string_view kContentHashAnnotation = "gpuguard.io/content-hash";

// A pod with every way its containers see GPUs they did not ask for: its own (pod->exposures) and those its
// node adds (node_exposures), kept apart so that a pass copies no pod's exposures.
struct PodExposures {
  const PodAudit* pod = nullptr;
  std::vector<admission::Exposure> from_node;
};

// fail: exposed; warn: exposed, and the policy's mode is audit or off (nothing is enforced); skip: exposed,
// and the policy exempts it (or it is a static pod, which the webhook never sees): reported, not hidden.
std::string_view result_of(const PodAudit& pod, policy::Mode mode);
inline constexpr std::array<std::string_view, 3> kResults = {"fail", "warn", "skip"};

// Results in one report at the most, so that a report stays far below etcd's object size (1.5 MiB) however
// many pods a namespace has; the summary still counts every pod.
inline constexpr std::size_t kMaxResults = 1000;

struct NamespaceReport {
  std::string namespace_;
  std::string body;  // the PolicyReport's JSON
  std::string hash;  // of everything the report says; also in its kContentHashAnnotation
  std::size_t fail = 0, warn = 0, skip = 0;
};

// The report of one namespace; `pods` in any order (results are sorted by pod name, and only the first
// kMaxResults are written out). `pods` must not be empty: a namespace with nothing exposed has no report.
NamespaceReport policy_report(std::string_view pod_namespace, std::vector<PodExposures> pods, policy::Mode mode);

}  // namespace gpuguard::audit

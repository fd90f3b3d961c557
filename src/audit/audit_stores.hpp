#pragma once
// The audit loop's two caches, fed by kube::Informers: every running pod as its PodAudit (audit_pod, the
// `audit` command's decision), and every node's GPUIsolation condition. Private to src/audit; the unit
// tests feed them as the informers do.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpuguard/audit/audit_loop.hpp"
#include "gpuguard/audit/audit_metrics.hpp"
#include "gpuguard/audit/pod_audit.hpp"
#include "gpuguard/kube/store.hpp"
#include "gpuguard/nodereport/node_condition.hpp"

namespace gpuguard::audit {

// Pods that hold a node's attention: not yet finished.
inline constexpr std::string_view kPodSelector = "status.phase!=Succeeded,status.phase!=Failed";

using NodeConditions = std::map<std::string, nodereport::SeenCondition, std::less<>>;

// A pod that can see GPUs it did not ask for, as one pass found it.
struct Offender {
  std::shared_ptr<const PodAudit> pod;         // shared with the store: a pass copies no pod
  std::vector<admission::Exposure> from_node;  // what its node adds to pod->exposures
};

// Every running pod as its PodAudit, keyed by namespace/name. The informer's thread writes; the pass reads.
class PodStore final : public kube::Store {
 public:
  PodStore(PolicySource policy, const admission::ClaimLookup* claims, AuditMetrics& metrics)
      : policy_(std::move(policy)), claims_(claims), metrics_(metrics) {}

  // A re-list replaces pods in place and then forgets those it did not list, rather than building the
  // new set aside: the set is the largest thing the audit holds, and two of them would double its peak.
  void list_begin() override {
    ++generation_;
    listing_ = policy_();
  }
  void list_item(std::string_view object) override { take(object, *listing_); }
  void list_end(bool complete) override {
    if (!complete) return;  // what was listed is current; what was not stays until a complete list
    const std::lock_guard lock(mutex_);
    std::erase_if(pods_, [this](const auto& item) { return item.second.generation != generation_; });
    forget_unshared_findings();
    judged_under_ = listing_;
    ++changes_;
  }
  void apply(std::string_view type, std::string_view object) override;

  std::uint64_t changes() const {
    const std::lock_guard lock(mutex_);
    return changes_;
  }
  // The policy the pods were judged under: that of the last complete list.
  std::shared_ptr<const policy::Policy> judged_under() const {
    const std::lock_guard lock(mutex_);
    return judged_under_;
  }

  // The pods that can see GPUs, their node's verdict joined in; pods with claims judged again first.
  std::vector<Offender> offenders(const NodeConditions& nodes, std::size_t& pods) const;

 private:
  struct Entry {
    std::shared_ptr<const PodAudit> audit;
    std::uint64_t generation = 0;  // of the list (or the watch after it) that last saw the pod
    std::string json;              // only for a pod with DRA claims, whose verdict can change with them
  };
  using Pods = std::unordered_map<std::string, Entry>;

  // The pod judged and kept, in place of what was kept of it; false (counted and logged) when it cannot
  // be read.
  bool take(std::string_view object, const policy::Policy& policy);

  PolicySource policy_;
  const admission::ClaimLookup* claims_;
  AuditMetrics& metrics_;
  std::shared_ptr<const policy::Policy> listing_;  // the informer's thread's own
  std::uint64_t generation_ = 0;                   // likewise
  // One copy of each distinct PodFindings, which the replicas of a workload share (likewise the informer
  // thread's own): by hash, the copies still held by some pod.
  std::unordered_map<std::size_t, std::vector<std::weak_ptr<const PodFindings>>> findings_;
  std::shared_ptr<const PodFindings> shared(std::shared_ptr<const PodFindings> findings);
  void forget_unshared_findings();
  mutable std::mutex mutex_;
  Pods pods_;
  std::shared_ptr<const policy::Policy> judged_under_;
  std::uint64_t changes_ = 0;
};

// Every node's GPUIsolation condition (nullopt: it has none). Only a change of a condition counts as a
// change: the kubelet's heartbeats do not start passes.
class NodeStore final : public kube::Store {
 public:
  using Conditions = std::map<std::string, std::optional<nodereport::SeenCondition>, std::less<>>;

  void list_begin() override {
    fresh_.clear();
    fresh_gpu_nodes_.clear();
  }
  void list_item(std::string_view object) override {
    auto name = name_of(object);
    if (!name) return;
    if (nodereport::is_gpu_node(object)) fresh_gpu_nodes_.insert(*name);
    fresh_.insert_or_assign(std::move(*name), nodereport::seen_condition(object));
  }
  void list_end(bool complete) override {
    if (complete) {
      const std::lock_guard lock(mutex_);
      nodes_.swap(fresh_);
      gpu_nodes_.swap(fresh_gpu_nodes_);
      ++changes_;
    }
    Conditions().swap(fresh_);
    std::set<std::string, std::less<>>().swap(fresh_gpu_nodes_);
  }
  void apply(std::string_view type, std::string_view object) override {
    auto name = name_of(object);
    if (!name) return;
    auto condition = nodereport::seen_condition(object);
    const bool gpu = nodereport::is_gpu_node(object);
    const std::lock_guard lock(mutex_);
    if (type == "DELETED") {
      nodes_.erase(*name);
      gpu_nodes_.erase(*name);
      ++changes_;
      return;
    }
    if (gpu != gpu_nodes_.contains(*name)) {
      ++changes_;
      if (gpu) {
        gpu_nodes_.insert(*name);
      } else {
        gpu_nodes_.erase(*name);
      }
    }
    const auto known = nodes_.find(*name);
    const bool same =
        known != nodes_.end() && known->second.has_value() == condition.has_value() &&
        (!condition || (known->second->status == condition->status && known->second->reason == condition->reason));
    if (!same) ++changes_;
    nodes_.insert_or_assign(std::move(*name), std::move(condition));
  }

  std::uint64_t changes() const {
    const std::lock_guard lock(mutex_);
    return changes_;
  }
  // The conditions of the nodes that report one, and every node's verdict counted into `verdicts`: a
  // node without the condition is "unreported" when it has GPUs, "no-gpu" when it has none.
  NodeConditions snapshot(std::map<std::string, std::size_t>& verdicts) const {
    NodeConditions reporting;
    const std::lock_guard lock(mutex_);
    for (const auto& [name, condition] : nodes_) {
      if (!condition && !gpu_nodes_.contains(name)) {
        ++verdicts["no-gpu"];
        continue;
      }
      const auto reason = condition ? std::optional<std::string_view>(condition->reason) : std::nullopt;
      ++verdicts[std::string(verdict_label(reason))];
      if (condition) reporting.emplace(name, *condition);
    }
    return reporting;
  }

 private:
  static std::optional<std::string> name_of(std::string_view object);

  Conditions fresh_;
  std::set<std::string, std::less<>> fresh_gpu_nodes_;
  mutable std::mutex mutex_;
  Conditions nodes_;
  std::set<std::string, std::less<>> gpu_nodes_;  // the nodes with GPUs, with or without the condition
  std::uint64_t changes_ = 0;
};

}  // namespace gpuguard::audit

#pragma once
// What the extender knows about the cluster: for every node its allocatable extended resources, and what
// the pods bound to it and not finished occupy. Fed from the Kubernetes API through its two kube::Store
// faces, read by the filter and prioritize verbs on the server's threads. No I/O.
//
// Sized for 150,000 pods: a pod is decoded straight from its JSON text into a record of a node number and
// a few (resource number, count) pairs, node and resource names are interned, and pods that hold no
// extended resource (most of them) are not kept at all. docs/benchmarks.md has the measured bytes per pod.
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpuguard/extender/objects.hpp"
#include "gpuguard/kube/store.hpp"

namespace gpuguard::extender {

struct NodeState {
  bool known = false;  // listed or watched; false for a name the API has not shown us
  ResourceCounts allocatable;
  ResourceCounts allocated;
};

// Names interned as small numbers, each held by a count of references and freed at zero, so that the
// names of nodes long gone (an autoscaled cluster sees many) do not pile up.
class NameTable {
 public:
  std::uint32_t acquire(std::string_view name);
  // True when that was the last reference: the number is free for another name.
  bool release(std::uint32_t id);
  std::optional<std::uint32_t> find(std::string_view name) const;
  const std::string& name(std::uint32_t id) const { return entries_[id].name; }
  std::size_t capacity() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    std::uint32_t references = 0;
  };
  std::deque<Entry> entries_;  // a deque: the index's views into names survive growth
  std::vector<std::uint32_t> free_;
  std::unordered_map<std::string_view, std::uint32_t> index_;
};

class ClusterState {
 public:
  ClusterState();
  ~ClusterState();
  ClusterState(const ClusterState&) = delete;
  ClusterState& operator=(const ClusterState&) = delete;

  // For kube::Informers. A list is built aside and swapped in when complete; an event applies at once.
  // Pods that are not bound to a node or have finished (Succeeded, Failed) are dropped.
  kube::Store& pods();
  kube::Store& nodes();

  NodeState node(std::string_view name) const;
  // Pods kept: bound, not finished, and holding at least one extended resource.
  std::size_t pod_count() const;
  std::size_t node_count() const;

 private:
  struct Usage {
    std::uint32_t resource;
    std::int64_t count;
  };
  using Usages = std::vector<Usage>;
  struct PodRecord {
    std::uint32_t node;
    Usages requests;
  };
  struct NodeRecord {
    bool listed = false;
    Usages allocatable;
    Usages allocated;
  };
  using PodMap = std::unordered_map<std::string, PodRecord>;
  class PodStore;
  class NodeStore;

  // All of these run under the unique lock.
  Usages intern(const ResourceCounts& counts);
  void release(const Usages& usages);
  std::uint32_t acquire_node(std::string_view name);
  void release_node(std::uint32_t id);
  std::optional<PodRecord> record_of(const PodUsage& pod);
  void release(const PodRecord& record);
  void add_allocated(const PodRecord& record, int sign);
  void remove_pod(const std::string& key);
  void replace_pods(PodMap fresh);
  void replace_nodes(std::vector<std::pair<std::uint32_t, Usages>>&& fresh);
  void set_node(std::uint32_t id, Usages allocatable);
  void unlist_node(std::uint32_t id);
  ResourceCounts counts_of(const Usages& usages) const;

  mutable std::shared_mutex mutex_;
  NameTable node_names_, resource_names_;
  std::vector<NodeRecord> nodes_;  // by node name number
  std::size_t listed_nodes_ = 0;
  PodMap pods_;  // by uid
  std::unique_ptr<PodStore> pod_store_;
  std::unique_ptr<NodeStore> node_store_;
};

}  // namespace gpuguard::extender

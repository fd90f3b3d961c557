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
#include <functional>
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
  // The quantities of its status.allocatable the extender cannot count as written (objects.hpp): no pod
  // asking for one of those is placed there, rather than trusting a count that is nonsense.
  Unreadable unreadable;
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

// Told of each object whose quantities could not be counted as written, for the log: a node when it
// becomes so (not again on a re-list, again after it was readable in between), a pod when it is first
// kept (a list names at most 64 and then says how many more, with an empty name). resource is "pods" or
// "nodes"; name is the node's name or the pod's key; why is Unreadable::first(). Called on the
// informer's thread, outside the state's lock.
using UnreadableReport = std::function<void(std::string_view resource, std::string_view name, std::string_view why)>;

class ClusterState {
 public:
  explicit ClusterState(UnreadableReport report = {});
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
  // How many objects of "pods" or "nodes" have been reported (UnreadableReport) since the start.
  std::size_t unreadable_count(std::string_view resource) const;

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
    Unreadable unreadable;
    Usages allocatable;
    Usages allocated;
  };
  struct NodeListing {
    std::uint32_t id;
    Usages allocatable;
    Unreadable unreadable;
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
  void replace_nodes(std::vector<NodeListing>&& fresh);
  // True when the node was not already known to be unreadable and now is: the moment to report it.
  bool set_node(NodeListing listing);
  void unlist_node(std::uint32_t id);
  ResourceCounts counts_of(const Usages& usages) const;
  void report(std::string_view resource, std::string_view name, std::string_view why) const;

  const UnreadableReport report_;
  mutable std::shared_mutex mutex_;
  NameTable node_names_, resource_names_;
  std::vector<NodeRecord> nodes_;  // by node name number
  std::size_t listed_nodes_ = 0;
  std::size_t unreadable_nodes_ = 0, unreadable_pods_ = 0;
  PodMap pods_;  // by uid
  std::unique_ptr<PodStore> pod_store_;
  std::unique_ptr<NodeStore> node_store_;
};

}  // namespace gpuguard::extender

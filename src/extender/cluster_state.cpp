#include "gpuguard/extender/cluster_state.hpp"

#include <algorithm>
#include <mutex>

namespace gpuguard::extender {
namespace {

constexpr std::int64_t kLargestSum = std::int64_t{1} << 62;

}  // namespace

std::uint32_t NameTable::acquire(std::string_view name) {
  if (const auto found = index_.find(name); found != index_.end()) {
    ++entries_[found->second].references;
    return found->second;
  }
  std::uint32_t id;
  if (free_.empty()) {
    id = static_cast<std::uint32_t>(entries_.size());
    entries_.emplace_back();
  } else {
    id = free_.back();
    free_.pop_back();
  }
  entries_[id] = {std::string(name), 1};
  index_.emplace(entries_[id].name, id);
  return id;
}

bool NameTable::release(std::uint32_t id) {
  Entry& entry = entries_[id];
  if (--entry.references > 0) return false;
  index_.erase(entry.name);
  entry.name = std::string{};  // gives the bytes back; a kept capacity would be the name's size again
  free_.push_back(id);
  return true;
}

std::optional<std::uint32_t> NameTable::find(std::string_view name) const {
  const auto found = index_.find(name);
  if (found == index_.end()) return std::nullopt;
  return found->second;
}

// A list of pods is decoded into records aside from the live ones, which go on serving until it is
// complete; the numbers the new records take are references like any other. Its unreadable pods are
// reported only once the list is complete, so that a list cut short and retried says nothing twice.
class ClusterState::PodStore final : public kube::Store {
 public:
  explicit PodStore(ClusterState& state) : state_(state) {}

  void list_begin() override { drop(); }
  void list_item(std::string_view object) override {
    const std::optional<PodUsage> pod = decode_pod(object);
    if (!pod) return;
    std::unique_lock lock(state_.mutex_);
    std::optional<PodRecord> record = state_.record_of(*pod);
    if (!record) return;
    if (const auto found = pending_.find(pod->key); found != pending_.end()) {
      state_.release(found->second);  // the same uid twice in one list: the later wins
      found->second = std::move(*record);
      return;
    }
    pending_.emplace(pod->key, std::move(*record));
    if (!pod->unreadable.any() || state_.pods_.contains(pod->key)) return;  // known: reported before
    if (reports_.size() < kNamedReports) {
      reports_.emplace_back(pod->key, pod->unreadable.first());
    } else {
      ++unnamed_;
    }
  }
  void list_end(bool complete) override {
    if (!complete) return drop();
    std::vector<std::pair<std::string, std::string>> reports;
    std::size_t unnamed = 0;
    {
      std::unique_lock lock(state_.mutex_);
      state_.replace_pods(std::move(pending_));
      pending_ = {};
      reports.swap(reports_);
      std::swap(unnamed, unnamed_);
      state_.unreadable_pods_ += reports.size() + unnamed;
    }
    for (const auto& [key, why] : reports) state_.report("pods", key, why);
    if (unnamed > 0) {
      state_.report("pods", "", std::to_string(unnamed) + " more pods in this list, not named one by one");
    }
  }
  void apply(std::string_view type, std::string_view object) override {
    const std::optional<PodUsage> pod = decode_pod(object);
    if (!pod) return;
    {
      std::unique_lock lock(state_.mutex_);
      const bool known = state_.pods_.contains(pod->key);
      state_.remove_pod(pod->key);
      if (type == "DELETED") return;
      std::optional<PodRecord> record = state_.record_of(*pod);  // MODIFIED may mean finished: no record
      if (!record) return;
      state_.add_allocated(*record, +1);
      state_.pods_.emplace(pod->key, std::move(*record));
      if (known || !pod->unreadable.any()) return;
      ++state_.unreadable_pods_;
    }
    state_.report("pods", pod->key, pod->unreadable.first());
  }

 private:
  // A list names at most this many unreadable pods in the log, and counts the rest in one line.
  static constexpr std::size_t kNamedReports = 64;

  void drop() {
    std::unique_lock lock(state_.mutex_);
    for (const auto& [key, record] : pending_) state_.release(record);
    pending_ = {};
    reports_.clear();
    unnamed_ = 0;
  }

  ClusterState& state_;
  PodMap pending_;
  std::vector<std::pair<std::string, std::string>> reports_;  // (key, why), at most kNamedReports
  std::size_t unnamed_ = 0;
};

class ClusterState::NodeStore final : public kube::Store {
 public:
  explicit NodeStore(ClusterState& state) : state_(state) {}

  void list_begin() override { drop(); }
  void list_item(std::string_view object) override {
    std::optional<NodeCapacity> node = decode_node(object);
    if (!node) return;
    std::unique_lock lock(state_.mutex_);
    pending_.push_back(
        {state_.acquire_node(node->name), state_.intern(node->allocatable), std::move(node->unreadable)});
  }
  void list_end(bool complete) override {
    if (!complete) return drop();
    std::vector<std::pair<std::string, std::string>> reports;
    {
      std::unique_lock lock(state_.mutex_);
      // Those unreadable now and not before; a node listed twice counts as its last listing, as set_node
      // makes it.
      std::vector<bool> seen(state_.nodes_.size());
      for (auto listing = pending_.rbegin(); listing != pending_.rend(); ++listing) {
        if (seen[listing->id]) continue;
        seen[listing->id] = true;
        if (listing->unreadable.any() && !state_.nodes_[listing->id].unreadable.any()) {
          reports.emplace_back(state_.node_names_.name(listing->id), listing->unreadable.first());
        }
      }
      state_.replace_nodes(std::move(pending_));
      pending_ = {};
      state_.unreadable_nodes_ += reports.size();
    }
    for (const auto& [name, why] : reports) state_.report("nodes", name, why);
  }
  void apply(std::string_view type, std::string_view object) override {
    std::optional<NodeCapacity> node = decode_node(object);
    if (!node) return;
    const std::string why = node->unreadable.first();
    {
      std::unique_lock lock(state_.mutex_);
      const std::uint32_t id = state_.acquire_node(node->name);
      if (type == "DELETED") {
        state_.unlist_node(id);
        state_.release_node(id);
        return;
      }
      if (!state_.set_node({id, state_.intern(node->allocatable), std::move(node->unreadable)})) return;
      ++state_.unreadable_nodes_;
    }
    state_.report("nodes", node->name, why);
  }

 private:
  void drop() {
    std::unique_lock lock(state_.mutex_);
    for (const NodeListing& listing : pending_) {
      state_.release(listing.allocatable);
      state_.release_node(listing.id);
    }
    pending_.clear();
  }

  ClusterState& state_;
  std::vector<NodeListing> pending_;
};

ClusterState::ClusterState(UnreadableReport report)
    : report_(std::move(report)),
      pod_store_(std::make_unique<PodStore>(*this)),
      node_store_(std::make_unique<NodeStore>(*this)) {}

ClusterState::~ClusterState() = default;

void ClusterState::report(std::string_view resource, std::string_view name, std::string_view why) const {
  if (report_) report_(resource, name, why);
}

kube::Store& ClusterState::pods() { return *pod_store_; }
kube::Store& ClusterState::nodes() { return *node_store_; }

ClusterState::Usages ClusterState::intern(const ResourceCounts& counts) {
  Usages usages;
  usages.reserve(counts.size());
  for (const auto& [name, count] : counts) usages.push_back({resource_names_.acquire(name), count});
  return usages;
}

void ClusterState::release(const Usages& usages) {
  for (const Usage& usage : usages) resource_names_.release(usage.resource);
}

std::uint32_t ClusterState::acquire_node(std::string_view name) {
  const std::uint32_t id = node_names_.acquire(name);
  if (nodes_.size() < node_names_.capacity()) nodes_.resize(node_names_.capacity());
  return id;
}

void ClusterState::release_node(std::uint32_t id) {
  if (node_names_.release(id)) nodes_[id] = {};
}

std::optional<ClusterState::PodRecord> ClusterState::record_of(const PodUsage& pod) {
  if (!pod.occupies_node || pod.requests.empty()) return std::nullopt;  // most pods: nothing to keep
  return PodRecord{acquire_node(pod.node), intern(pod.requests)};
}

void ClusterState::release(const PodRecord& record) {
  release(record.requests);
  release_node(record.node);
}

// Saturating, so that no sum can overflow; subtracting never goes below zero, and a resource at zero is
// dropped, so a node's allocated names only resources some kept pod still holds.
void ClusterState::add_allocated(const PodRecord& record, int sign) {
  Usages& allocated = nodes_[record.node].allocated;
  for (const Usage& usage : record.requests) {
    auto at = std::find_if(allocated.begin(), allocated.end(),
                           [&](const Usage& entry) { return entry.resource == usage.resource; });
    if (at == allocated.end()) {
      if (sign < 0) continue;
      at = allocated.insert(allocated.end(), {usage.resource, 0});
    }
    if (sign > 0) {
      at->count = usage.count > kLargestSum - at->count ? kLargestSum : at->count + usage.count;
    } else {
      at->count = std::max<std::int64_t>(at->count - usage.count, 0);
      if (at->count == 0) allocated.erase(at);
    }
  }
}

void ClusterState::remove_pod(const std::string& key) {
  const auto found = pods_.find(key);
  if (found == pods_.end()) return;
  add_allocated(found->second, -1);
  release(found->second);
  pods_.erase(found);
}

void ClusterState::replace_pods(PodMap fresh) {
  // The fresh records hold their own references, so releasing the old ones frees only what is gone.
  for (const auto& [key, record] : pods_) release(record);
  pods_ = std::move(fresh);
  for (NodeRecord& node : nodes_) node.allocated.clear();
  for (const auto& [key, record] : pods_) add_allocated(record, +1);
}

// The caller holds a reference to `listing.id`: it becomes the listing's, or is dropped if the node is
// listed.
bool ClusterState::set_node(NodeListing listing) {
  NodeRecord& record = nodes_[listing.id];
  release(record.allocatable);
  record.allocatable = std::move(listing.allocatable);
  const bool became_unreadable = listing.unreadable.any() && !record.unreadable.any();
  record.unreadable = std::move(listing.unreadable);
  if (record.listed) {
    release_node(listing.id);
  } else {
    record.listed = true;
    ++listed_nodes_;
  }
  return became_unreadable;
}

void ClusterState::unlist_node(std::uint32_t id) {
  NodeRecord& record = nodes_[id];
  if (!record.listed) return;
  record.listed = false;
  record.unreadable = {};
  --listed_nodes_;
  release(record.allocatable);
  record.allocatable.clear();
  release_node(id);  // the listing's reference; the caller's keeps the record alive
}

void ClusterState::replace_nodes(std::vector<NodeListing>&& fresh) {
  std::vector<bool> kept(nodes_.size());
  for (const NodeListing& listing : fresh) kept[listing.id] = true;
  for (std::uint32_t id = 0; id < nodes_.size(); ++id) {
    if (nodes_[id].listed && !kept[id]) unlist_node(id);
  }
  for (NodeListing& listing : fresh) set_node(std::move(listing));
}

ResourceCounts ClusterState::counts_of(const Usages& usages) const {
  ResourceCounts counts;
  for (const Usage& usage : usages) counts.emplace(resource_names_.name(usage.resource), usage.count);
  return counts;
}

NodeState ClusterState::node(std::string_view name) const {
  std::shared_lock lock(mutex_);
  NodeState state;
  const std::optional<std::uint32_t> id = node_names_.find(name);
  if (!id) return state;
  const NodeRecord& record = nodes_[*id];
  state.known = record.listed;
  state.unreadable = record.unreadable;
  state.allocatable = counts_of(record.allocatable);
  state.allocated = counts_of(record.allocated);
  return state;
}

std::size_t ClusterState::pod_count() const {
  std::shared_lock lock(mutex_);
  return pods_.size();
}

std::size_t ClusterState::unreadable_count(std::string_view resource) const {
  std::shared_lock lock(mutex_);
  return resource == "nodes" ? unreadable_nodes_ : unreadable_pods_;
}

std::size_t ClusterState::node_count() const {
  std::shared_lock lock(mutex_);
  return listed_nodes_;
}

}  // namespace gpuguard::extender

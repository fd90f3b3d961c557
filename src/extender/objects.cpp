// The scheduler's effective-request rule once, and the two readers that feed it: a DOM for ExtenderArgs,
// simdjson On-Demand for the cache. Where the two could disagree (duplicate keys, odd numbers) the
// On-Demand reader does what nlohmann does: the last duplicate wins; the fuzzer holds them to it.
#include "gpuguard/extender/objects.hpp"

#include <algorithm>
#include <cmath>

#include <simdjson.h>
#include <nlohmann/json.hpp>

#include "gpuguard/k8s/json_fields.hpp"
#include "gpuguard/k8s/quantity.hpp"
#include "gpuguard/kube/store.hpp"

namespace gpuguard::extender {
namespace {

using k8s::member;
using k8s::string_at;
using nlohmann::json;
namespace od = simdjson::ondemand;

// No node has 2^40 of anything. Capping each container's count there keeps every sum below 2^62 (a
// pod spec cannot hold 2^22 containers), however absurd the quantities a pod was created with.
constexpr std::int64_t kLargestCount = std::int64_t{1} << 40;
constexpr std::int64_t kLargestSum = std::int64_t{1} << 62;

constexpr const char* kNegativeOrMalformed = "not a non-negative quantity";
constexpr const char* kBeyond = "beyond the 2^40 the extender counts";
constexpr const char* kNotAQuantity = "not a quantity";

// A count read from a quantity, and why it is not the count written there when it is not: a quantity
// the extender cannot read counts as 0, one beyond kLargestCount as kLargestCount.
struct Count {
  std::int64_t n = 0;
  const char* unreadable = nullptr;
};

Count count_of_text(std::string_view quantity) {
  const std::optional<std::int64_t> n = k8s::quantity_count(quantity);
  if (!n) return {0, kNegativeOrMalformed};
  if (*n > kLargestCount) return {kLargestCount, kBeyond};
  return {*n};
}
Count count_of_unsigned(std::uint64_t n) {
  if (n > std::uint64_t{kLargestCount}) return {kLargestCount, kBeyond};
  return {static_cast<std::int64_t>(n)};
}
Count count_of_double(double n) {
  if (!(n >= 0)) return {0, kNegativeOrMalformed};  // NaN too
  if (std::ceil(n) > double(kLargestCount)) return {kLargestCount, kBeyond};
  return {static_cast<std::int64_t>(std::ceil(n))};
}

// Saturating, so that no sum can overflow; below the cap (every real cluster) it is exact.
void add_to(ResourceCounts& total, const ResourceCounts& more) {
  for (const auto& [name, n] : more) {
    std::int64_t& sum = total[name];
    sum = n > kLargestSum - sum ? kLargestSum : sum + n;
  }
}

void max_into(ResourceCounts& total, const ResourceCounts& other) {
  for (const auto& [name, n] : other) total[name] = std::max(total[name], n);
}

// An extended resource's count, kept only when positive; the last duplicate key decides.
void set_count(ResourceCounts& counts, std::string_view name, Count count, Unreadable& unreadable) {
  if (name.find('/') == std::string_view::npos) return;
  if (count.unreadable != nullptr) unreadable.note(name, count.unreadable);
  const std::int64_t n = count.n;
  if (n > 0) {
    counts.insert_or_assign(std::string(name), n);
  } else if (const auto found = counts.find(name); found != counts.end()) {
    counts.erase(found);
  }
}

ContainerRequests with_limits(ResourceCounts requests, const ResourceCounts& limits, bool sidecar) {
  for (const auto& [name, limit] : limits) requests.try_emplace(name, limit);
  return {std::move(requests), sidecar};
}

// --- The DOM reader. ---

// Quantities are strings on the wire; JSON numbers are accepted too.
Count count_of(const json& quantity) {
  if (quantity.is_string()) return count_of_text(quantity.get_ref<const std::string&>());
  if (quantity.is_number_unsigned()) return count_of_unsigned(quantity.get<std::uint64_t>());
  if (quantity.is_number()) return count_of_double(quantity.get<double>());
  return {0, kNotAQuantity};
}

ResourceCounts extended_resources(const json* list, Unreadable& unreadable) {
  ResourceCounts counts;
  if (list == nullptr || !list->is_object()) return counts;
  for (const auto& [name, quantity] : list->items()) set_count(counts, name, count_of(quantity), unreadable);
  return counts;
}

std::vector<ContainerRequests> containers_of(const json* spec, std::string_view list, Unreadable& unreadable) {
  std::vector<ContainerRequests> containers;
  const json* array = spec == nullptr ? nullptr : member(*spec, list);
  if (array == nullptr || !array->is_array()) return containers;
  for (const json& container : *array) {
    const json* resources = member(container, "resources");
    const bool sidecar = string_at(container, {"restartPolicy"}) == "Always";
    if (resources == nullptr) {
      containers.push_back({{}, sidecar});
      continue;
    }
    containers.push_back(with_limits(extended_resources(member(*resources, "requests"), unreadable),
                                     extended_resources(member(*resources, "limits"), unreadable), sidecar));
  }
  return containers;
}

// --- The On-Demand reader: one pass over the text, no DOM. Errors read as absent, as in the DOM reader. ---

Count count_of(od::value quantity) {
  constexpr Count kNotAQuantityCount{0, kNotAQuantity};
  od::json_type type;
  if (quantity.type().get(type)) return kNotAQuantityCount;
  if (type == od::json_type::string) {
    std::string_view text;
    return quantity.get_string().get(text) ? kNotAQuantityCount : count_of_text(text);
  }
  if (type != od::json_type::number) return kNotAQuantityCount;
  const std::string_view token = quantity.raw_json_token();
  od::number number;
  // simdjson refuses an integer beyond 64 bits, which nlohmann reads as a double: beyond the cap either way.
  if (quantity.get_number().get(number)) {
    return token.starts_with('-') ? Count{0, kNegativeOrMalformed} : Count{kLargestCount, kBeyond};
  }
  switch (number.get_number_type()) {
    case od::number_type::unsigned_integer: return count_of_unsigned(number.get_uint64());
    case od::number_type::signed_integer:
      return number.get_int64() < 0 ? Count{0, kNegativeOrMalformed}
                                    : count_of_unsigned(static_cast<std::uint64_t>(number.get_int64()));
    default: return count_of_double(number.get_double());
  }
}

ResourceCounts extended_resources(od::value list, Unreadable& unreadable) {
  ResourceCounts counts;
  od::object object;
  if (list.get_object().get(object)) return counts;
  for (auto field : object) {
    std::string_view name;
    od::value quantity;
    if (field.unescaped_key().get(name) || field.value().get(quantity)) return {};
    if (name.find('/') == std::string_view::npos) continue;  // cpu, memory: skipped unread
    set_count(counts, name, count_of(quantity), unreadable);
  }
  return counts;
}

std::vector<ContainerRequests> containers_of(od::value list, Unreadable& unreadable) {
  std::vector<ContainerRequests> containers;
  od::array array;
  if (list.get_array().get(array)) return containers;
  for (auto element : array) {
    od::object container;
    ResourceCounts requests, limits;
    bool sidecar = false;
    if (element.get_object().get(container)) {
      containers.push_back({});  // the DOM reader counts a non-object as a container asking nothing
      continue;
    }
    for (auto field : container) {
      std::string_view key, policy;
      if (field.unescaped_key().get(key)) break;
      if (key == "restartPolicy") {
        sidecar = !field.value().get_string().get(policy) && policy == "Always";
      } else if (key == "resources") {
        requests.clear();
        limits.clear();
        od::object resources;
        if (field.value().get_object().get(resources)) continue;
        for (auto kind : resources) {
          std::string_view name;
          od::value counts;
          if (kind.unescaped_key().get(name) || kind.value().get(counts)) break;
          if (name == "requests") requests = extended_resources(counts, unreadable);
          if (name == "limits") limits = extended_resources(counts, unreadable);
        }
      }
    }
    containers.push_back(with_limits(std::move(requests), limits, sidecar));
  }
  return containers;
}

std::string string_of(od::value value) {
  std::string_view text;
  return value.get_string().get(text) ? std::string{} : std::string(text);
}

// The parser's buffers grow to the largest object seen and are reused: one per thread that decodes.
od::parser& parser() {
  thread_local od::parser parser;
  return parser;
}

bool iterate_object(std::string_view text, od::document& document, od::object& object) {
  const simdjson::padded_string_view padded(text.data(), text.size(), text.size() + kube::kJsonPadding);
  return !parser().iterate(padded).get(document) && !document.get_object().get(object);
}

}  // namespace

bool Unreadable::names(std::string_view resource) const {
  return more || std::any_of(entries.begin(), entries.end(), [&](const Entry& e) { return e.resource == resource; });
}

std::string Unreadable::first() const {
  return entries.empty() ? std::string{} : entries.front().resource + ": " + entries.front().why;
}

void Unreadable::note(std::string_view resource, const char* why) {
  constexpr std::size_t kLongestName = 317;  // a qualified resource name: 253 + '/' + 63
  resource = resource.substr(0, kLongestName);
  if (std::any_of(entries.begin(), entries.end(), [&](const Entry& e) { return e.resource == resource; })) return;
  if (entries.size() == kKept) {
    more = true;
    return;
  }
  entries.push_back({std::string(resource), why});
}

ResourceCounts effective_requests(const std::vector<ContainerRequests>& containers,
                                  const std::vector<ContainerRequests>& init_containers) {
  ResourceCounts total;
  for (const ContainerRequests& container : containers) add_to(total, container.requests);
  // Sidecars run alongside everything after them; a plain init container runs alone beside the
  // sidecars started before it.
  ResourceCounts sidecars, init_peak;
  for (const ContainerRequests& container : init_containers) {
    ResourceCounts requests = container.requests;
    if (container.sidecar) {
      add_to(total, requests);
      add_to(sidecars, requests);
      requests = sidecars;
    } else {
      add_to(requests, sidecars);
    }
    max_into(init_peak, requests);
  }
  max_into(total, init_peak);
  std::erase_if(total, [](const auto& entry) { return entry.second == 0; });
  return total;
}

ResourceCounts pod_requests(const json& pod, Unreadable* unreadable) {
  const json* spec = member(pod, "spec");
  if (spec == nullptr) return {};
  Unreadable found;
  auto containers = containers_of(spec, "containers", found);
  auto init_containers = containers_of(spec, "initContainers", found);
  if (unreadable != nullptr) *unreadable = std::move(found);
  return effective_requests(containers, init_containers);
}

ResourceCounts node_allocatable(const json& node, Unreadable* unreadable) {
  const json* status = member(node, "status");
  Unreadable found;
  ResourceCounts counts = extended_resources(status == nullptr ? nullptr : member(*status, "allocatable"), found);
  if (unreadable != nullptr) *unreadable = std::move(found);
  return counts;
}

std::optional<PodUsage> decode_pod(std::string_view text) {
  od::document document;
  od::object pod;
  if (!iterate_object(text, document, pod)) return std::nullopt;
  std::string uid, name, pod_namespace, node, phase;
  Unreadable unreadable;  // in document order, a repeated key's discarded value included
  std::vector<ContainerRequests> containers, init_containers;
  for (auto field : pod) {
    std::string_view key;
    od::object object;
    if (field.unescaped_key().get(key)) break;
    if (key != "metadata" && key != "spec" && key != "status") continue;
    const std::string section(key);
    // A repeated section replaces the earlier one, as in a DOM.
    if (section == "metadata") {
      uid.clear();
      name.clear();
      pod_namespace.clear();
    } else if (section == "spec") {
      node.clear();
      containers.clear();
      init_containers.clear();
    } else {
      phase.clear();
    }
    if (field.value().get_object().get(object)) continue;
    for (auto entry : object) {
      std::string_view name_of_entry;
      od::value value;
      if (entry.unescaped_key().get(name_of_entry) || entry.value().get(value)) break;
      const std::string entry_key(name_of_entry);
      if (section == "metadata") {
        if (entry_key == "uid") uid = string_of(value);
        if (entry_key == "name") name = string_of(value);
        if (entry_key == "namespace") pod_namespace = string_of(value);
      } else if (section == "spec") {
        if (entry_key == "nodeName") node = string_of(value);
        if (entry_key == "containers") containers = containers_of(value, unreadable);
        if (entry_key == "initContainers") init_containers = containers_of(value, unreadable);
      } else if (entry_key == "phase") {
        phase = string_of(value);
      }
    }
  }
  PodUsage usage;
  usage.key = uid.empty() ? pod_namespace + "/" + name : uid;
  usage.occupies_node = !node.empty() && phase != "Succeeded" && phase != "Failed";
  usage.node = std::move(node);
  usage.requests = effective_requests(containers, init_containers);
  usage.unreadable = std::move(unreadable);
  return usage;
}

std::optional<NodeCapacity> decode_node(std::string_view text) {
  od::document document;
  od::object node;
  if (!iterate_object(text, document, node)) return std::nullopt;
  NodeCapacity capacity;
  for (auto field : node) {
    std::string_view key;
    od::object object;
    if (field.unescaped_key().get(key)) break;
    const bool metadata = key == "metadata", status = key == "status";
    if (metadata) capacity.name.clear();
    if (status) {
      capacity.allocatable.clear();
      capacity.unreadable = {};
    }
    if ((!metadata && !status) || field.value().get_object().get(object)) continue;
    for (auto entry : object) {
      std::string_view name;
      od::value value;
      if (entry.unescaped_key().get(name) || entry.value().get(value)) break;
      if (metadata && name == "name") capacity.name = string_of(value);
      if (status && name == "allocatable") {
        capacity.unreadable = {};  // a repeated key: the last decides, as in a DOM
        capacity.allocatable = extended_resources(value, capacity.unreadable);
      }
    }
  }
  return capacity;
}

}  // namespace gpuguard::extender

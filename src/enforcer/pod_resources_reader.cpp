// The kubelet's pod-resources answer read as a stream (include/gpuguard/enforcer/pod_resources_reader.hpp).
// Field numbers are k8s.io/kubelet/pkg/apis/podresources/v1's (proto/podresources/v1/api.proto).
#include "gpuguard/enforcer/pod_resources_reader.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "gpuguard/nri/messages.hpp"
#include "gpuguard/nri/proto_reader.hpp"

namespace gpuguard::enforcer {
namespace {

using enforcement::kNameMax;
using nri::ProtoReader;

constexpr std::uint32_t kListPods = 1;                                                 // ListPodResourcesResponse
constexpr std::uint32_t kPodName = 1, kPodNamespace = 2, kPodContainers = 3;           // PodResources
constexpr std::uint32_t kContainerName = 1, kContainerDevices = 2, kContainerDra = 5;  // ContainerResources
constexpr std::uint32_t kDevicesResource = 1, kDevicesIds = 2;                         // ContainerDevices
constexpr std::uint32_t kDraClaimResources = 4;                                        // DynamicResource
constexpr std::uint32_t kClaimCdiDevices = 1;                                          // ClaimResource
constexpr std::uint32_t kCdiName = 1;                                                  // CDIDevice
constexpr int kVarintMaxBytes = 10;

// A byte stream over the chunks, read forward.
class ChainReader {
 public:
  explicit ChainReader(const std::vector<std::string_view>& chunks) : chunks_(chunks) { settle(); }

  std::size_t offset() const { return offset_; }
  bool at_end() const { return chunk_ == chunks_.size(); }

  bool byte(unsigned char& out) {
    if (at_end()) return false;
    out = static_cast<unsigned char>(chunks_[chunk_][at_]);
    ++at_;
    ++offset_;
    settle();
    return true;
  }

  bool varint(std::uint64_t& value) {
    value = 0;
    for (int i = 0; i < kVarintMaxBytes; ++i) {
      unsigned char b = 0;
      if (!byte(b)) return false;
      value |= static_cast<std::uint64_t>(b & 0x7fU) << (7 * i);
      if ((b & 0x80U) == 0) return true;
    }
    return false;
  }

  bool skip(std::uint64_t count) {
    while (count > 0) {
      if (at_end()) return false;
      const std::size_t here = std::min<std::uint64_t>(count, chunks_[chunk_].size() - at_);
      at_ += here;
      offset_ += here;
      count -= here;
      settle();
    }
    return true;
  }

  bool copy(std::uint64_t count, std::string& out) {
    out.clear();
    out.reserve(count);
    while (count > 0) {
      if (at_end()) return false;
      const std::size_t here = std::min<std::uint64_t>(count, chunks_[chunk_].size() - at_);
      out.append(chunks_[chunk_].substr(at_, here));
      at_ += here;
      offset_ += here;
      count -= here;
      settle();
    }
    return true;
  }

 private:
  void settle() {
    while (chunk_ < chunks_.size() && at_ == chunks_[chunk_].size()) {
      ++chunk_;
      at_ = 0;
    }
  }
  const std::vector<std::string_view>& chunks_;
  std::size_t chunk_ = 0, at_ = 0, offset_ = 0;
};

// One field's header: its number and wire type, and for length-delimited fields, the length.
struct FieldHead {
  std::uint32_t number = 0;
  unsigned type = 0;
  std::uint64_t length = 0;
};

bool read_head(ChainReader& reader, FieldHead& head) {
  std::uint64_t key = 0;
  if (!reader.varint(key) || (key >> 3) == 0 || (key >> 3) > ((1U << 29) - 1)) return false;
  head.number = static_cast<std::uint32_t>(key >> 3);
  head.type = static_cast<unsigned>(key & 7U);
  head.length = 0;
  return head.type != 2 || reader.varint(head.length);
}

// Skips a field's value after its header.
bool skip_value(ChainReader& reader, const FieldHead& head) {
  switch (head.type) {
    case 0: {
      std::uint64_t ignored = 0;
      return reader.varint(ignored);
    }
    case 1: return reader.skip(8);
    case 2: return reader.skip(head.length);
    case 5: return reader.skip(4);
    default: return false;
  }
}

// A pod being read: what is kept of it, within kPodKeptMax.
struct PodReading {
  std::optional<std::string> name, pod_namespace;
  PodResources pod;
  std::size_t kept = 0;

  bool keep(std::size_t bytes) {
    kept += bytes;
    if (kept <= kPodKeptMax) return true;
    if (pod.unreadable.empty()) {
      pod.unreadable = "the kubelet's entry for the pod holds more than " + std::to_string(kPodKeptMax >> 10) +
                       " KiB of names and device IDs";
      pod.containers.clear();
    }
    return false;
  }
};

// One ContainerResources entry, whole in `bytes`.
bool read_container(std::string_view bytes, PodReading& reading) {
  PodResources::Container container;
  ProtoReader fields(bytes);
  while (fields.next()) {
    if (fields.type() != ProtoReader::WireType::length_delimited) continue;
    const std::string_view value = fields.bytes();
    if (fields.field() == kContainerName) {
      container.name = std::string(value);
    } else if (fields.field() == kContainerDevices) {
      std::string resource;
      std::vector<std::string> ids;
      ProtoReader devices(value);
      while (devices.next()) {
        if (devices.type() != ProtoReader::WireType::length_delimited) continue;
        if (devices.field() == kDevicesResource) resource = std::string(devices.bytes());
        if (devices.field() == kDevicesIds) ids.emplace_back(devices.bytes());
      }
      if (devices.malformed()) return false;
      // The kubelet sends one entry per device (and NUMA node): grouped by resource here.
      auto same = std::find_if(container.devices.begin(), container.devices.end(),
                               [&](const PodResources::Devices& d) { return d.resource == resource; });
      if (same == container.devices.end()) {
        container.devices.push_back({resource, {}});
        same = container.devices.end() - 1;
      }
      same->ids.insert(same->ids.end(), ids.begin(), ids.end());
    } else if (fields.field() == kContainerDra) {
      nri::for_each_field(value, kDraClaimResources, [&](std::string_view claim) {
        nri::for_each_field(claim, kClaimCdiDevices, [&](std::string_view device) {
          // The kubelet repeats a driver's earlier devices in each later entry: kept once.
          const std::string name(nri::string_field(device, kCdiName));
          if (std::find(container.cdi_devices.begin(), container.cdi_devices.end(), name) ==
              container.cdi_devices.end()) {
            container.cdi_devices.push_back(name);
          }
        });
      });
    }
  }
  if (fields.malformed()) return false;
  std::size_t size = container.name.size();
  for (const auto& devices : container.devices) {
    size += devices.resource.size();
    for (const auto& id : devices.ids) size += id.size() + 1;
  }
  for (const auto& name : container.cdi_devices) size += name.size() + 1;
  if (reading.keep(size)) reading.pod.containers.push_back(std::move(container));
  return true;
}

// One PodResources entry of `length` bytes: taken if wanted, else skipped unread past its name and
// namespace. Returns false when malformed.
bool read_pod(ChainReader& reader, std::uint64_t length, const PodResourcesSource::Wanted& wanted,
              const PodResourcesSource::Take& take) {
  const std::size_t end = reader.offset() + length;
  PodReading reading;
  std::optional<bool> want;  // decided once the name and the namespace are read
  std::string entry;
  while (reader.offset() < end) {
    FieldHead head;
    if (!read_head(reader, head)) return false;
    if (head.type == 2 && reader.offset() + head.length > end) return false;
    const bool text = head.type == 2 && (head.number == kPodName || head.number == kPodNamespace);
    if (text && head.length <= kNameMax) {
      std::string value;
      if (!reader.copy(head.length, value)) return false;
      (head.number == kPodName ? reading.name : reading.pod_namespace) = std::move(value);
      if (reading.name && reading.pod_namespace) want = wanted(*reading.pod_namespace, *reading.name);
      continue;
    }
    if (text) {  // no pod of such a name can be asked for
      want = false;
      if (!reader.skip(head.length)) return false;
      continue;
    }
    const bool container = head.type == 2 && head.number == kPodContainers;
    if (!container || want == false || !reading.pod.unreadable.empty()) {
      if (!skip_value(reader, head)) return false;
      continue;
    }
    if (head.length > kContainerEntryMax) {
      reading.pod.unreadable =
          "a container's entry in the kubelet's answer is over " + std::to_string(kContainerEntryMax >> 10) + " KiB";
      reading.pod.containers.clear();
      if (!reader.skip(head.length)) return false;
      continue;
    }
    if (!reader.copy(head.length, entry) || !read_container(entry, reading)) return false;
  }
  if (reader.offset() != end) return false;
  const std::string name = reading.name.value_or(""), pod_namespace = reading.pod_namespace.value_or("");
  if (want.value_or(wanted(pod_namespace, name))) take(pod_namespace, name, std::move(reading.pod));
  return true;
}

}  // namespace

std::string read_pod_resources(const std::vector<std::string_view>& chunks, const PodResourcesSource::Wanted& wanted,
                               const PodResourcesSource::Take& take) {
  ChainReader reader(chunks);
  while (!reader.at_end()) {
    FieldHead head;
    if (!read_head(reader, head)) return "a malformed answer (at byte " + std::to_string(reader.offset()) + ")";
    if (head.type == 2 && head.number == kListPods) {
      if (!read_pod(reader, head.length, wanted, take)) {
        return "a malformed pod in the answer (near byte " + std::to_string(reader.offset()) + ")";
      }
    } else if (!skip_value(reader, head)) {
      return "a malformed answer (at byte " + std::to_string(reader.offset()) + ")";
    }
  }
  return {};
}

}  // namespace gpuguard::enforcer

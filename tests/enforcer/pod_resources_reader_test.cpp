// The kubelet's pod-resources answer read as a stream (include/gpuguard/enforcer/pod_resources_reader.hpp),
// held to protobuf's own parser of the same bytes (podresources/v1, generated from proto/): whatever chunks
// gRPC hands the bytes over in, the pods taken are the pods protobuf reads, and only those wanted; a pod
// over the bounds is taken as one that cannot be judged, never as a smaller allocation.
#include <catch2/catch.hpp>

#include <random>

#include "gpuguard/enforcer/pod_resources_reader.hpp"
#include "podresources/v1/api.pb.h"

using namespace gpuguard;

namespace {

struct Taken {
  std::string pod_namespace, name;
  enforcement::PodResources pod;
};

std::vector<Taken> read_all(
    const std::vector<std::string_view>& chunks, std::string& error,
    const enforcer::PodResourcesSource::Wanted& wanted = [](std::string_view, std::string_view) { return true; }) {
  std::vector<Taken> taken;
  error = enforcer::read_pod_resources(chunks, wanted,
                                       [&](std::string_view ns, std::string_view name, enforcement::PodResources pod) {
                                         taken.push_back({std::string(ns), std::string(name), std::move(pod)});
                                       });
  return taken;
}

// The same pods as protobuf's parser reads them, grouped as the reader groups them.
std::vector<Taken> expected(const v1::ListPodResourcesResponse& response) {
  std::vector<Taken> out;
  for (const auto& pod : response.pod_resources()) {
    Taken t{pod.namespace_(), pod.name(), {}};
    for (const auto& c : pod.containers()) {
      enforcement::PodResources::Container container{c.name(), {}, {}};
      for (const auto& d : c.devices()) {
        auto same = std::find_if(container.devices.begin(), container.devices.end(),
                                 [&](const auto& x) { return x.resource == d.resource_name(); });
        if (same == container.devices.end()) {
          container.devices.push_back({d.resource_name(), {}});
          same = container.devices.end() - 1;
        }
        same->ids.insert(same->ids.end(), d.device_ids().begin(), d.device_ids().end());
      }
      for (const auto& claim : c.dynamic_resources()) {
        for (const auto& resource : claim.claim_resources()) {
          for (const auto& device : resource.cdi_devices()) {
            if (std::find(container.cdi_devices.begin(), container.cdi_devices.end(), device.name()) ==
                container.cdi_devices.end()) {
              container.cdi_devices.push_back(device.name());
            }
          }
        }
      }
      t.pod.containers.push_back(std::move(container));
    }
    out.push_back(std::move(t));
  }
  return out;
}

bool same(const std::vector<Taken>& a, const std::vector<Taken>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].pod_namespace != b[i].pod_namespace || a[i].name != b[i].name) return false;
    if (a[i].pod.containers.size() != b[i].pod.containers.size()) return false;
    for (std::size_t j = 0; j < a[i].pod.containers.size(); ++j) {
      const auto& x = a[i].pod.containers[j];
      const auto& y = b[i].pod.containers[j];
      if (x.name != y.name || x.cdi_devices != y.cdi_devices || x.devices.size() != y.devices.size()) return false;
      for (std::size_t k = 0; k < x.devices.size(); ++k) {
        if (x.devices[k].resource != y.devices[k].resource || x.devices[k].ids != y.devices[k].ids) return false;
      }
    }
  }
  return true;
}

v1::ListPodResourcesResponse node_list(std::mt19937_64& random, int pods) {
  v1::ListPodResourcesResponse response;
  for (int p = 0; p < pods; ++p) {
    auto* pod = response.add_pod_resources();
    pod->set_name(std::string("pod-").append(std::to_string(p)));
    pod->set_namespace_(p % 3 == 0 ? "team-a" : "team-b");
    const int containers = static_cast<int>(random() % 4);
    for (int c = 0; c < containers; ++c) {
      auto* container = pod->add_containers();
      container->set_name(std::string("c").append(std::to_string(c)));
      for (int d = 0; d < static_cast<int>(random() % 3); ++d) {
        auto* devices = container->add_devices();
        devices->set_resource_name(d % 2 == 0 ? "nvidia.com/gpu" : "example.com/nic");
        devices->add_device_ids(std::string("GPU-").append(std::to_string(random() % 1000)));
      }
      if (random() % 4 == 0) {
        auto* claim = container->add_dynamic_resources();
        claim->set_claim_name("claim");
        claim->add_claim_resources()->add_cdi_devices()->set_name(
            std::string("k8s.gpu.nvidia.com/claim=").append(std::to_string(c)));
      }
    }
  }
  return response;
}

}  // namespace

TEST_CASE("enforcer: the kubelet's answer read as a stream gives the pods protobuf reads, however it is chunked") {
  std::mt19937_64 random(7);
  for (int round = 0; round < 200; ++round) {
    const v1::ListPodResourcesResponse response = node_list(random, static_cast<int>(random() % 12));
    const std::string bytes = response.SerializeAsString();
    // Cut into chunks of random sizes, as gRPC's slices come.
    std::vector<std::string_view> chunks;
    for (std::size_t at = 0; at < bytes.size();) {
      const std::size_t size = 1 + random() % 40;
      chunks.push_back(std::string_view(bytes).substr(at, size));
      at += size;
    }
    std::string error;
    const auto taken = read_all(chunks, error);
    INFO("round " << round);
    CHECK(error.empty());
    CHECK(same(taken, expected(response)));
  }
}

TEST_CASE("enforcer: the kubelet's answer keeps only the pods wanted, and skips the others unread") {
  std::mt19937_64 random(11);
  const v1::ListPodResourcesResponse response = node_list(random, 50);
  const std::string bytes = response.SerializeAsString();
  std::string error;
  const auto taken = read_all(
      {bytes}, error, [](std::string_view ns, std::string_view name) { return ns == "team-a" && name == "pod-3"; });
  CHECK(error.empty());
  REQUIRE(taken.size() == 1);
  CHECK(taken[0].name == "pod-3");
  // Its name written after its containers, as another writer may: still only the one wanted.
  v1::PodResources late;
  late.add_containers()->set_name("c");
  std::string reordered = late.SerializeAsString();
  v1::PodResources names;
  names.set_name("pod-x");
  names.set_namespace_("team-a");
  reordered += names.SerializeAsString();  // protobuf merges: the fields of both, containers first
  std::string framed = "\x0a";             // field 1, length-delimited
  for (std::size_t n = reordered.size();; n >>= 7) {
    framed.push_back(static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
    if (n <= 0x7f) break;
  }
  framed += reordered;
  const auto none = read_all({framed}, error, [](std::string_view, std::string_view name) { return name == "pod-y"; });
  CHECK(error.empty());
  CHECK(none.empty());
  const auto found = read_all({framed}, error, [](std::string_view, std::string_view name) { return name == "pod-x"; });
  REQUIRE(found.size() == 1);
  REQUIRE(found[0].pod.containers.size() == 1);
  CHECK(found[0].pod.containers[0].name == "c");
}

TEST_CASE(
    "enforcer: a pod the reader cannot keep whole is taken as one that cannot be judged, and malformed bytes said") {
  v1::ListPodResourcesResponse response;
  auto* pod = response.add_pod_resources();
  pod->set_name("huge");
  pod->set_namespace_("team-a");
  // More than kPodKeptMax of device IDs, spread over containers each under the entry bound.
  for (int c = 0; c < 400; ++c) {
    auto* container = pod->add_containers();
    container->set_name(std::string("c").append(std::to_string(c)));
    auto* devices = container->add_devices();
    devices->set_resource_name("nvidia.com/gpu");
    for (int d = 0; d < 30; ++d) devices->add_device_ids(std::string(40, 'x'));
  }
  // And one container's entry alone over kContainerEntryMax.
  auto* wide = response.add_pod_resources();
  wide->set_name("wide");
  wide->set_namespace_("team-a");
  auto* container = wide->add_containers();
  container->set_name("c");
  container->add_devices()->add_device_ids(std::string(enforcer::kContainerEntryMax + 1, 'y'));
  const std::string bytes = response.SerializeAsString();
  std::string error;
  const auto taken = read_all({bytes}, error);
  CHECK(error.empty());
  REQUIRE(taken.size() == 2);
  CHECK_THAT(taken[0].pod.unreadable, Catch::Contains("more than 64 KiB"));
  CHECK(taken[0].pod.containers.empty());
  CHECK_THAT(taken[1].pod.unreadable, Catch::Contains("over 64 KiB"));
  // An allocation from such a pod is not a smaller one: it cannot be judged.
  enforcement::KubeletAnswer answer{true, taken[0].pod, ""};
  CHECK(enforcement::allocation_for(answer, "c0", std::nullopt, policy::Policy{}).source ==
        enforcement::Allocation::Source::unknown);
  // Cut short, or with a length past its end: an error, nothing taken past it.
  for (const std::size_t cut : {std::size_t{1}, std::size_t{7}, bytes.size() / 2, bytes.size() - 1}) {
    const auto partial = read_all({std::string_view(bytes).substr(0, cut)}, error);
    CHECK_FALSE(error.empty());
  }
  CHECK_FALSE(enforcer::read_pod_resources(
                  {std::string_view("\x0a\xff\xff\xff\xff\x0f", 6)},
                  [](std::string_view, std::string_view) { return true; },
                  [](std::string_view, std::string_view, const enforcement::PodResources&) {})
                  .empty());
}

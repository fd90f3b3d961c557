// Which GPUs another plugin serves (served_elsewhere.hpp), over tests/fixtures/device-plugin/served-elsewhere.yaml,
// and how OtherServers withholds them: at once, for good, and every GPU until the kubelet has answered.
#include <yaml-cpp/yaml.h>

#include <catch2/catch.hpp>

#include "gpuguard/deviceplugin/other_servers.hpp"
#include "gpuguard/deviceplugin/published_gpus.hpp"
#include "gpuguard/deviceplugin/served_elsewhere.hpp"
#include "gpuguard/files/read_file.hpp"
#include "gpuguard/files/write_file.hpp"
#include "gpuguard/kube/store.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

using namespace gpuguard::deviceplugin;
using gpuguard::discovery::Gpu;
using gpuguard::discovery::MigDevice;

namespace {

const std::string kGpu0 = "GPU-00000000-0000-4000-8000-000000000000";
const std::string kGpu1 = "GPU-11111111-1111-4111-8111-111111111111";

std::vector<Gpu> mig_mixed() {
  Gpu zero;
  zero.uuid = kGpu0;
  zero.minor = 0;
  zero.mig_enabled = true;
  for (const char* uuid : {"MIG-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", "MIG-bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"}) {
    MigDevice mig;
    mig.uuid = uuid;
    zero.mig_devices.push_back(mig);
  }
  Gpu one;
  one.uuid = kGpu1;
  one.minor = 1;
  return {zero, one};
}

}  // namespace

TEST_CASE("served elsewhere: every case of tests/fixtures/device-plugin/served-elsewhere.yaml") {
  const YAML::Node cases = YAML::LoadFile(GPUGUARD_SOURCE_DIR "/tests/fixtures/device-plugin/served-elsewhere.yaml");
  REQUIRE(cases.size() >= 10);
  std::size_t withholding = 0;
  for (const YAML::Node& c : cases) {
    INFO(c["why"].as<std::string>());
    std::vector<OfferedResource> offered;
    for (const YAML::Node& entry : c["offered"]) {
      offered.push_back({entry["name"].as<std::string>(), entry["ids"].as<std::vector<std::string>>()});
    }
    const auto served = served_elsewhere(offered, {"nvidia.com/gpu", "github.com/fuse"}, mig_mixed());
    std::map<std::string, std::string> expected;
    for (const auto& entry : c["withheld"]) expected[entry.first.as<std::string>()] = entry.second.as<std::string>();
    std::set<std::string> got_gpus, expected_gpus;
    for (const auto& [uuid, why] : served) got_gpus.insert(uuid);
    for (const auto& [uuid, word] : expected) expected_gpus.insert(uuid);
    CHECK(got_gpus == expected_gpus);
    for (const auto& [uuid, word] : expected) {
      if (served.contains(uuid)) CHECK_THAT(served.at(uuid), Catch::Contains(word));
    }
    withholding += expected.empty() ? 0 : 1;
  }
  CHECK(withholding >= 6);
}

TEST_CASE(
    "served elsewhere: GPU resource names are NVIDIA's gpu, gpu.<anything> and mig-*, and its DRA driver for GPUs") {
  CHECK(names_gpus("nvidia.com/gpu"));
  CHECK(names_gpus("nvidia.com/gpu.shared"));
  CHECK_FALSE(names_gpus("nvidia.com/shared-gpu"));  // a name an admin chose: its IDs must carry UUIDs
  CHECK(names_gpus("nvidia.com/mig-1g.10gb"));
  CHECK_FALSE(names_gpus("nvidia.com/hostdev"));
  CHECK_FALSE(names_gpus("example.com/gpu"));
  CHECK_FALSE(names_gpus("nvidia.com"));
  CHECK(names_gpus("dra:gpu.nvidia.com"));
  CHECK(names_gpus("dra:GPU.nvidia.com"));
  CHECK_FALSE(names_gpus("dra:"));
  CHECK_FALSE(names_gpus("dra:gpu.nvidia.com.example"));
  CHECK_FALSE(names_gpus("dra:compute-domain.nvidia.com"));  // IMEX channels, not GPUs
  CHECK_FALSE(names_gpus("dra:nvidia.com/gpu"));
}

TEST_CASE("served elsewhere: a GPU pods hold through gpuguard's resource and another server's at once is held twice") {
  const std::vector<Gpu> gpus = mig_mixed();
  const std::set<std::string> own = {"nvidia.com/gpu", "github.com/fuse"};
  const auto gpus_of = [&](const std::vector<HeldDevices>& held) {
    std::set<std::string> out;
    for (const auto& [uuid, holders] : held_twice(held, own, gpus)) out.insert(uuid);
    return out;
  };
  const HeldDevices ours{"team-a/train", {"nvidia.com/gpu", {kGpu1}}};
  // NVIDIA's renamed time-slicing, begun after gpuguard's plugin gave GPU 1.
  const auto twice = held_twice({ours, {"team-b/infer", {"nvidia.com/gpu.shared", {kGpu1 + "::0"}}}}, own, gpus);
  REQUIRE(twice.size() == 1);
  CHECK_THAT(twice.at(kGpu1), Catch::Contains("team-a/train (nvidia.com/gpu)") &&
                                  Catch::Contains("team-b/infer (nvidia.com/gpu.shared)"));
  // Another GPU on the other side; gpuguard's two resources; gpuguard's replicas of one GPU: none twice.
  CHECK(gpus_of({ours, {"team-b/infer", {"nvidia.com/gpu.shared", {kGpu0}}}}).empty());
  CHECK(gpus_of({ours, {"team-b/fuse", {"github.com/fuse", {"fuse-0"}}}}).empty());
  CHECK(gpus_of({{"team-a/a", {"nvidia.com/gpu", {kGpu1 + "::0"}}}, {"team-a/b", {"nvidia.com/gpu", {kGpu1 + "::1"}}}})
            .empty());
  CHECK(gpus_of({ours}).empty());
  // A MIG device of GPU 0, NVIDIA's DRA driver's gpu-1 by minor, an index ID that may be any GPU.
  const HeldDevices ours0{"team-a/zero", {"nvidia.com/gpu", {kGpu0}}};
  CHECK(gpus_of({ours0, {"team-b/mig", {"nvidia.com/mig-1g.10gb", {"MIG-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"}}}}) ==
        std::set<std::string>{kGpu0});
  CHECK(gpus_of({ours, {"team-b/claim", {"dra:gpu.nvidia.com", {"gpu-1 node-1"}}}}) == std::set<std::string>{kGpu1});
  CHECK(gpus_of({ours0, ours, {"team-b/index", {"nvidia.com/gpu.shared", {"0"}}}}) ==
        std::set<std::string>{kGpu0, kGpu1});
  // NVIDIA's plugin under gpuguard's own name (the kubelet lists both as one resource): a GPU one pod holds
  // whole while another pod holds it, whole or a replica, is twice; replicas alone, one pod's containers,
  // and a DRA claim two pods share are not.
  const auto same_name = held_twice({ours, {"team-b/infer", {"nvidia.com/gpu", {kGpu1}}}}, own, gpus);
  REQUIRE(same_name.size() == 1);
  CHECK_THAT(same_name.at(kGpu1), Catch::Contains("holds it whole") && Catch::Contains("team-b/infer"));
  CHECK(gpus_of({{"team-b/replica", {"nvidia.com/gpu", {kGpu1 + "::2"}}}, ours}) == std::set<std::string>{kGpu1});
  CHECK(gpus_of({{"team-a/train", {"nvidia.com/gpu", {"gpu-11111111-1111-4111-8111-111111111111"}}}, ours}).empty());
  // ...and NVIDIA's index IDs under that name, which may be any GPU; not a UUID this start did not find.
  CHECK(gpus_of({ours, {"team-b/index", {"nvidia.com/gpu", {"1"}}}}) == std::set<std::string>{kGpu1});
  CHECK(gpus_of({ours, {"team-b/gone", {"nvidia.com/gpu", {"GPU-99999999-9999-4999-8999-999999999999"}}}}).empty());
  // One container holding two of gpuguard's replicas of one GPU, or two MIG devices of one GPU: once.
  const HeldDevices two_replicas{"team-a/pair", {"nvidia.com/gpu", {kGpu1 + "::0", kGpu1 + "::1"}}};
  CHECK(gpus_of({two_replicas}).empty());
  CHECK(gpus_of({two_replicas, ours0}).empty());
  CHECK(gpus_of({{"team-a/migs",
                  {"nvidia.com/gpu",
                   {"MIG-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", "MIG-bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"}}},
                 ours})
            .empty());
  CHECK(gpus_of({{"team-b/fuse", {"github.com/fuse", {"fuse-0"}}}, ours}).empty());
  CHECK(gpus_of({{"team-a/x", {"dra:gpu.nvidia.com", {"gpu-1 node-1"}}},
                 {"team-a/y", {"dra:gpu.nvidia.com", {"gpu-1 node-1"}}}})
            .empty());
  CHECK(gpus_of({{"team-a/x", {"nvidia.com/gpu", {"MIG-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"}}},
                 {"team-a/y", {"nvidia.com/gpu", {"MIG-bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"}}}})
            .empty());
  // Many holders on each side: a few named.
  std::vector<HeldDevices> many;
  for (int i = 0; i < 10; ++i) {
    many.push_back({"team-a/p" + std::to_string(i), {"nvidia.com/gpu", {kGpu1}}});
    many.push_back({"team-b/q" + std::to_string(i), {"nvidia.com/gpu.shared", {kGpu1 + "::" + std::to_string(i)}}});
  }
  const std::string holders = held_twice(many, own, gpus).at(kGpu1);
  CHECK_THAT(holders, Catch::Contains("team-a/p2") && !Catch::Contains("team-a/p3") && Catch::Contains("team-b/q2") &&
                          !Catch::Contains("team-b/q3"));
}

TEST_CASE("served elsewhere: NVIDIA's plugin's pod withholds every GPU only in a GPU-infrastructure namespace") {
  const std::set<std::string> infrastructure = {"gpu-operator", "nvidia-device-plugin", "kube-system"};
  const auto withheld = [&](const std::vector<PodOnNode>& pods) {
    std::set<std::string> gpus;
    for (const auto& [uuid, why] : nvidia_plugin_on_node(pods, infrastructure, mig_mixed())) gpus.insert(uuid);
    return gpus;
  };
  const std::set<std::string> every = {kGpu0, kGpu1};
  // NVIDIA's Helm chart (any release name), its static manifest, the GPU Operator's DaemonSet.
  CHECK(withheld({{"nvidia-device-plugin", "prod-nvidia-device-plugin-x7k2p", {"nvidia-device-plugin-ctr"}}}) == every);
  CHECK(withheld({{"kube-system", "nvidia-device-plugin-daemonset-5kq2x", {"nvidia-device-plugin-ctr"}}}) == every);
  CHECK(withheld(
            {{"gpu-operator", "nvidia-device-plugin-daemonset-9z8fw", {"nvidia-device-plugin", "config-manager"}}}) ==
        every);
  // A tenant's pod of the same shape, and NVIDIA's other components, withhold nothing.
  CHECK(withheld({{"team-a", "nvidia-device-plugin", {"nvidia-device-plugin-ctr"}}}).empty());
  CHECK(withheld({{"gpu-operator", "gpu-feature-discovery-4wq9z", {"gpu-feature-discovery"}},
                  {"nvidia-device-plugin", "prod-mps-control-daemon-2kx9q", {"mps-control-daemon-ctr"}}})
            .empty());
  const auto why =
      nvidia_plugin_on_node({{"nvidia-device-plugin", "p", {"nvidia-device-plugin-ctr"}}}, infrastructure, mig_mixed());
  CHECK_THAT(why.at(kGpu0), Catch::Contains("pod nvidia-device-plugin/p, container nvidia-device-plugin-ctr"));
}

TEST_CASE("served elsewhere: NVIDIA's DRA kubelet plugin's pod withholds every GPU where it serves GPUs") {
  const std::set<std::string> infrastructure = {"gpu-operator", "nvidia-dra-driver-gpu"};
  const auto withheld = [&](const PodOnNode& pod) {
    std::set<std::string> gpus;
    for (const auto& [uuid, why] : nvidia_plugin_on_node({pod}, infrastructure, mig_mixed())) gpus.insert(uuid);
    return gpus;
  };
  const std::set<std::string> every = {kGpu0, kGpu1};
  // The GPU Operator's DaemonSet, its own chart's (and the name it had before), each with its GPUs
  // container.
  CHECK(withheld({"gpu-operator", "nvidia-dra-driver-kubelet-plugin-7x2kq", {"compute-domains", "gpus"}}) == every);
  CHECK(withheld({"nvidia-dra-driver-gpu", "dra-driver-nvidia-gpu-kubelet-plugin-4kq8z", {"gpus"}}) == every);
  CHECK(withheld({"nvidia-dra-driver-gpu", "nvidia-dra-driver-gpu-kubelet-plugin-9wz2m", {"gpus"}}) == every);
  // Its GPUs off (compute domains alone), its controller, another pod with a container named gpus, and a
  // tenant's pod of its shape: none.
  CHECK(withheld({"gpu-operator", "nvidia-dra-driver-kubelet-plugin-7x2kq", {"compute-domains"}}).empty());
  CHECK(withheld({"gpu-operator", "nvidia-dra-driver-controller-6d9f8-x2kq9", {"gpus"}}).empty());
  CHECK(withheld({"gpu-operator", "gpu-burn-kubelet-plugin-7x2kq", {"gpus"}}).empty());
  // The DaemonSet's name must end the name but for the five random characters of its pods.
  CHECK(withheld({"gpu-operator", "nvidia-dra-driver-kubelet-plugin-test-7x2kq", {"gpus"}}).empty());
  CHECK(withheld({"gpu-operator", "nvidia-dra-driver-kubelet-plugin-7x2k", {"gpus"}}).empty());
  CHECK(withheld({"gpu-operator", "nvidia-dra-driver-kubelet-plugin-7X2KQ", {"gpus"}}).empty());
  CHECK(withheld({"gpu-operator", "dra-driver-kubelet-plugin-7x2kq", {"gpus"}}) == every);
  CHECK(withheld({"team-a", "nvidia-dra-driver-kubelet-plugin-7x2kq", {"gpus"}}).empty());
  const NvidiaGpuServer dra = nvidia_gpu_server({"gpu-operator", "nvidia-dra-driver-kubelet-plugin-7x2kq", {"gpus"}});
  CHECK(dra.server == "NVIDIA's DRA driver");
  CHECK(dra.container == "gpus");
  const NvidiaGpuServer plugin =
      nvidia_gpu_server({"gpu-operator", "nvidia-device-plugin-daemonset-x2kq9", {"nvidia-device-plugin"}});
  CHECK(plugin.server == "NVIDIA's device plugin");
  CHECK(plugin.container == "nvidia-device-plugin");
  CHECK(nvidia_gpu_server({"gpu-operator", "gpu-burn-x2kq9", {"gpus"}}).empty());
  const auto why = nvidia_plugin_on_node({{"gpu-operator", "nvidia-dra-driver-kubelet-plugin-7x2kq", {"gpus"}}},
                                         infrastructure, mig_mixed());
  CHECK_THAT(why.at(kGpu1), Catch::StartsWith("NVIDIA's DRA driver runs on this node (pod "
                                              "gpu-operator/nvidia-dra-driver-kubelet-plugin-7x2kq, container gpus)"));
}

TEST_CASE("other servers: every GPU withheld until the kubelet answers, then those served elsewhere, for good") {
  const std::vector<Gpu> gpus = mig_mixed();
  DeviceSet set({{kGpu0, kGpu0, true, 0, 0}, {kGpu1 + "::0", kGpu1, true, 0, 1}, {kGpu1 + "::1", kGpu1, true, 0, 2}});
  const auto healthy = [&] {
    std::vector<bool> out;
    for (const Device& device : set.snapshot()) out.push_back(device.healthy);
    return out;
  };
  std::vector<KubeletOffers::Answer> answers = {
      {{}, "GetAllocatableResources: connect: no such file (code 14)"},
      {{{"nvidia.com/gpu", {kGpu0, kGpu1 + "::0"}}, {"nvidia.com/gpu.shared", {kGpu1 + "::7"}}}, ""},
      {{}, "GetAllocatableResources: Deadline Exceeded (code 4)"},
      {{{"nvidia.com/gpu", {kGpu0}}}, ""},  // the other plugin gone: the GPU stays withheld
  };
  std::size_t asked = 0;
  OtherServers others([&] { return answers.at(asked++); }, gpus, {&set}, {"nvidia.com/gpu"});
  CHECK(healthy() == std::vector<bool>{false, false, false});
  others.check();
  CHECK(healthy() == std::vector<bool>{false, false, false});
  std::string metrics;
  others.render_metrics(metrics);
  CHECK_THAT(metrics, Catch::Contains("gpuguard_device_plugin_kubelet_offers_read 0") &&
                          Catch::Contains("gpuguard_device_plugin_kubelet_offers_errors_total 1"));
  others.check();
  CHECK(healthy() == std::vector<bool>{true, false, false});
  others.check();
  others.check();
  CHECK(healthy() == std::vector<bool>{true, false, false});
  metrics.clear();
  others.render_metrics(metrics);
  CHECK_THAT(metrics, Catch::Contains("gpuguard_device_plugin_kubelet_offers_read 1") &&
                          Catch::Contains("gpuguard_device_plugin_gpus_served_elsewhere 1") &&
                          Catch::Contains("gpuguard_device_plugin_kubelet_offers_errors_total 2"));
  // An MPS daemon's readiness released on the same GPU does not serve it again.
  set.withhold(kGpu1, Hold::mps_daemon, true);
  set.withhold(kGpu1, Hold::mps_daemon, false);
  CHECK(healthy() == std::vector<bool>{true, false, false});
}

TEST_CASE("other servers: a GPU held twice is counted while both pods hold it") {
  const std::vector<Gpu> gpus = mig_mixed();
  DeviceSet set({{kGpu0, kGpu0, true, 0, 0}, {kGpu1, kGpu1, true, 0, 1}});
  const HeldDevices ours{"team-a/train", {"nvidia.com/gpu", {kGpu1}}};
  const HeldDevices theirs{"team-b/infer", {"nvidia.com/gpu.shared", {kGpu1 + "::0"}}};
  std::vector<KubeletOffers::Answer> answers = {
      {{{"nvidia.com/gpu", {kGpu0, kGpu1}}, ours.devices}, "", {}, {ours}},
      {{{"nvidia.com/gpu", {kGpu0, kGpu1}},
        {"nvidia.com/gpu.shared", {kGpu1 + "::0", kGpu1 + "::1"}},
        ours.devices,
        theirs.devices},
       "",
       {},
       {ours, theirs}},
      {{{"nvidia.com/gpu", {kGpu0, kGpu1}}, {"nvidia.com/gpu.shared", {kGpu1 + "::0", kGpu1 + "::1"}}, ours.devices},
       "",
       {},
       {ours}},
  };
  std::size_t asked = 0;
  OtherServers others([&] { return answers.at(asked++); }, gpus, {&set}, {"nvidia.com/gpu"});
  const auto held_twice_now = [&] {
    std::string metrics;
    others.render_metrics(metrics);
    return metrics;
  };
  others.check();
  CHECK_THAT(held_twice_now(), Catch::Contains("gpuguard_device_plugin_gpus_held_twice 0") &&
                                   Catch::Contains("gpuguard_device_plugin_gpus_served_elsewhere 0"));
  others.check();
  CHECK_THAT(held_twice_now(), Catch::Contains("gpuguard_device_plugin_gpus_held_twice 1") &&
                                   Catch::Contains("gpuguard_device_plugin_gpus_served_elsewhere 1"));
  others.check();  // NVIDIA's pod gone: GPU 1 stays withheld, and is held once
  CHECK_THAT(held_twice_now(), Catch::Contains("gpuguard_device_plugin_gpus_held_twice 0") &&
                                   Catch::Contains("gpuguard_device_plugin_gpus_served_elsewhere 1"));
}

namespace {

// A ResourceSlice as NVIDIA's DRA driver publishes one (resource.k8s.io/v1), for GPU 1.
std::string slice(const std::string& name, const std::string& uuid) {
  return R"({"kind":"ResourceSlice","apiVersion":"resource.k8s.io/v1","metadata":{"name":")" + name +
         R"("},"spec":{"driver":"gpu.nvidia.com","nodeName":"n1","pool":{"name":"n1","generation":1,)"
         R"("resourceSliceCount":1},"devices":[{"name":"gpu-1","attributes":{"type":{"string":"gpu"},)"
         R"("uuid":{"string":")" +
         uuid + R"("}}}]}})";
}

}  // namespace

TEST_CASE("published GPUs: a ResourceSlice holding a GPU's UUID publishes it, until the slice is deleted") {
  PublishedGpus published(mig_mixed());
  CHECK_FALSE(published.listed());
  published.list_begin();
  const gpuguard::kube::PaddedText first(slice("n1-gpu.nvidia.com-abcde", kGpu1));
  const gpuguard::kube::PaddedText other_node(
      slice("n2-gpu.nvidia.com-fghij", "GPU-99999999-9999-4999-8999-999999999999"));
  const gpuguard::kube::PaddedText not_json("{\"metadata\":");
  published.list_item(first.view());
  published.list_item(other_node.view());
  published.list_item(not_json.view());
  CHECK(published.gpus().empty());  // not before the list ends
  published.list_end(true);
  CHECK(published.listed());
  const auto gpus = published.gpus();
  REQUIRE(gpus.size() == 1);
  CHECK_THAT(gpus.at(kGpu1), Catch::Contains("n1-gpu.nvidia.com-abcde") && Catch::Contains("gpu.nvidia.com"));
  const gpuguard::kube::PaddedText mig(slice("n1-mig", "MIG-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"));
  published.apply("ADDED", mig.view());
  CHECK(published.gpus().size() == 2);
  published.apply("DELETED", first.view());
  published.apply("DELETED", mig.view());
  CHECK(published.gpus().empty());
}

TEST_CASE("other servers: a GPU a ResourceSlice publishes is withheld, and unlisted slices hold the GPUs a while") {
  const std::vector<Gpu> gpus = mig_mixed();
  DeviceSet set({{kGpu0, kGpu0, true, 0, 0}, {kGpu1, kGpu1, true, 0, 1}});
  const auto healthy = [&] {
    std::vector<bool> out;
    for (const Device& device : set.snapshot()) out.push_back(device.healthy);
    return out;
  };
  const auto kubelet = [] { return KubeletOffers::Answer{{{"nvidia.com/gpu", {kGpu0, kGpu1}}}, ""}; };
  PublishedGpus published(gpus);
  {
    // Not listed, and a long wait: the kubelet's answer alone releases nothing.
    OtherServers others(kubelet, gpus, {&set}, {"nvidia.com/gpu"}, {&published, std::chrono::hours(1)});
    others.check();
    CHECK(healthy() == std::vector<bool>{false, false});
    std::string metrics;
    others.render_metrics(metrics);
    CHECK_THAT(metrics, Catch::Contains("gpuguard_device_plugin_resource_slices_listed 0"));
    // Listed: GPU 1 is published by NVIDIA's DRA driver.
    published.list_begin();
    const gpuguard::kube::PaddedText text(slice("n1-gpu.nvidia.com-abcde", kGpu1));
    published.list_item(text.view());
    published.list_end(true);
    others.check();
    CHECK(healthy() == std::vector<bool>{true, false});
  }
  DeviceSet late({{kGpu0, kGpu0, true, 0, 0}, {kGpu1, kGpu1, true, 0, 1}});
  PublishedGpus never(gpus);
  OtherServers others(kubelet, gpus, {&late}, {"nvidia.com/gpu"}, {&never, std::chrono::seconds(0)});
  others.check();  // the wait over: served on the kubelet's word
  CHECK(late.snapshot()[0].healthy);
  CHECK(late.snapshot()[1].healthy);
}

TEST_CASE("other servers: the GPUs withheld are recorded and withheld again at the next start, at once") {
  const std::vector<Gpu> gpus = mig_mixed();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gpuguard-record-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::filesystem::path record = served_elsewhere_record(dir);
  const auto kubelet = [] { return KubeletOffers::Answer{{{"nvidia.com/gpu.shared", {kGpu1 + "::0"}}}, ""}; };
  {
    DeviceSet set({{kGpu0, kGpu0, true, 0, 0}, {kGpu1, kGpu1, true, 0, 1}});
    OtherServers others(kubelet, gpus, {&set}, {"nvidia.com/gpu"}, {nullptr, kSlicesWait, {}, record});
    others.check();
    CHECK(set.snapshot()[0].healthy);
    CHECK_FALSE(set.snapshot()[1].healthy);
  }
  const std::optional<std::string> text = gpuguard::files::read_file(record);
  REQUIRE(text);
  CHECK_THAT(*text, Catch::StartsWith(kGpu1 + " the kubelet offers it as nvidia.com/gpu.shared"));
  // The next start, before the kubelet answers and with that plugin gone: GPU 1 withheld for good.
  DeviceSet set({{kGpu0, kGpu0, true, 0, 0}, {kGpu1, kGpu1, true, 0, 1}});
  OtherServers others(
      [] {
        return KubeletOffers::Answer{{{"nvidia.com/gpu", {kGpu0, kGpu1}}}, ""};
      },
      gpus, {&set}, {"nvidia.com/gpu"}, {nullptr, kSlicesWait, {}, record});
  std::string metrics;
  others.render_metrics(metrics);
  CHECK_THAT(metrics, Catch::Contains("gpuguard_device_plugin_gpus_served_elsewhere 1"));
  others.check();
  CHECK(set.snapshot()[0].healthy);
  CHECK_FALSE(set.snapshot()[1].healthy);
  // A GPU the record names that this start did not find (off the bus for a while) stays recorded when
  // another is withheld, and the lines read keep their reasons as they were written.
  const std::string absent = "GPU-00000000-0000-4000-8000-00000000dead";
  gpuguard::files::write_file_atomically(record, *text + absent + " the kubelet offers it as example.com/gpu\n");
  {
    DeviceSet next({{kGpu0, kGpu0, true, 0, 0}, {kGpu1, kGpu1, true, 0, 1}});
    OtherServers again(
        [] {
          return KubeletOffers::Answer{{{"nvidia.com/gpu.shared", {kGpu0 + "::0"}}}, ""};
        },
        gpus, {&next}, {"nvidia.com/gpu"}, {nullptr, kSlicesWait, {}, record});
    again.check();
    CHECK_FALSE(next.snapshot()[0].healthy);
  }
  const std::optional<std::string> rewritten = gpuguard::files::read_file(record);
  REQUIRE(rewritten);
  CHECK_THAT(*rewritten, Catch::Contains(*text) &&
                             Catch::Contains(kGpu0 + " the kubelet offers it as nvidia.com/gpu.shared\n") &&
                             Catch::Contains(absent + " the kubelet offers it as example.com/gpu\n"));
  CHECK(std::count(rewritten->begin(), rewritten->end(), '\n') == 3);
  // An unreadable record (too large) withholds every GPU.
  std::filesystem::resize_file(record, 1 << 20);
  DeviceSet all({{kGpu0, kGpu0, true, 0, 0}, {kGpu1, kGpu1, true, 0, 1}});
  OtherServers unreadable(kubelet, gpus, {&all}, {"nvidia.com/gpu"}, {nullptr, kSlicesWait, {}, record});
  unreadable.check();
  CHECK_FALSE(all.snapshot()[0].healthy);
  CHECK_FALSE(all.snapshot()[1].healthy);
  std::filesystem::remove_all(dir);
}

TEST_CASE("other servers: another plugin answering for one of gpuguard's own names withholds every GPU") {
  const std::vector<Gpu> gpus = mig_mixed();
  DeviceSet set({{kGpu0, kGpu0, true, 0, 0}, {kGpu1, kGpu1, true, 0, 1}});
  std::string same;
  OtherServers others(
      [] {
        return KubeletOffers::Answer{{{"nvidia.com/gpu", {kGpu0, kGpu1}}}, ""};
      },
      gpus, {&set}, {"nvidia.com/gpu"}, {nullptr, kSlicesWait, [&] { return same; }, {}});
  others.check();
  CHECK(set.snapshot()[0].healthy);
  CHECK(set.snapshot()[1].healthy);
  same = "NVIDIA's device plugin serves nvidia.com/gpu here (nvidia-gpu.sock answers)";
  others.check();
  CHECK_FALSE(set.snapshot()[0].healthy);
  CHECK_FALSE(set.snapshot()[1].healthy);
}

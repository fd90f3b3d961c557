// The GPU resources a node advertises under each MIG strategy and with time-slicing or MPS, as NVIDIA's plugin
// defines them, and what the kubelet is offered and given for replicas and MIG devices.
#include <yaml-cpp/yaml.h>
#include <catch2/catch.hpp>

#include <set>

#include "fake_host.hpp"
#include "gpuguard/deviceplugin/cdi_spec.hpp"
#include "gpuguard/deviceplugin/config.hpp"
#include "gpuguard/deviceplugin/gpu_resource.hpp"
#include "gpuguard/deviceplugin/mps.hpp"

using namespace gpuguard::deviceplugin;
using namespace gpuguard::discovery;

namespace {

Gpu gpu(const std::string& uuid, unsigned minor, std::vector<MigDevice> migs = {}, bool mig_enabled = false) {
  Gpu g;
  g.uuid = uuid;
  g.minor = minor;
  g.model = "NVIDIA H100 80GB HBM3";
  g.numa_node = 0;
  g.mig_enabled = mig_enabled || !migs.empty();
  g.mig_listed = true;
  g.mig_devices = std::move(migs);
  return g;
}

MigDevice mig(const std::string& uuid, unsigned gi, const std::string& profile) {
  return {uuid, gi, 0, profile, {gi * 10, gi * 10 + 1}};
}

std::map<std::string, std::vector<std::string>> advertised(const GpuPlan& plan) {
  std::map<std::string, std::vector<std::string>> names;
  for (const auto& resource : plan.resources) {
    for (const auto& unit : resource.units) names[resource.name].push_back(unit.uuid);
  }
  return names;
}

std::vector<std::string> ids(const Resource& resource) {
  std::vector<std::string> all;
  for (const Device& device : resource.devices().snapshot()) all.push_back(device.id);
  return all;
}

}  // namespace

TEST_CASE("MIG none: whole GPUs, MIG mode or not, with a warning for those in MIG mode") {
  const GpuPlan plan = plan_gpu_resources({gpu("GPU-0", 0, {mig("MIG-a", 1, "1g.10gb")}), gpu("GPU-1", 1)},
                                          MigStrategy::none, "nvidia.com/gpu", {});
  CHECK_FALSE(plan.error);
  CHECK(advertised(plan) == std::map<std::string, std::vector<std::string>>{{"nvidia.com/gpu", {"GPU-0", "GPU-1"}}});
  REQUIRE(plan.warnings.size() == 1);
  CHECK_THAT(plan.warnings[0], Catch::Contains("GPU-0 is in MIG mode"));
}

TEST_CASE("MIG single: every MIG device as nvidia.com/gpu when all are alike, else the reason") {
  SECTION("all GPUs in MIG mode, one profile") {
    const GpuPlan plan = plan_gpu_resources({gpu("GPU-0", 0, {mig("MIG-a", 1, "1g.10gb"), mig("MIG-b", 2, "1g.10gb")}),
                                             gpu("GPU-1", 1, {mig("MIG-c", 1, "1g.10gb")})},
                                            MigStrategy::single, "nvidia.com/gpu", {});
    REQUIRE_FALSE(plan.error);
    CHECK(advertised(plan) ==
          std::map<std::string, std::vector<std::string>>{{"nvidia.com/gpu", {"MIG-a", "MIG-b", "MIG-c"}}});
    const GpuUnit& unit = plan.resources[0].units[0];
    CHECK(unit.gpu_uuid == "GPU-0");
    CHECK(unit.device_nodes ==
          std::vector<std::string>{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap10", "/dev/nvidia-caps/nvidia-cap11"});
  }
  SECTION("no GPU in MIG mode: whole GPUs, as none") {
    const GpuPlan plan = plan_gpu_resources({gpu("GPU-0", 0)}, MigStrategy::single, "nvidia.com/gpu", {});
    CHECK(advertised(plan) == std::map<std::string, std::vector<std::string>>{{"nvidia.com/gpu", {"GPU-0"}}});
  }
  SECTION("two profiles") {
    const GpuPlan plan = plan_gpu_resources({gpu("GPU-0", 0, {mig("MIG-a", 1, "1g.10gb"), mig("MIG-b", 2, "2g.20gb")})},
                                            MigStrategy::single, "nvidia.com/gpu", {});
    REQUIRE(plan.error);
    CHECK_THAT(*plan.error, Catch::Contains("more than one profile (1g.10gb, 2g.20gb)"));
    CHECK(plan.resources.empty());
  }
  SECTION("a MIG GPU beside a whole one") {
    const GpuPlan plan = plan_gpu_resources({gpu("GPU-0", 0, {mig("MIG-a", 1, "1g.10gb")}), gpu("GPU-1", 1)},
                                            MigStrategy::single, "nvidia.com/gpu", {});
    REQUIRE(plan.error);
    CHECK_THAT(*plan.error, Catch::Contains("GPU GPU-0 is in MIG mode and GPU GPU-1 is not"));
  }
  SECTION("MIG mode with no MIG devices") {
    const GpuPlan plan = plan_gpu_resources({gpu("GPU-0", 0, {}, true)}, MigStrategy::single, "nvidia.com/gpu", {});
    REQUIRE(plan.error);
    CHECK_THAT(*plan.error, Catch::Contains("GPU-0 is in MIG mode with no MIG devices"));
  }
}

TEST_CASE("MIG mixed: whole GPUs and one resource per profile, '+' written '.'") {
  const GpuPlan plan = plan_gpu_resources(
      {gpu("GPU-0", 0, {mig("MIG-a", 1, "1g.10gb"), mig("MIG-b", 2, "3g.40gb"), mig("MIG-c", 3, "1g.10gb+me")}),
       gpu("GPU-1", 1), gpu("GPU-2", 2, {}, true), gpu("GPU-3", 3, {mig("MIG-d", 1, "1c.3g.40gb")})},
      MigStrategy::mixed, "nvidia.com/gpu", {});
  REQUIRE_FALSE(plan.error);
  CHECK(advertised(plan) == std::map<std::string, std::vector<std::string>>{
                                {"nvidia.com/gpu", {"GPU-1"}},
                                {"nvidia.com/mig-1g.10gb", {"MIG-a"}},
                                {"nvidia.com/mig-1g.10gb.me", {"MIG-c"}},
                                {"nvidia.com/mig-3g.40gb", {"MIG-b"}},
                                {"nvidia.com/mig-1c.3g.40gb", {"MIG-d"}},
                            });
  REQUIRE(plan.warnings.size() == 1);
  CHECK_THAT(plan.warnings[0], Catch::Contains("GPU-2 is in MIG mode with no MIG devices"));
}

TEST_CASE("MIG strategies need NVML where procfs shows MIG instances") {
  Gpu from_procfs = gpu("GPU-0", 0);
  from_procfs.mig_listed = false;
  from_procfs.mig_enabled = true;  // procfs cannot list them
  for (MigStrategy strategy : {MigStrategy::single, MigStrategy::mixed}) {
    const GpuPlan plan = plan_gpu_resources({from_procfs}, strategy, "nvidia.com/gpu", {});
    REQUIRE(plan.error);
    CHECK_THAT(*plan.error, Catch::Contains("needs NVML"));
  }
  CHECK_FALSE(plan_gpu_resources({from_procfs}, MigStrategy::none, "nvidia.com/gpu", {}).error);
}

TEST_CASE("time-slicing: replicas as <uuid>::<n>, renamed on request, and what is not on the node is said") {
  Sharing sharing;
  sharing.resources = {
      {"nvidia.com/gpu", "", 4}, {"nvidia.com/mig-1g.10gb", "nvidia.com/small", 2}, {"nvidia.com/mig-7g.80gb", "", 2}};
  const GpuPlan plan = plan_gpu_resources({gpu("GPU-0", 0, {mig("MIG-a", 1, "1g.10gb")}), gpu("GPU-1", 1)},
                                          MigStrategy::mixed, "nvidia.com/gpu", sharing);
  REQUIRE_FALSE(plan.error);
  REQUIRE(plan.resources.size() == 2);
  CHECK(plan.resources[0].name == "nvidia.com/gpu");
  CHECK(plan.resources[0].replicas == 4);
  CHECK(plan.resources[1].name == "nvidia.com/small");
  REQUIRE(plan.warnings.size() == 1);
  CHECK_THAT(plan.warnings[0], Catch::Contains("no nvidia.com/mig-7g.80gb"));
  GpuResource shared(plan.resources[0], {});
  CHECK(ids(shared) == std::vector<std::string>{"GPU-1::0", "GPU-1::1", "GPU-1::2", "GPU-1::3"});

  sharing.resources = {{"nvidia.com/gpu", "", 2}};
  sharing.rename_by_default = true;
  CHECK(plan_gpu_resources({gpu("GPU-0", 0)}, MigStrategy::none, "nvidia.com/gpu", sharing).resources[0].name ==
        "nvidia.com/gpu.shared");

  sharing.rename_by_default = false;
  sharing.resources = {{"nvidia.com/mig-1g.10gb", "nvidia.com/gpu", 2}};
  const GpuPlan clash = plan_gpu_resources({gpu("GPU-0", 0, {mig("MIG-a", 1, "1g.10gb")}), gpu("GPU-1", 1)},
                                           MigStrategy::mixed, "nvidia.com/gpu", sharing);
  REQUIRE(clash.error);
  CHECK_THAT(*clash.error, Catch::Contains("nvidia.com/gpu would name two resources"));
}

TEST_CASE("sharing: every case of tests/fixtures/device-plugin/sharing.yaml, read as a config file and planned") {
  const std::vector<Gpu> two_gpus = {gpu("GPU-00000000-0000-4000-8000-000000000000", 0),
                                     gpu("GPU-11111111-1111-4111-8111-111111111111", 1)};
  const std::vector<Gpu> mig_mixed = {gpu("GPU-00000000-0000-4000-8000-000000000000", 0,
                                          {mig("MIG-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", 1, "1g.10gb"),
                                           mig("MIG-bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb", 2, "1g.10gb")}),
                                      gpu("GPU-11111111-1111-4111-8111-111111111111", 1)};
  const std::vector<Gpu> all_mig = {mig_mixed[0], gpu("GPU-11111111-1111-4111-8111-111111111111", 1,
                                                      {mig("MIG-cccccccc-cccc-4ccc-8ccc-cccccccccccc", 1, "1g.10gb")})};
  const YAML::Node cases = YAML::LoadFile(GPUGUARD_SOURCE_DIR "/tests/fixtures/device-plugin/sharing.yaml");
  REQUIRE(cases.size() >= 30);
  std::size_t advertised_cases = 0, refused_cases = 0, labelled_cases = 0;
  for (const YAML::Node& c : cases) {
    const std::string why = c["why"].as<std::string>();
    INFO(why);
    PluginConfig config;
    const ConfigFileResult read = apply_config_text(c["config"].as<std::string>(), "sharing.yaml", config);
    std::optional<std::string> error = read.error;
    GpuPlan plan;
    if (!error) {
      const std::string node = c["node"].as<std::string>();
      REQUIRE((node == "two-gpus" || node == "mig-mixed" || node == "all-mig"));
      plan = plan_gpu_resources(node == "two-gpus"    ? two_gpus
                                : node == "mig-mixed" ? mig_mixed
                                                      : all_mig,
                                config.mig_strategy, config.resource_name, config.sharing);
      error = plan.error;
    }
    if (c["error"]) {
      ++refused_cases;
      REQUIRE(error);
      CHECK_THAT(*error, Catch::Contains(c["error"].as<std::string>()));
      continue;
    }
    ++advertised_cases;
    REQUIRE_FALSE(error);
    std::map<std::string, std::pair<std::size_t, std::vector<std::string>>> expected, got;
    for (const auto& entry : c["advertised"]) {
      expected[entry.first.as<std::string>()] = {entry.second["ids"].as<std::size_t>(),
                                                 entry.second["devices"].as<std::vector<std::string>>()};
    }
    for (const GpuResourcePlan& resource : plan.resources) {
      std::vector<std::string> devices;
      for (const GpuUnit& unit : resource.units) devices.push_back(unit.uuid);
      got[resource.name] = {GpuResource(resource, {}).devices().snapshot().size(), devices};
    }
    CHECK(got == expected);
    if (c["labels"]) {
      ++labelled_cases;
      CHECK(plan.labels == c["labels"].as<std::map<std::string, std::string>>());
    }
  }
  CHECK(advertised_cases >= 10);
  CHECK(labelled_cases >= 6);
  CHECK(refused_cases >= 20);
}

TEST_CASE("time-slicing: Allocate names each GPU once, and failRequestsGreaterThanOne refuses more than one") {
  Sharing sharing;
  sharing.resources = {{"nvidia.com/gpu", "", 3}};
  const GpuPlan plan =
      plan_gpu_resources({gpu("GPU-0", 0), gpu("GPU-1", 1)}, MigStrategy::none, "nvidia.com/gpu", sharing);
  GpuOptions options;
  options.pass_device_specs = true;
  GpuResource shared(plan.resources[0], options);
  Allocation allocation;
  REQUIRE_FALSE(shared.allocate({"GPU-1::2", "GPU-0::0", "GPU-1::0"}, allocation));
  CHECK(allocation.envs.at("NVIDIA_VISIBLE_DEVICES") == "GPU-1,GPU-0");
  REQUIRE(allocation.devices.size() == 2);
  CHECK(allocation.devices[0].host_path == "/dev/nvidia1");

  GpuPlan strict = plan;
  strict.resources[0].fail_requests_greater_than_one = true;
  GpuResource one_only(strict.resources[0], {});
  Allocation refused;
  const auto error = one_only.allocate({"GPU-1::2", "GPU-0::0"}, refused);
  REQUIRE(error);
  CHECK_THAT(*error, Catch::Contains("maximum request size for shared resources is 1; found 2"));
  CHECK_FALSE(one_only.allocate({"GPU-1::2"}, refused));
}

TEST_CASE("time-slicing: preferred allocation spreads replicas over GPUs, or packs them") {
  Sharing sharing;
  sharing.resources = {{"nvidia.com/gpu", "", 4}};
  const GpuPlan plan = plan_gpu_resources({gpu("GPU-0", 0), gpu("GPU-1", 1), gpu("GPU-2", 2)}, MigStrategy::none,
                                          "nvidia.com/gpu", sharing);
  // GPU-0 has two replicas in use, GPU-1 one, GPU-2 none.
  const std::vector<std::string> available = {"GPU-0::2", "GPU-0::3", "GPU-1::1", "GPU-1::2", "GPU-1::3",
                                              "GPU-2::0", "GPU-2::1", "GPU-2::2", "GPU-2::3"};
  SECTION("distributed (NVIDIA's default): the least used GPUs first, one replica per GPU before a second") {
    GpuResource shared(plan.resources[0], {});
    CHECK(shared.preferred(available, {}, 1) == std::vector<std::string>{"GPU-2::0"});
    CHECK(shared.preferred(available, {}, 3) == std::vector<std::string>{"GPU-2::0", "GPU-1::1", "GPU-2::1"});
    CHECK(shared.preferred(available, {"GPU-0::2"}, 2) == std::vector<std::string>{"GPU-0::2", "GPU-2::0"});
  }
  SECTION("packed: the most used GPU that still has room") {
    GpuOptions options;
    options.shared_allocation = SharedAllocation::packed;
    GpuResource shared(plan.resources[0], options);
    CHECK(shared.preferred(available, {}, 1) == std::vector<std::string>{"GPU-0::2"});
    CHECK(shared.preferred(available, {}, 3) == std::vector<std::string>{"GPU-0::2", "GPU-0::3", "GPU-1::1"});
  }
  SECTION("never more than is available, never an unhealthy replica") {
    GpuResource shared(plan.resources[0], {});
    shared.devices().set_health("GPU-2", false);
    CHECK(shared.preferred({"GPU-2::0", "GPU-1::1"}, {}, 2) == std::vector<std::string>{"GPU-1::1"});
  }
}

TEST_CASE("CDI spec: one device per GPU and MIG device, all and none, control nodes common, written atomically") {
  const GpuPlan plan = plan_gpu_resources({gpu("GPU-0", 0, {mig("MIG-a", 1, "1g.10gb")}), gpu("GPU-1", 1)},
                                          MigStrategy::mixed, "nvidia.com/gpu", {});
  std::vector<GpuUnit> units;
  for (const auto& resource : plan.resources) units.insert(units.end(), resource.units.begin(), resource.units.end());
  const nlohmann::json spec = cdi_spec("k8s.gpuguard.io/gpu", units, {"/dev/nvidiactl", "/dev/nvidia-uvm"});
  CHECK(spec == nlohmann::json::parse(R"({
    "cdiVersion": "0.5.0",
    "kind": "k8s.gpuguard.io/gpu",
    "devices": [
      {"name": "GPU-1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}},
      {"name": "MIG-a", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"},
                                                           {"path": "/dev/nvidia-caps/nvidia-cap10"},
                                                           {"path": "/dev/nvidia-caps/nvidia-cap11"}]}},
      {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}, {"path": "/dev/nvidia0"},
                                                         {"path": "/dev/nvidia-caps/nvidia-cap10"},
                                                         {"path": "/dev/nvidia-caps/nvidia-cap11"}]}},
      {"name": "none", "containerEdits": {"env": ["GPUGUARD_EMPTY_DEVICE="]}}
    ],
    "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]}
  })"));
  CHECK(cdi_device_name("MIG-GPU-1234/3/0") == "MIG-GPU-1234_3_0");
  // With no GPU, still a none: the webhook's value resolves on a node whose GPUs are all gone.
  CHECK(cdi_spec("k8s.gpuguard.io/gpu", {}, {})["devices"] ==
        nlohmann::json::parse(R"([{"name": "none", "containerEdits": {"env": ["GPUGUARD_EMPTY_DEVICE="]}}])"));

  gpuguard::test::FakeHost host("cdi");
  const auto root = host.root() / "var/run/cdi";
  const auto path = write_cdi_spec(root, spec);
  CHECK(path == root / "k8s.gpuguard.io-gpu.json");
  std::ifstream in(path);
  CHECK(nlohmann::json::parse(in) == spec);
  CHECK(std::distance(std::filesystem::directory_iterator(root), std::filesystem::directory_iterator()) == 1);
  CHECK_THROWS_WITH(write_cdi_spec(path / "not-a-directory", spec),
                    Catch::Contains("the CDI spec: cannot create the directory"));
}

TEST_CASE("MPS: Allocate mounts the GPU's own pipe directory and shm, and the limits of the replicas held") {
  Sharing sharing;
  sharing.strategy = SharingStrategy::mps;
  sharing.resources = {{"nvidia.com/gpu", "", 4}};
  Gpu gpu0 = gpu("GPU-0", 0), gpu1 = gpu("GPU-1", 1);
  gpu0.memory_bytes = 80ULL * 1024 * 1024 * 1024;  // 81,920 MiB
  const GpuPlan plan = plan_gpu_resources({gpu0, gpu1}, MigStrategy::none, "nvidia.com/gpu", sharing);
  REQUIRE_FALSE(plan.error);
  REQUIRE(plan.resources.size() == 1);
  CHECK(plan.resources[0].mps);
  GpuOptions options;
  options.mps_root = "/run/gpuguard/mps";
  GpuResource shared(plan.resources[0], options);
  CHECK(shared.mps());

  Allocation one;
  REQUIRE_FALSE(shared.allocate({"GPU-0::3"}, one));
  CHECK(one.envs.at("NVIDIA_VISIBLE_DEVICES") == "GPU-0");
  CHECK(one.envs.at("CUDA_MPS_PIPE_DIRECTORY") == "/run/gpuguard/mps/pipe");
  CHECK(one.envs.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "25");
  CHECK(one.envs.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "0=20480M");
  REQUIRE(one.mounts.size() == 2);
  CHECK(one.mounts[0].container_path == "/run/gpuguard/mps/pipe");
  CHECK(one.mounts[0].host_path == "/run/gpuguard/mps/GPU-0/pipe");
  CHECK_FALSE(one.mounts[0].read_only);  // a client writes to the control pipe
  CHECK(one.mounts[1].container_path == "/dev/shm");
  CHECK(one.mounts[1].host_path == "/run/gpuguard/mps/GPU-0/shm");

  // Three of GPU 0's four replicas: three quarters, in the container's environment.
  Allocation three;
  REQUIRE_FALSE(shared.allocate({"GPU-0::0", "GPU-0::1", "GPU-0::2"}, three));
  CHECK(three.envs.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "75");
  CHECK(three.envs.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "0=61440M");
  CHECK(three.envs.at("NVIDIA_VISIBLE_DEVICES") == "GPU-0");

  // GPU 1's memory is not known (procfs): its threads are limited, its memory is not.
  Allocation unknown_memory;
  REQUIRE_FALSE(shared.allocate({"GPU-1::0"}, unknown_memory));
  CHECK(unknown_memory.envs.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "25");
  CHECK_FALSE(unknown_memory.envs.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
  CHECK(unknown_memory.mounts[0].host_path == "/run/gpuguard/mps/GPU-1/pipe");

  // Replicas of two GPUs: a client reaches one daemon.
  Allocation two_gpus;
  const auto error = shared.allocate({"GPU-0::0", "GPU-1::0"}, two_gpus);
  REQUIRE(error);
  CHECK_THAT(*error, Catch::Contains("MPS replicas of one container must be of one GPU"));

  // With failRequestsGreaterThanOne (MPS's default in the config file), one replica at most.
  GpuResourcePlan strict_plan = plan.resources[0];
  strict_plan.fail_requests_greater_than_one = true;
  GpuResource strict(strict_plan, options);
  Allocation refused;
  const auto strict_error = strict.allocate({"GPU-0::0", "GPU-0::1"}, refused);
  REQUIRE(strict_error);
  CHECK_THAT(*strict_error, Catch::Contains("(sharing.mps.failRequestsGreaterThanOne)"));
}

TEST_CASE("MPS: a preferred allocation takes every replica from one GPU, and time-slicing's spreads") {
  Sharing sharing;
  sharing.strategy = SharingStrategy::mps;
  sharing.resources = {{"nvidia.com/gpu", "", 4}};
  const GpuPlan plan = plan_gpu_resources({gpu("GPU-0", 0), gpu("GPU-1", 1), gpu("GPU-2", 2)}, MigStrategy::none,
                                          "nvidia.com/gpu", sharing);
  GpuResource mps(plan.resources[0], {});
  // GPU-0 has three replicas in use, GPU-1 one, GPU-2 none.
  const std::vector<std::string> available = {"GPU-0::3", "GPU-1::1", "GPU-1::2", "GPU-1::3",
                                              "GPU-2::0", "GPU-2::1", "GPU-2::2", "GPU-2::3"};
  CHECK(mps.preferred(available, {}, 2) == std::vector<std::string>{"GPU-2::0", "GPU-2::1"});
  CHECK(mps.preferred(available, {"GPU-1::1"}, 3) == std::vector<std::string>{"GPU-1::1", "GPU-1::2", "GPU-1::3"});
  GpuOptions packed;
  packed.shared_allocation = SharedAllocation::packed;
  GpuResource mps_packed(plan.resources[0], packed);
  CHECK(mps_packed.preferred(available, {}, 2) == std::vector<std::string>{"GPU-1::1", "GPU-1::2"});

  sharing.strategy = SharingStrategy::time_slicing;
  const GpuPlan sliced = plan_gpu_resources({gpu("GPU-0", 0), gpu("GPU-1", 1), gpu("GPU-2", 2)}, MigStrategy::none,
                                            "nvidia.com/gpu", sharing);
  GpuResource time_sliced(sliced.resources[0], {});
  CHECK(time_sliced.preferred(available, {}, 2) == std::vector<std::string>{"GPU-2::0", "GPU-1::1"});
}

TEST_CASE("MPS: each daemon's directory, its defaults of one replica, and the limits of a holder of some") {
  const MpsPaths paths = mps_paths("/host/run/gpuguard/mps", "GPU-0");
  CHECK(paths.pipe == "/host/run/gpuguard/mps/GPU-0/pipe");
  CHECK(paths.log == "/host/run/gpuguard/mps/GPU-0/log");
  CHECK(paths.shm == "/host/run/gpuguard/mps/GPU-0/shm");
  CHECK(paths.ready == "/host/run/gpuguard/mps/GPU-0/ready");

  // An independent reckoning: percent = floor(100 * held / replicas), at least 1; MiB likewise of memory.
  for (unsigned replicas = 2; replicas <= kMpsMaxClients; ++replicas) {
    for (unsigned held = 1; held <= replicas; ++held) {
      INFO(held << " of " << replicas);
      const double share = static_cast<double>(held) / replicas;
      CHECK(mps_thread_percentage(held, replicas) == std::max(1U, static_cast<unsigned>(share * 100 + 1e-9)));
      CHECK(*mps_memory_limit_mib(std::uint64_t{40} << 30, held, replicas) ==
            static_cast<std::uint64_t>(40960 * share + 1e-9));
    }
  }
  CHECK_FALSE(mps_memory_limit_mib(std::nullopt, 1, 4));
  CHECK_FALSE(mps_memory_limit_mib(0, 1, 4));

  CHECK(mps_default_commands({"GPU-0", 4, std::uint64_t{80} << 30}) ==
        std::vector<std::string>{"set_default_device_pinned_mem_limit 0 20480M",
                                 "set_default_active_thread_percentage 25"});
  CHECK(mps_default_commands({"GPU-0", 3, std::nullopt}) ==
        std::vector<std::string>{"set_default_active_thread_percentage 33"});

  Sharing sharing;
  sharing.strategy = SharingStrategy::mps;
  sharing.resources = {{"nvidia.com/gpu", "nvidia.com/gpu.shared", 4, {SharedDevices::Kind::count, 1, {}}}};
  Gpu gpu0 = gpu("GPU-0", 0);
  gpu0.memory_bytes = 1ULL << 30;
  const GpuPlan plan = plan_gpu_resources({gpu0, gpu("GPU-1", 1)}, MigStrategy::none, "nvidia.com/gpu", sharing);
  REQUIRE_FALSE(plan.error);
  const std::vector<MpsGpu> daemons = mps_gpus(plan);
  REQUIRE(daemons.size() == 1);  // GPU-1 stays whole, with no daemon
  CHECK(daemons[0].uuid == "GPU-0");
  CHECK(daemons[0].replicas == 4);
  CHECK(daemons[0].memory_bytes == (1ULL << 30));
}

TEST_CASE("a withheld device is served Unhealthy whatever its health, and healthy again once released") {
  DeviceSet set(
      {{"GPU-0::0", "GPU-0", true, 0, 0}, {"GPU-0::1", "GPU-0", true, 0, 1}, {"GPU-1::0", "GPU-1", true, 0, 2}});
  std::uint64_t version = 0;
  set.snapshot(&version);
  CHECK(set.withhold("GPU-0", Hold::mps_daemon, true));
  CHECK_FALSE(set.withhold("GPU-0", Hold::mps_daemon, true));
  std::uint64_t withheld_version = 0;
  const auto withheld = set.snapshot(&withheld_version);
  CHECK(withheld_version != version);
  CHECK_FALSE(withheld[0].healthy);
  CHECK_FALSE(withheld[1].healthy);
  CHECK(withheld[2].healthy);
  CHECK_FALSE(set.find("GPU-0::1")->healthy);
  // NVML's health going and coming back does not release it.
  set.set_health("GPU-0", false);
  set.set_health("GPU-0", true);
  CHECK_FALSE(set.find("GPU-0::0")->healthy);
  CHECK(set.withhold("GPU-0", Hold::mps_daemon, false));
  CHECK(set.find("GPU-0::0")->healthy);
  // Released while NVML says unhealthy: still unhealthy.
  set.set_health("GPU-1", false);
  set.withhold("GPU-1", Hold::mps_daemon, true);
  set.withhold("GPU-1", Hold::mps_daemon, false);
  CHECK_FALSE(set.find("GPU-1::0")->healthy);
}

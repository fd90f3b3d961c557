// The GPU resources a node advertises under each MIG strategy and with time-slicing, as NVIDIA's plugin
// defines them, and what the kubelet is offered and given for replicas and MIG devices.
#include <yaml-cpp/yaml.h>
#include <catch2/catch.hpp>

#include <set>

#include "fake_host.hpp"
#include "gpuguard/deviceplugin/cdi_spec.hpp"
#include "gpuguard/deviceplugin/config.hpp"
#include "gpuguard/deviceplugin/gpu_resource.hpp"

using namespace gpuguard::deviceplugin;

namespace {

Gpu gpu(const std::string& uuid, unsigned minor, std::vector<MigDevice> migs = {}, bool mig_enabled = false) {
  Gpu g;
  g.uuid = uuid;
  g.minor = minor;
  g.model = "H100";
  g.numa_node = 0;
  g.mig_enabled = mig_enabled || !migs.empty();
  g.mig_listed = true;
  g.mig_devices = std::move(migs);
  return g;
}

MigDevice mig(const std::string& uuid, unsigned gi, const std::string& profile) {
  return {uuid, gi, 0, profile, gi * 10, gi * 10 + 1};
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
  TimeSlicing sharing;
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

TEST_CASE("time-slicing: every case of tests/fixtures/device-plugin/sharing.yaml, read as a config file and planned") {
  const std::vector<Gpu> two_gpus = {gpu("GPU-00000000-0000-4000-8000-000000000000", 0),
                                     gpu("GPU-11111111-1111-4111-8111-111111111111", 1)};
  const std::vector<Gpu> mig_mixed = {gpu("GPU-00000000-0000-4000-8000-000000000000", 0,
                                          {mig("MIG-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", 1, "1g.10gb"),
                                           mig("MIG-bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb", 2, "1g.10gb")}),
                                      gpu("GPU-11111111-1111-4111-8111-111111111111", 1)};
  const YAML::Node cases = YAML::LoadFile(GPUGUARD_SOURCE_DIR "/tests/fixtures/device-plugin/sharing.yaml");
  REQUIRE(cases.size() >= 30);
  std::size_t advertised_cases = 0, refused_cases = 0;
  for (const YAML::Node& c : cases) {
    const std::string why = c["why"].as<std::string>();
    INFO(why);
    PluginConfig config;
    const ConfigFileResult read = apply_config_text(c["config"].as<std::string>(), "sharing.yaml", config);
    std::optional<std::string> error = read.error;
    GpuPlan plan;
    if (!error) {
      const std::string node = c["node"].as<std::string>();
      REQUIRE((node == "two-gpus" || node == "mig-mixed"));
      plan = plan_gpu_resources(node == "two-gpus" ? two_gpus : mig_mixed, config.mig_strategy, config.resource_name,
                                config.time_slicing);
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
  }
  CHECK(advertised_cases >= 10);
  CHECK(refused_cases >= 20);
}

TEST_CASE("time-slicing: Allocate names each GPU once, and failRequestsGreaterThanOne refuses more than one") {
  TimeSlicing sharing;
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
  TimeSlicing sharing;
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
  CHECK_THROWS_WITH(write_cdi_spec(path / "not-a-directory", spec), Catch::Contains("cannot create the CDI directory"));
}

#include <catch2/catch.hpp>

#include <deque>
#include <mutex>

#include "fake_host.hpp"
#include "gpuguard/deviceplugin/discovery.hpp"
#include "gpuguard/deviceplugin/health.hpp"
#include "gpuguard/deviceplugin/resource.hpp"

using namespace gpuguard::deviceplugin;
using gpuguard::test::FakeHost;
using namespace std::chrono_literals;

namespace {

const std::string kGpu0 = "GPU-11111111-1111-1111-1111-111111111111";
const std::string kGpu1 = "GPU-22222222-2222-2222-2222-222222222222";
const std::string kGpu2 = "GPU-33333333-3333-3333-3333-333333333333";
const std::string kGpu3 = "GPU-44444444-4444-4444-4444-444444444444";

std::vector<Gpu> four_gpus_on_two_nodes() {
  return {{kGpu0, 0, "0000:18:00.0", "H100", 0},
          {kGpu1, 1, "0000:2a:00.0", "H100", 0},
          {kGpu2, 2, "0000:9a:00.0", "H100", 1},
          {kGpu3, 3, "0000:ab:00.0", "H100", 1}};
}

// NVML as a test double: XID events are queued by the test, responsiveness is set per GPU.
class FakeNvml final : public Nvml {
 public:
  std::vector<Device> devices() override { return {{kGpu0, 0}, {kGpu1, 1}}; }
  std::optional<XidEvent> wait_for_xid(std::chrono::milliseconds) override {
    std::lock_guard lock(mutex);
    if (events.empty()) return std::nullopt;
    auto event = events.front();
    events.pop_front();
    return event;
  }
  bool responds(const std::string& uuid) override { return !unresponsive.count(uuid); }
  std::optional<RecoveryAction> recovery_action(const std::string& uuid) override {
    const auto it = actions.find(uuid);
    return it == actions.end() ? std::nullopt : std::optional(it->second);
  }

  std::mutex mutex;
  std::deque<XidEvent> events;
  std::set<std::string> unresponsive;
  std::map<std::string, RecoveryAction> actions;  // none given: the driver reports no recovery action
};

// A clock the test moves by hand, so that health probes fall due without sleeping.
struct ManualClock {
  std::chrono::steady_clock::time_point now{};
  NvmlHealth::Clock clock() {
    return [this] { return now; };
  }
};

}  // namespace

TEST_CASE("procfs: information files, NUMA nodes, excluded GPUs, order by minor") {
  FakeHost host("procfs");
  host.add_gpu("0000:9A:00.0", kGpu2, 2, 1);
  host.add_gpu("0000:18:00.0", kGpu0, 0, 0);
  host.add_gpu("0000:2a:00.0", kGpu1, 1, -1);
  host.add_gpu("0000:ab:00.0", kGpu3, 3, 1, /*excluded=*/true);
  host.write("proc/driver/nvidia/gpus/0000:cc:00.0/information", "Model: broken\n");  // no UUID: skipped
  host.write("sys/bus/pci/devices/0000:9a:00.0/numa_node", "1\n");                    // sysfs is lower case

  const auto gpus = discover_procfs(host.root());
  REQUIRE(gpus.size() == 3);
  CHECK(gpus[0].uuid == kGpu0);
  CHECK(gpus[0].numa_node == 0);
  CHECK(gpus[0].model == "NVIDIA H100 80GB HBM3");
  CHECK(gpus[1].uuid == kGpu1);
  CHECK_FALSE(gpus[1].numa_node.has_value());  // -1: unknown
  CHECK(gpus[2].uuid == kGpu2);
  CHECK(gpus[2].minor == 2);
  CHECK(gpus[2].numa_node == 1);
  CHECK(driver_version(host.root()).starts_with("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15"));
  CHECK(discover_procfs(host.root() / "nowhere").empty());
}

TEST_CASE("procfs: information lines split at the first colon") {
  const auto fields = parse_information("Model: \t\t A: B\nGPU UUID: \t GPU-x\nno colon here\n  Device Minor:\t 7  \n");
  CHECK(fields.at("Model") == "A: B");
  CHECK(fields.at("GPU UUID") == "GPU-x");
  CHECK(fields.at("Device Minor") == "7");
  CHECK(fields.size() == 3);
}

TEST_CASE("control device nodes: only those that exist") {
  FakeHost host("control");
  host.add_device("/dev/nvidiactl");
  host.add_device("/dev/nvidia-uvm");
  CHECK(control_device_nodes(host.root()) == std::vector<std::string>{"/dev/nvidiactl", "/dev/nvidia-uvm"});
}

TEST_CASE("toolkit hardening: warn unless accept-nvidia-visible-devices-envvar-when-unprivileged = false") {
  FakeHost host("toolkit");
  CHECK(toolkit_hardening_warning(host.root()).has_value());  // no config: toolkit default is true
  host.write("etc/nvidia-container-runtime/config.toml",
             "# accept-nvidia-visible-devices-envvar-when-unprivileged = false\ndisable-require = false\n");
  CHECK_THAT(*toolkit_hardening_warning(host.root()), Catch::Contains("not set (default true)"));
  host.write("etc/nvidia-container-runtime/config.toml",
             "accept-nvidia-visible-devices-envvar-when-unprivileged = true\n[nvidia-container-cli]\n");
  CHECK_THAT(*toolkit_hardening_warning(host.root()), Catch::Contains("is true"));
  host.write("etc/nvidia-container-runtime/config.toml",
             "accept-nvidia-visible-devices-as-volume-mounts = true\n"
             "accept-nvidia-visible-devices-envvar-when-unprivileged = false # hardened\n");
  CHECK_FALSE(toolkit_hardening_warning(host.root()).has_value());
}

TEST_CASE("host devices: RESOURCE=PATH[:SLOTS]") {
  std::string error;
  auto fuse = parse_host_device("github.com/fuse=/dev/fuse:16", error);
  REQUIRE(fuse);
  CHECK(fuse->resource == "github.com/fuse");
  CHECK(fuse->path == "/dev/fuse");
  CHECK(fuse->slots == 16);
  auto one = parse_host_device("example.com/kvm=/dev/kvm", error);
  REQUIRE(one);
  CHECK(one->slots == 1);
  for (const char* bad :
       {"github.com/fuse", "fuse=/dev/fuse", "github.com/fuse=dev/fuse", "github.com/fuse=/dev/fuse:0",
        "github.com/fuse=/dev/fuse:x", "github.com/fuse=/dev/fuse:1001", "github.com/fuse=:3", "=/dev/fuse"}) {
    INFO(bad);
    CHECK_FALSE(parse_host_device(bad, error));
    CHECK_THAT(error, Catch::Contains("--host-device"));
  }
  CHECK(socket_name("github.com/fuse") == "gpuguard-github-com-fuse.sock");
  CHECK(socket_name("nvidia.com/gpu") == "gpuguard-nvidia-com-gpu.sock");
}

TEST_CASE("allocate: envvar, volume-mounts and cdi, with and without device specs") {
  const auto gpus = four_gpus_on_two_nodes();
  Allocation envvar;
  REQUIRE_FALSE(GpuResource("nvidia.com/gpu", gpus, {Strategy::envvar, false, {}}).allocate({kGpu1, kGpu0}, envvar));
  CHECK(envvar.envs.at("NVIDIA_VISIBLE_DEVICES") == kGpu1 + "," + kGpu0);
  CHECK(envvar.mounts.empty());
  CHECK(envvar.devices.empty());

  Allocation mounts;
  REQUIRE_FALSE(GpuResource("nvidia.com/gpu", gpus, {Strategy::volume_mounts, false, {}}).allocate({kGpu2}, mounts));
  CHECK(mounts.envs.at("NVIDIA_VISIBLE_DEVICES") == "/var/run/nvidia-container-devices");
  REQUIRE(mounts.mounts.size() == 1);
  CHECK(mounts.mounts[0].host_path == "/dev/null");
  CHECK(mounts.mounts[0].container_path == "/var/run/nvidia-container-devices/" + kGpu2);

  Allocation cdi;
  GpuResource cdi_gpus("nvidia.com/gpu", gpus, {Strategy::cdi, true, {"/dev/nvidiactl", "/dev/nvidia-uvm"}});
  REQUIRE_FALSE(cdi_gpus.allocate({kGpu3}, cdi));
  CHECK(cdi.envs.empty());
  REQUIRE(cdi.cdi_devices.size() == 1);
  CHECK(cdi.cdi_devices[0] == "nvidia.com/gpu=" + kGpu3);
  REQUIRE(cdi.devices.size() == 3);
  CHECK(cdi.devices[0].host_path == "/dev/nvidia3");
  CHECK(cdi.devices[0].container_path == "/dev/nvidia3");
  CHECK(cdi.devices[0].permissions == "rw");
  CHECK(cdi.devices[1].host_path == "/dev/nvidiactl");
  CHECK(cdi.devices[2].host_path == "/dev/nvidia-uvm");
}

TEST_CASE("allocate: unknown and unhealthy IDs are refused by name") {
  GpuResource gpus("nvidia.com/gpu", four_gpus_on_two_nodes(), {});
  Allocation response;
  const auto unknown = gpus.allocate({kGpu0, "GPU-nope"}, response);
  REQUIRE(unknown);
  CHECK_THAT(*unknown, Catch::Contains("GPU-nope"));
  gpus.devices().set_health(kGpu1, false);
  const auto unhealthy = gpus.allocate({kGpu1}, response);
  REQUIRE(unhealthy);
  CHECK_THAT(*unhealthy, Catch::Contains(kGpu1) && Catch::Contains("unhealthy"));
}

TEST_CASE("host device: any number of slots pass the path once") {
  HostDeviceResource fuse({"github.com/fuse", "/dev/fuse", 4});
  const auto devices = fuse.devices().snapshot();
  REQUIRE(devices.size() == 4);
  CHECK(devices[0].id == "fuse-0");
  CHECK(devices[3].id == "fuse-3");
  Allocation response;
  REQUIRE_FALSE(fuse.allocate({"fuse-2", "fuse-0"}, response));
  REQUIRE(response.devices.size() == 1);
  CHECK(response.devices[0].host_path == "/dev/fuse");
  CHECK(response.devices[0].container_path == "/dev/fuse");
  CHECK(response.devices[0].permissions == "rw");
  CHECK(fuse.preferred({"fuse-3", "fuse-1", "fuse-2"}, {}, 2) == std::vector<std::string>{"fuse-1", "fuse-2"});
}

TEST_CASE("preferred allocation: must_include, then one NUMA node, then lowest minor") {
  GpuResource gpus("nvidia.com/gpu", four_gpus_on_two_nodes(), {});
  const std::vector<std::string> all = {kGpu3, kGpu2, kGpu1, kGpu0};
  CHECK(gpus.preferred(all, {}, 1) == std::vector<std::string>{kGpu0});
  CHECK(gpus.preferred(all, {}, 2) == std::vector<std::string>{kGpu0, kGpu1});
  CHECK(gpus.preferred(all, {kGpu2}, 2) == std::vector<std::string>{kGpu2, kGpu3});
  CHECK(gpus.preferred({kGpu0, kGpu2, kGpu3}, {}, 2) == std::vector<std::string>{kGpu2, kGpu3});  // node 1 has room
  CHECK(gpus.preferred(all, {}, 3) == std::vector<std::string>{kGpu0, kGpu1, kGpu2});             // no node holds 3
  CHECK(gpus.preferred(all, {kGpu1, kGpu2}, 3) == std::vector<std::string>{kGpu1, kGpu2, kGpu0});
  gpus.devices().set_health(kGpu0, false);
  CHECK(gpus.preferred(all, {}, 1) == std::vector<std::string>{kGpu1});  // never an unhealthy one
}

// Two GPUs under NVML health with a 30 s probe interval on a hand-moved clock.
struct HealthFixture {
  FakeNvml nvml;
  GpuResource gpus{"nvidia.com/gpu", {{kGpu0, 0, "", "", 0}, {kGpu1, 1, "", "", 0}}, {}};
  ManualClock time;
  NvmlHealth health;
  explicit HealthFixture(NvmlHealthOptions options = {})
      : health(nvml, gpus.devices(), std::move(options), time.clock()) {}
  void xid(const std::string& uuid, unsigned long long xid) {
    nvml.events.push_back({uuid, xid});
    health.step(0ms);
  }
  void probe() {  // moves past the next probe and runs it
    time.now += 30s;
    health.step(0ms);
  }
  bool healthy(const std::string& uuid) { return gpus.devices().find(uuid)->healthy; }
};

TEST_CASE("NVML health: ignored application XIDs, critical XIDs, recovery on the probe after the next") {
  HealthFixture f;
  f.xid(kGpu0, 13);  // an application's fault
  CHECK(f.healthy(kGpu0));

  f.xid(kGpu0, 44);  // a critical XID that a GPU recovers from
  CHECK_FALSE(f.healthy(kGpu0));
  CHECK(f.healthy(kGpu1));
  f.time.now += 29s;
  f.health.step(0ms);  // no probe due yet
  CHECK_FALSE(f.healthy(kGpu0));
  f.time.now += 1s;
  f.health.step(0ms);  // the first probe: an XID came since the last one
  CHECK_FALSE(f.healthy(kGpu0));
  f.probe();  // answers, and no XID since the last probe
  CHECK(f.healthy(kGpu0));

  f.xid("", 44);  // not attributable to one GPU: all of them
  CHECK_FALSE(f.healthy(kGpu0));
  CHECK_FALSE(f.healthy(kGpu1));
}

TEST_CASE("NVML health: a GPU NVML no longer answers for is unhealthy without an XID, and back when it answers") {
  HealthFixture f;
  f.nvml.unresponsive.insert(kGpu1);
  f.probe();
  CHECK(f.healthy(kGpu0));
  CHECK_FALSE(f.healthy(kGpu1));
  f.probe();
  CHECK_FALSE(f.healthy(kGpu1));
  f.nvml.unresponsive.clear();
  f.probe();
  CHECK(f.healthy(kGpu1));
}

TEST_CASE("NVML health: after a reset XID, a GPU that answers stays unhealthy until a reset is seen") {
  SECTION("no recovery action reported: no evidence, so it stays out") {
    HealthFixture f;
    f.xid(kGpu0, 79);  // fallen off the bus
    for (int i = 0; i < 10; ++i) f.probe();
    CHECK_FALSE(f.healthy(kGpu0));
    CHECK(f.healthy(kGpu1));
  }
  SECTION("NVML loses the GPU and finds it again") {
    HealthFixture f;
    f.xid(kGpu0, 79);
    f.probe();
    f.nvml.unresponsive.insert(kGpu0);
    f.probe();
    CHECK_FALSE(f.healthy(kGpu0));
    f.nvml.unresponsive.clear();
    f.probe();
    CHECK(f.healthy(kGpu0));
  }
  SECTION("the driver's recovery action goes from reset back to none") {
    HealthFixture f;
    f.nvml.actions[kGpu0] = Nvml::RecoveryAction::none;
    f.xid(kGpu0, 48);  // a double-bit ECC error
    f.probe();
    f.probe();
    CHECK_FALSE(f.healthy(kGpu0));  // none all along is no evidence
    f.nvml.actions[kGpu0] = Nvml::RecoveryAction::gpu_reset;
    f.probe();
    f.probe();
    CHECK_FALSE(f.healthy(kGpu0));
    f.nvml.actions[kGpu0] = Nvml::RecoveryAction::none;  // reset by the admin
    f.probe();
    CHECK(f.healthy(kGpu0));
  }
  SECTION("a new XID after the reset starts over") {
    HealthFixture f;
    f.xid(kGpu0, 95);
    f.nvml.unresponsive.insert(kGpu0);
    f.probe();
    f.nvml.unresponsive.clear();
    f.xid(kGpu0, 95);
    f.probe();
    f.probe();
    CHECK_FALSE(f.healthy(kGpu0));
  }
}

TEST_CASE("NVML health: the ignored and reset XID lists are the options'") {
  NvmlHealthOptions options;
  options.ignored_xids = {44};
  options.reset_xids = {};
  HealthFixture f(options);
  f.xid(kGpu0, 44);
  CHECK(f.healthy(kGpu0));
  f.xid(kGpu0, 79);  // no longer a reset XID: recovers like any other
  f.probe();
  f.probe();
  CHECK(f.healthy(kGpu0));
}

TEST_CASE("XID lists: comma-separated numbers, spaces allowed, empty is empty") {
  std::string error;
  CHECK(parse_xid_list("48,79, 94", error) == std::set<unsigned long long>{48, 79, 94});
  CHECK(parse_xid_list("", error) == std::set<unsigned long long>{});
  CHECK_FALSE(parse_xid_list("48,,79", error).has_value());
  CHECK_FALSE(parse_xid_list("48;79", error).has_value());
  CHECK_THAT(error, Catch::Contains("\"48;79\" is not an XID number"));
  CHECK_FALSE(parse_xid_list("-1", error).has_value());
}

TEST_CASE("discovery: none serves no GPUs, procfs finds them, nvml fails loudly without NVML") {
  FakeHost host("discover");
  host.add_gpu("0000:18:00.0", kGpu0, 0, 0);
  const Discovery none = discover(DiscoveryMode::none, host.root());
  CHECK(none.gpus.empty());
  CHECK(none.source == "none");
  const Discovery procfs = discover(DiscoveryMode::procfs, host.root());
  CHECK(procfs.gpus.size() == 1);
  CHECK(procfs.source == "procfs");
  std::string why_not;
  const bool has_nvml = load_nvml(why_not) != nullptr;  // a machine with an NVIDIA driver has one
  const Discovery automatic = discover(DiscoveryMode::automatic, host.root());
  CHECK(automatic.source == (has_nvml ? "nvml" : "procfs"));
  CHECK(automatic.nvml_unavailable.empty() == has_nvml);
  if (!has_nvml) CHECK_THROWS_WITH(discover(DiscoveryMode::nvml, host.root()), Catch::Contains("--discovery nvml"));
}

TEST_CASE("NVML discovery takes PCI address and NUMA node from procfs by minor number") {
  FakeHost host("nvml");
  host.add_gpu("0000:18:00.0", kGpu0, 0, 1);
  FakeNvml nvml;
  const auto gpus = discover_nvml(nvml, host.root());
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[0].pci_address == "0000:18:00.0");
  CHECK(gpus[0].numa_node == 1);
  CHECK(gpus[1].uuid == kGpu1);
  CHECK(gpus[1].pci_address.empty());
}

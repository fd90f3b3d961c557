// The device plugin's pieces without gRPC: discovery (procfs, NVML, MIG), what Allocate answers for each
// strategy, host devices, and NVML health on a hand-moved clock.
#include <catch2/catch.hpp>

#include <deque>
#include <mutex>

#include "fake_host.hpp"
#include "gpuguard/deviceplugin/gpu_resource.hpp"
#include "gpuguard/deviceplugin/health.hpp"
#include "gpuguard/deviceplugin/host_device.hpp"
#include "gpuguard/discovery/discovery.hpp"

using namespace gpuguard::deviceplugin;
using namespace gpuguard::discovery;
using gpuguard::test::FakeHost;
using namespace std::chrono_literals;

namespace {

const std::string kGpu0 = "GPU-11111111-1111-1111-1111-111111111111";
const std::string kGpu1 = "GPU-22222222-2222-2222-2222-222222222222";
const std::string kGpu2 = "GPU-33333333-3333-3333-3333-333333333333";
const std::string kGpu3 = "GPU-44444444-4444-4444-4444-444444444444";

Gpu make_gpu(std::string uuid, unsigned minor, std::string pci, std::string model, std::optional<std::int64_t> numa) {
  Gpu gpu;
  gpu.uuid = std::move(uuid);
  gpu.minor = minor;
  gpu.pci_address = std::move(pci);
  gpu.model = std::move(model);
  gpu.numa_node = numa;
  return gpu;
}

std::vector<Gpu> four_gpus_on_two_nodes() {
  return {make_gpu(kGpu0, 0, "0000:18:00.0", "H100", 0), make_gpu(kGpu1, 1, "0000:2a:00.0", "H100", 0),
          make_gpu(kGpu2, 2, "0000:9a:00.0", "H100", 1), make_gpu(kGpu3, 3, "0000:ab:00.0", "H100", 1)};
}

// Whole GPUs under the none strategy, as the plugin makes them.
GpuResource whole_gpus(const std::vector<Gpu>& gpus, GpuOptions options = {}) {
  const GpuPlan plan = plan_gpu_resources(gpus, MigStrategy::none, "nvidia.com/gpu", {});
  REQUIRE(plan.resources.size() == 1);
  return GpuResource(plan.resources[0], std::move(options));
}

GpuOptions with(std::vector<Strategy> strategies, bool pass_device_specs = false,
                std::vector<std::string> control_nodes = {}) {
  GpuOptions options;
  options.strategies = std::move(strategies);
  options.pass_device_specs = pass_device_specs;
  options.control_nodes = std::move(control_nodes);
  return options;
}

// NVML as a test double: the GPUs (and MIG devices) are set by the test, XID events are queued by it,
// responsiveness is set per GPU.
class FakeNvml final : public Nvml {
 public:
  std::vector<Device> listed = {{kGpu0, 0, false, {}, {}}, {kGpu1, 1, false, {}, {}}};
  std::vector<Device> devices() override { return listed; }
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

TEST_CASE("host devices: RESOURCE=PATH[,PATH...][:SLOTS]") {
  std::string error;
  auto fuse = parse_host_device("github.com/fuse=/dev/fuse:16", error);
  REQUIRE(fuse);
  CHECK(fuse->resource == "github.com/fuse");
  CHECK(fuse->patterns == std::vector<std::string>{"/dev/fuse"});
  CHECK(fuse->slots == 16);
  auto one = parse_host_device("example.com/kvm=/dev/kvm", error);
  REQUIRE(one);
  CHECK(one->slots == 1);
  auto group = parse_host_device("example.com/video=/dev/video0,/dev/media*:2", error);
  REQUIRE(group);
  CHECK(group->patterns == std::vector<std::string>{"/dev/video0", "/dev/media*"});
  CHECK(group->slots == 2);
  for (const char* bad :
       {"github.com/fuse", "fuse=/dev/fuse", "github.com/fuse=dev/fuse", "github.com/fuse=/dev/fuse:0",
        "github.com/fuse=/dev/fuse:x", "github.com/fuse=/dev/fuse:1001", "github.com/fuse=:3", "=/dev/fuse",
        "a.com/b/c=/dev/fuse", "example.com/x=/dev/a,,/dev/b", "example.com/x=/dev/../etc"}) {
    INFO(bad);
    CHECK_FALSE(parse_host_device(bad, error));
    CHECK_THAT(error, Catch::Contains("--host-device"));
  }
  CHECK(socket_name("github.com/fuse") == "gpuguard-github-com-fuse.sock");
  CHECK(socket_name("nvidia.com/gpu") == "gpuguard-nvidia-com-gpu.sock");
}

TEST_CASE("allocate: envvar, volume-mounts and the CDI strategies, with and without device specs") {
  const auto gpus = four_gpus_on_two_nodes();
  Allocation envvar;
  REQUIRE_FALSE(whole_gpus(gpus, with({Strategy::envvar})).allocate({kGpu1, kGpu0}, envvar));
  CHECK(envvar.envs.at("NVIDIA_VISIBLE_DEVICES") == kGpu1 + "," + kGpu0);
  CHECK(envvar.mounts.empty());
  CHECK(envvar.devices.empty());
  CHECK(envvar.cdi_devices.empty());

  Allocation mounts;
  REQUIRE_FALSE(whole_gpus(gpus, with({Strategy::volume_mounts})).allocate({kGpu2}, mounts));
  CHECK(mounts.envs.at("NVIDIA_VISIBLE_DEVICES") == "/var/run/nvidia-container-devices");
  REQUIRE(mounts.mounts.size() == 1);
  CHECK(mounts.mounts[0].host_path == "/dev/null");
  CHECK(mounts.mounts[0].container_path == "/var/run/nvidia-container-devices/" + kGpu2);
  CHECK(mounts.mounts[0].read_only);

  Allocation cdi;
  GpuResource cdi_gpus = whole_gpus(gpus, with({Strategy::cdi_cri}, true, {"/dev/nvidiactl", "/dev/nvidia-uvm"}));
  REQUIRE_FALSE(cdi_gpus.allocate({kGpu3}, cdi));
  // CDI alone: the toolkit's legacy hook must not act on an image's NVIDIA_VISIBLE_DEVICES=all.
  CHECK(cdi.envs == std::map<std::string, std::string>{{"NVIDIA_VISIBLE_DEVICES", "void"}});
  CHECK(cdi.cdi_devices == std::vector<std::string>{"k8s.gpuguard.io/gpu=" + kGpu3});
  REQUIRE(cdi.devices.size() == 3);
  CHECK(cdi.devices[0].host_path == "/dev/nvidia3");
  CHECK(cdi.devices[0].container_path == "/dev/nvidia3");
  CHECK(cdi.devices[0].permissions == "rw");
  CHECK(cdi.devices[1].host_path == "/dev/nvidiactl");
  CHECK(cdi.devices[2].host_path == "/dev/nvidia-uvm");

  Allocation both;
  REQUIRE_FALSE(whole_gpus(gpus, with({Strategy::envvar, Strategy::cdi_annotations})).allocate({kGpu0, kGpu2}, both));
  CHECK(both.envs.at("NVIDIA_VISIBLE_DEVICES") == kGpu0 + "," + kGpu2);
  CHECK(both.annotations ==
        std::map<std::string, std::string>{
            {"cdi.k8s.io/gpuguard_nvidia.com_gpu", "k8s.gpuguard.io/gpu=" + kGpu0 + ",k8s.gpuguard.io/gpu=" + kGpu2},
            {"gpuguard.io/allocated-gpus", kGpu0 + "," + kGpu2}});
  CHECK(both.cdi_devices.empty());
}

TEST_CASE("device list strategies: names, and combinations that cannot work") {
  CHECK(parse_strategy("cdi") == Strategy::cdi_cri);
  CHECK(parse_strategy("cdi-cri") == Strategy::cdi_cri);
  CHECK(parse_strategy("cdi-annotations") == Strategy::cdi_annotations);
  CHECK_FALSE(parse_strategy("CDI"));
  CHECK_FALSE(check_strategies({Strategy::envvar, Strategy::cdi_cri}));
  CHECK_THAT(*check_strategies({Strategy::envvar, Strategy::volume_mounts}), Catch::Contains("cannot be combined"));
  CHECK_THAT(*check_strategies({Strategy::cdi_cri, Strategy::cdi_cri}), Catch::Contains("named twice"));
  CHECK(check_strategies({}).has_value());
}

TEST_CASE("allocate: unknown and unhealthy IDs are refused by name") {
  GpuResource gpus = whole_gpus(four_gpus_on_two_nodes());
  Allocation response;
  const auto unknown = gpus.allocate({kGpu0, "GPU-nope"}, response);
  REQUIRE(unknown);
  CHECK_THAT(*unknown, Catch::Contains("GPU-nope"));
  gpus.devices().set_health(kGpu1, false);
  const auto unhealthy = gpus.allocate({kGpu1}, response);
  REQUIRE(unhealthy);
  CHECK_THAT(*unhealthy, Catch::Contains(kGpu1) && Catch::Contains("unhealthy"));
}

TEST_CASE("host device: one path, any number of slots, passes the path once") {
  FakeHost host("fuse");
  host.add_device("/dev/fuse");
  HostDeviceResource fuse({"github.com/fuse", {"/dev/fuse"}, 4}, host.root());
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

  host.remove("/dev/fuse");  // every slot shares the path's health
  fuse.rescan();
  for (const Device& device : fuse.devices().snapshot()) CHECK_FALSE(device.healthy);
  host.add_device("/dev/fuse");
  fuse.rescan();
  for (const Device& device : fuse.devices().snapshot()) CHECK(device.healthy);
}

TEST_CASE("host device: a glob is one device per match, and follows matches as they come and go") {
  FakeHost host("serial");
  host.add_device("/dev/ttyUSB1");
  host.add_device("/dev/ttyUSB0");
  host.add_device("/dev/ttyS0");
  HostDeviceResource serial({"example.com/serial", {"/dev/ttyUSB*"}, 1}, host.root());
  CHECK(serial.one_per_match());
  auto ids = [&] {
    std::vector<std::string> all;
    for (const Device& device : serial.devices().snapshot()) all.push_back(device.id);
    return all;
  };
  CHECK(ids() == std::vector<std::string>{"ttyUSB0", "ttyUSB1"});
  Allocation response;
  REQUIRE_FALSE(serial.allocate({"ttyUSB1"}, response));
  REQUIRE(response.devices.size() == 1);
  CHECK(response.devices[0].host_path == "/dev/ttyUSB1");

  std::uint64_t version = 0;
  serial.devices().snapshot(&version);
  host.add_device("/dev/ttyUSB2");
  host.remove("/dev/ttyUSB0");
  serial.rescan();
  CHECK(ids() == std::vector<std::string>{"ttyUSB1", "ttyUSB2"});
  std::uint64_t after = 0;
  serial.devices().snapshot(&after);
  CHECK(after != version);  // ListAndWatch sends the new list
  serial.rescan();
  std::uint64_t unchanged = 0;
  serial.devices().snapshot(&unchanged);
  CHECK(unchanged == after);  // nothing moved: nothing sent

  HostDeviceResource shared({"example.com/dri", {"/dev/dri/render*"}, 2}, host.root());
  CHECK(shared.devices().snapshot().empty());
  host.add_device("/dev/dri/renderD128");
  shared.rescan();
  const auto slots = shared.devices().snapshot();
  REQUIRE(slots.size() == 2);
  CHECK(slots[0].id == "dri_renderD128-0");
  CHECK(slots[1].id == "dri_renderD128-1");
}

TEST_CASE("host device: a group passes every path it matches, and is healthy while each pattern matches") {
  FakeHost host("group");
  host.add_device("/dev/video0");
  host.add_device("/dev/media0");
  host.add_device("/dev/media1");
  HostDeviceResource video({"example.com/video", {"/dev/video0", "/dev/media*"}, 2}, host.root());
  CHECK_FALSE(video.one_per_match());
  video.rescan();
  const auto devices = video.devices().snapshot();
  REQUIRE(devices.size() == 2);
  CHECK(devices[0].id == "video-0");
  CHECK(devices[0].healthy);
  Allocation response;
  REQUIRE_FALSE(video.allocate({"video-1"}, response));
  std::vector<std::string> paths;
  for (const auto& device : response.devices) paths.push_back(device.host_path);
  CHECK(paths == std::vector<std::string>{"/dev/video0", "/dev/media0", "/dev/media1"});
  host.remove("/dev/media0");
  host.remove("/dev/media1");
  video.rescan();
  CHECK_FALSE(video.devices().snapshot()[0].healthy);
}

TEST_CASE("preferred allocation: must_include, then one NUMA node, then lowest minor") {
  GpuResource gpus = whole_gpus(four_gpus_on_two_nodes());
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
  GpuResource gpus = whole_gpus({make_gpu(kGpu0, 0, "", "", 0), make_gpu(kGpu1, 1, "", "", 0)});
  ManualClock time;
  NvmlHealth health;
  explicit HealthFixture(NvmlHealthOptions options = {})
      : health(nvml, {&gpus.devices()}, std::move(options), time.clock()) {}
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

TEST_CASE("procfs: MIG instances from the capability files, without UUIDs or profiles") {
  FakeHost host("procfs-mig");
  host.add_gpu("0000:18:00.0", kGpu0, 0, 0);
  host.add_gpu("0000:2a:00.0", kGpu1, 1, 0);
  host.add_mig(0, 2, 0, 21, 22);
  host.add_mig(0, 1, 0, 12, 13);
  host.write("proc/driver/nvidia/capabilities/gpu0/mig/gi9/access", "nothing useful\n");  // skipped
  const auto capabilities = mig_capabilities(host.root(), 0);
  REQUIRE(capabilities.size() == 2);
  CHECK(capabilities[0].gi == 1);
  CHECK(capabilities[0].gi_cap_minor == 12);
  CHECK(capabilities[0].ci_cap_minor == 13);
  CHECK(capabilities[1].gi == 2);
  CHECK(mig_capabilities(host.root(), 1).empty());

  const auto gpus = discover_procfs(host.root());
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[0].mig_enabled);
  CHECK_FALSE(gpus[0].mig_listed);
  CHECK(gpus[0].mig_devices.empty());
  CHECK_FALSE(gpus[1].mig_enabled);
}

TEST_CASE("NVML discovery: MIG devices with their capability minors from procfs") {
  FakeHost host("nvml-mig");
  host.add_gpu("0000:18:00.0", kGpu0, 0, 1);
  host.add_mig(0, 1, 0, 12, 13);
  FakeNvml nvml;
  nvml.listed = {{kGpu0, 0, true, {{"MIG-a", 1, 0, "1g.10gb", {}}, {"MIG-b", 5, 0, "1g.10gb", {}}}, {}},
                 {kGpu1, 1, true, {}, {}}};
  const auto gpus = discover_nvml(nvml, host.root());
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[0].mig_enabled);
  CHECK(gpus[0].mig_listed);
  REQUIRE(gpus[0].mig_devices.size() == 2);
  CHECK(gpus[0].mig_devices[0].cap_minors == std::vector<unsigned>{12, 13});  // the GPU instance's, then the CI's
  CHECK(gpus[0].mig_devices[1].cap_minors.empty());                           // procfs does not show gi5
  CHECK(gpus[1].mig_enabled);
  CHECK(gpus[1].mig_devices.empty());
}

TEST_CASE("MIG profile names as NVIDIA writes them") {
  const unsigned long long h100 = 81559ULL * 1024 * 1024;  // an H100 80GB's memory, as NVML reports it
  CHECK(mig_profile_name(1, 1, 9856, h100, "") == "1g.10gb");
  CHECK(mig_profile_name(1, 1, 9856, h100, mig_profile_suffix(0x7)) == "1g.10gb+me");
  CHECK(mig_profile_name(1, 1, 19968, h100, "") == "1g.20gb");
  CHECK(mig_profile_name(3, 3, 40192, h100, "") == "3g.40gb");
  CHECK(mig_profile_name(3, 1, 40192, h100, "") == "1c.3g.40gb");
  CHECK(mig_profile_name(7, 7, 80896, h100, "") == "7g.80gb");
  const unsigned long long a100 = 40536ULL * 1024 * 1024;
  CHECK(mig_profile_name(1, 1, 4864, a100, "") == "1g.5gb");
  CHECK(mig_profile_suffix(0) == "");
  CHECK(mig_profile_suffix(0xD) == "-me");
  CHECK(mig_profile_suffix(0xF) == "+me.all");
  CHECK(mig_profile_suffix(0xA) == "+gfx");
}

TEST_CASE("NVML health: an XID on a GPU reaches its MIG devices and its replicas, in every resource") {
  std::vector<Gpu> gpus = {make_gpu(kGpu0, 0, "", "", 0), make_gpu(kGpu1, 1, "", "", 0)};
  gpus[0].mig_enabled = gpus[0].mig_listed = true;
  gpus[0].mig_devices = {{"MIG-a", 1, 0, "3g.40gb", {}}, {"MIG-b", 2, 0, "3g.40gb", {}}};
  Sharing sharing;
  sharing.resources = {{"nvidia.com/gpu", "", 3}};
  const GpuPlan plan = plan_gpu_resources(gpus, MigStrategy::mixed, "nvidia.com/gpu", sharing);
  REQUIRE_FALSE(plan.error);
  REQUIRE(plan.resources.size() == 2);
  GpuResource whole(plan.resources[0], {});
  GpuResource migs(plan.resources[1], {});
  FakeNvml nvml;
  ManualClock time;
  NvmlHealth health(nvml, {&whole.devices(), &migs.devices()}, {}, time.clock());
  const auto all_healthy = [](const GpuResource& r) {
    const auto devices = r.devices().snapshot();
    return std::all_of(devices.begin(), devices.end(), [](const Device& d) { return d.healthy; });
  };
  nvml.events.push_back({kGpu0, 44});
  health.step(0ms);
  CHECK_FALSE(migs.devices().find("MIG-a")->healthy);
  CHECK_FALSE(migs.devices().find("MIG-b")->healthy);
  CHECK(all_healthy(whole));  // GPU 1's replicas
  nvml.events.push_back({kGpu1, 44});
  health.step(0ms);
  CHECK_FALSE(whole.devices().find(replica_id(kGpu1, 2))->healthy);
  time.now += 30s;
  health.step(0ms);
  time.now += 30s;
  health.step(0ms);
  CHECK(all_healthy(whole));
  CHECK(all_healthy(migs));
}

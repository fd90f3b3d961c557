// The device plugin's config file: NVIDIA's files are taken as they are, every key gpuguard reads lands
// where it should, every bad key or value is refused with the file, the key and the reason, and the flags
// given override the file.
#include <catch2/catch.hpp>

#include <boost/program_options.hpp>

#include "fake_host.hpp"
#include "gpuguard/deviceplugin/config.hpp"
#include "gpuguard/deviceplugin/flags.hpp"

using namespace gpuguard::deviceplugin;
using namespace gpuguard::discovery;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(GPUGUARD_SOURCE_DIR) / "tests/fixtures/device-plugin";

PluginConfig load(const fs::path& file) {
  PluginConfig config;
  const ConfigFileResult result = apply_config_file(file, config);
  INFO(result.error.value_or(""));
  REQUIRE_FALSE(result.error);
  return config;
}

std::optional<PluginConfig> from_command_line(const std::vector<std::string>& args,
                                              std::vector<std::string>& warnings) {
  namespace po = boost::program_options;
  po::options_description description;
  add_flags(description);
  po::variables_map flags;
  po::store(po::command_line_parser(args).options(description).run(), flags);
  po::notify(flags);
  return config_from(flags, warnings);
}

}  // namespace

TEST_CASE("config file: NVIDIA's time-slicing example is taken as it is") {
  PluginConfig config;
  const ConfigFileResult result = apply_config_file(kFixtures / "nvidia-time-slicing.yaml", config);
  REQUIRE_FALSE(result.error);
  CHECK(config.mig_strategy == MigStrategy::mixed);
  CHECK(config.fail_on_init_error);
  CHECK(config.gpu.pass_device_specs);
  CHECK(config.gpu.strategies == std::vector<Strategy>{Strategy::envvar, Strategy::cdi_annotations});
  CHECK(config.gpu.shared_allocation == SharedAllocation::packed);
  CHECK_FALSE(config.sharing.rename_by_default);
  CHECK(config.sharing.fail_requests_greater_than_one);
  REQUIRE(config.sharing.resources.size() == 2);
  CHECK(config.sharing.resources[0].name == "nvidia.com/gpu");
  CHECK(config.sharing.resources[0].replicas == 10);
  CHECK(config.sharing.resources[1].name == "nvidia.com/mig-1g.10gb");  // NVIDIA's implied domain
  CHECK(config.sharing.resources[1].rename == "nvidia.com/mig-1g.10gb.shared");
  REQUIRE(result.warnings.size() == 1);
  CHECK_THAT(result.warnings[0], Catch::Contains("flags.gfd is GPU Feature Discovery's"));
}

TEST_CASE("config file: MPS, as NVIDIA's README writes it, holds a container to one replica unless told otherwise") {
  PluginConfig config;
  ConfigFileResult result = apply_config_text(
      "version: v1\nflags: {mpsRoot: /run/nvidia/mps}\nsharing:\n  mps:\n    resources:\n"
      "    - name: nvidia.com/gpu\n      replicas: 10\n",
      "mps.yaml", config);
  REQUIRE_FALSE(result.error);
  CHECK(config.sharing.strategy == SharingStrategy::mps);
  CHECK(config.sharing.fail_requests_greater_than_one);  // NVIDIA's default under MPS
  REQUIRE(config.sharing.resources.size() == 1);
  CHECK(config.sharing.resources[0].replicas == 10);
  CHECK(config.gpu.mps_root == "/run/nvidia/mps");

  PluginConfig explicit_false;
  result =
      apply_config_text("sharing: {mps: {failRequestsGreaterThanOne: false, resources: [{name: gpu, replicas: 4}]}}\n",
                        "mps.yaml", explicit_false);
  REQUIRE_FALSE(result.error);
  CHECK_FALSE(explicit_false.sharing.fail_requests_greater_than_one);

  PluginConfig time_slicing;
  REQUIRE_FALSE(
      apply_config_text("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}\n", "ts.yaml", time_slicing)
          .error);
  CHECK(time_slicing.sharing.strategy == SharingStrategy::time_slicing);
  CHECK_FALSE(time_slicing.sharing.fail_requests_greater_than_one);
  CHECK(time_slicing.gpu.mps_root == "/run/gpuguard/mps");  // the default
}

TEST_CASE("config file: every key of the gpuguard section") {
  const PluginConfig config = load(kFixtures / "gpuguard.yaml");
  CHECK(config.gpu.strategies == std::vector<Strategy>{Strategy::cdi_cri});
  CHECK(config.plugin_dir == "/var/lib/kubelet/device-plugins/");
  CHECK(config.host_root == "/host");
  CHECK(config.discovery == DiscoveryMode::procfs);
  CHECK(config.resource_name == "example.com/gpu");
  CHECK(config.cdi_root == "/var/run/cdi");
  CHECK(config.nfd_feature_file == "/etc/kubernetes/node-feature-discovery/features.d/gpuguard");
  CHECK(config.metrics_address == "127.0.0.1:9400");
  CHECK(config.node_name == "gpu-node-1");
  CHECK(config.policy_dir == std::filesystem::path("/etc/gpuguard/policy"));
  CHECK(config.infrastructure_namespaces == std::set<std::string>{"gpu-operator", "nvidia-device-plugin"});
  REQUIRE(config.host_devices.size() == 2);
  CHECK(config.host_devices[0].resource == "github.com/fuse");
  CHECK(config.host_devices[0].patterns == std::vector<std::string>{"/dev/fuse"});
  CHECK(config.host_devices[0].slots == 16);
  CHECK(config.host_devices[1].patterns == std::vector<std::string>{"/dev/ttyUSB*"});
  CHECK(config.host_devices[1].slots == 1);
  CHECK(config.health_checks);
  CHECK(config.health.ignored_xids == std::set<unsigned long long>{13, 31, 43});
  CHECK(config.health.reset_xids == std::set<unsigned long long>{48, 79});
}

TEST_CASE("config file: an empty file, and version alone, change nothing") {
  for (const char* text : {"", "version: v1\n", "# only a comment\n"}) {
    PluginConfig config;
    const ConfigFileResult result = apply_config_text(text, "empty.yaml", config);
    CHECK_FALSE(result.error);
    CHECK(config.gpu.strategies == std::vector<Strategy>{Strategy::envvar});
    CHECK(config.mig_strategy == MigStrategy::none);
  }
}

TEST_CASE("config file: every bad key and value is refused with the file, the key and the reason") {
  struct Case {
    const char* yaml;
    const char* error;
  };
  const Case cases[] = {
      {"version: v2\n", "plugin.yaml: version: must be v1, not \"v2\""},
      {"verison: v1\n",
       "plugin.yaml: verison: unknown key (known here: flags, gpuguard, imex, resources, sharing, version)"},
      {"- a list\n", "plugin.yaml: must be a map of keys"},
      {"flags: [1]\n", "plugin.yaml: flags: must be a map of keys"},
      {"flags: {migStrategy: all}\n", "flags.migStrategy: must be none, single or mixed, not \"all\""},
      {"flags: {migStrategie: none}\n", "flags.migStrategie: unknown key"},
      {"flags: {failOnInitError: yes}\n", "flags.failOnInitError: must be true or false, not \"yes\""},
      {"flags: {deviceDiscoveryStrategy: tegra}\n",
       "flags.deviceDiscoveryStrategy: must be auto or nvml (Tegra is not supported)"},
      {"flags: {nvidiaDriverRoot: /run/nvidia/driver}\n", "flags.nvidiaDriverRoot: only / is accepted"},
      {"flags: {nvidiaDevRoot: /dev2}\n", "flags.nvidiaDevRoot: only / is accepted"},
      {"flags: {mpsRoot: run/mps}\n", "flags.mpsRoot: must be an absolute path on the host"},
      {"gpuguard: {nfdFeatureFile: features.d/gpuguard}\n",
       "gpuguard.nfdFeatureFile: must be an absolute path on the host, or empty"},
      {"flags: {gdsEnabled: true}\n", "flags.gdsEnabled: GPUDirect Storage is not supported"},
      {"flags: {gdrcopyEnabled: true}\n", "flags.gdrcopyEnabled: GDRCopy devices are not supported"},
      {"flags: {mofedEnabled: true}\n", "flags.mofedEnabled: MOFED devices are not supported"},
      {"flags: {plugin: {passDeviceSpecs: 1}}\n", "flags.plugin.passDeviceSpecs: must be true or false, not \"1\""},
      {"flags: {plugin: {deviceListStrategy: nvml}}\n", "flags.plugin.deviceListStrategy: \"nvml\" is not envvar"},
      {"flags: {plugin: {deviceListStrategy: [envvar, volume-mounts]}}\n",
       "envvar and volume-mounts cannot be combined"},
      {"flags: {plugin: {deviceListStrategy: {a: b}}}\n", "flags.plugin.deviceListStrategy: must be a value or a list"},
      {"flags: {plugin: {deviceIDStrategy: index}}\n", "flags.plugin.deviceIDStrategy: must be uuid"},
      {"flags: {plugin: {cdiAnnotationPrefix: cdi.k8s.io}}\n",
       "the CDI annotation prefix must be a domain and a slash"},
      {"flags: {plugin: {sharedDevicesAllocationPolicy: random}}\n", "must be distributed or packed, not \"random\""},
      {"flags: {plugin: {nvidiaCTKPath: /usr/bin/nvidia-ctk}}\n",
       "flags.plugin.nvidiaCTKPath: gpuguard's CDI spec runs no nvidia-ctk hooks"},
      {"flags: {plugin: {containerDriverRoot: /driver-root}}\n",
       "flags.plugin.containerDriverRoot: gpuguard's CDI spec mounts no driver files"},
      {"flags: {plugin: {bogus: 1}}\n", "flags.plugin.bogus: unknown key"},
      {"imex: {channelIDs: [0]}\n", "imex: IMEX channels are not supported"},
      {"sharing: {mps: {resources: []}}\n", "sharing.mps.resources: no resources to share"},
      {"sharing: {mps: {resources: [{name: gpu, replicas: 49}]}}\n",
       "sharing.mps.resources[0].replicas: must be from 2 to 48 (MPS serves at most 48 clients a GPU)"},
      {"sharing: {mps: {resources: [{name: gpu, replicas: 2}]}, timeSlicing: {resources: [{name: gpu, replicas: "
       "2}]}}\n",
       "sharing: timeSlicing and mps are both set"},
      {"flags: {migStrategy: mixed}\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n",
       "sharing.mps: MPS does not share MIG devices, and the MIG strategy mixed is not supported with it"},
      {"sharing: {timeslicing: {}}\n", "sharing.timeslicing: unknown key"},
      {"sharing: {timeSlicing: {}}\n", "sharing.timeSlicing.resources: no resources to share"},
      {"sharing: {timeSlicing: {resources: {name: gpu}}}\n", "sharing.timeSlicing.resources: must be a list"},
      {"sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}\n",
       "sharing.timeSlicing.resources[0].replicas: must be from 2 to 1000"},
      {"sharing: {timeSlicing: {resources: [{name: gpu, replicas: two}]}}\n",
       "sharing.timeSlicing.resources[0].replicas: must be a whole number, not \"two\""},
      {"sharing: {timeSlicing: {resources: [{name: gpu}]}}\n", "sharing.timeSlicing.resources[0]: needs replicas"},
      {"sharing: {timeSlicing: {resources: [{replicas: 2}]}}\n", "sharing.timeSlicing.resources[0]: needs a name"},
      {"sharing: {timeSlicing: {resources: [{name: 'a b', replicas: 2}]}}\n",
       "sharing.timeSlicing.resources[0].name: \"nvidia.com/a b\" is not a resource name"},
      {"sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: [0, x]}]}}\n",
       "sharing.timeSlicing.resources[0].devices[1]: \"x\" is not a GPU index"},
      {"sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}, {name: nvidia.com/gpu, replicas: 3}]}}\n",
       "sharing.timeSlicing.resources[1].name: nvidia.com/gpu is shared twice"},
      {"sharing: {timeSlicing: {renameByDefault: maybe, resources: [{name: gpu, replicas: 2}]}}\n",
       "sharing.timeSlicing.renameByDefault: must be true or false"},
      {"gpuguard: {discovery: cuda}\n", "gpuguard.discovery: must be auto, nvml, procfs or none, not \"cuda\""},
      {"gpuguard: {resourceName: gpu}\n", "gpuguard.resourceName: must look like nvidia.com/gpu"},
      {"gpuguard: {infrastructureNamespaces: [gpu-operator, GPU_Operator]}\n",
       "gpuguard.infrastructureNamespaces: \"GPU_Operator\" is not a namespace name (a DNS label)"},
      {"gpuguard: {hostRoot: [a]}\n", "gpuguard.hostRoot: must be a single value"},
      {"gpuguard: {hostDevices: [{name: github.com/fuse, paths: [dev/fuse]}]}\n",
       "gpuguard.hostDevices[0]: \"dev/fuse\" is not an absolute path"},
      {"gpuguard: {hostDevices: [{name: fuse, paths: [/dev/fuse]}]}\n",
       "gpuguard.hostDevices[0]: RESOURCE must look like example.com/name"},
      {"gpuguard: {hostDevices: [{name: github.com/fuse, paths: [/dev/fuse], slots: 0}]}\n",
       "gpuguard.hostDevices[0]: SLOTS must be a number from 1 to 1000"},
      {"gpuguard: {hostDevices: [{name: github.com/fuse, path: /dev/fuse}]}\n",
       "gpuguard.hostDevices[0].path: unknown key"},
      {"gpuguard: {hostDevices: [{name: nvidia.com/gpu, paths: [/dev/fuse]}]}\n",
       "resource nvidia.com/gpu is named twice"},
      {"gpuguard: {nodeName: GPU_1}\n", "the node name \"GPU_1\" is not a Kubernetes object name"},
      {"gpuguard: {nodeName: -gpu}\n", "the node name \"-gpu\" is not a Kubernetes object name"},
      {"gpuguard: {health: {checks: off}}\n", "gpuguard.health.checks: must be true or false, not \"off\""},
      {"gpuguard: {health: {resetXids: [48, x]}}\n", "gpuguard.health.resetXids: \"x\" is not an XID number"},
      {"gpuguard: {health: {interval: 5}}\n", "gpuguard.health.interval: unknown key"},
      {"flags: {migStrategy: [none\n", ": not YAML"},
  };
  for (const Case& c : cases) {
    INFO(c.yaml);
    PluginConfig config;
    config.resource_name = "nvidia.com/gpu";
    const ConfigFileResult result = apply_config_text(c.yaml, "plugin.yaml", config);
    REQUIRE(result.error);
    CHECK_THAT(*result.error, Catch::StartsWith("plugin.yaml") && Catch::Contains(c.error));
    CHECK(config.gpu.strategies == std::vector<Strategy>{Strategy::envvar});  // unchanged
  }
}

TEST_CASE("config file: a file that cannot be read is an error naming it") {
  PluginConfig config;
  const ConfigFileResult result = apply_config_file("/nonexistent/plugin.yaml", config);
  REQUIRE(result.error);
  CHECK(*result.error == "/nonexistent/plugin.yaml: cannot be read");
}

TEST_CASE("flags: the ones given override the file, the others keep its values") {
  std::vector<std::string> warnings;
  const auto config = from_command_line({"--config-file", (kFixtures / "nvidia-time-slicing.yaml").string(),
                                         "--mig-strategy", "single", "--device-list-strategy", "volume-mounts,cdi",
                                         "--fail-on-init-error=false", "--host-device", "github.com/fuse=/dev/fuse:4"},
                                        warnings);
  REQUIRE(config);
  CHECK(config->mig_strategy == MigStrategy::single);
  CHECK(config->gpu.strategies == std::vector<Strategy>{Strategy::volume_mounts, Strategy::cdi_cri});
  CHECK_FALSE(config->fail_on_init_error);
  CHECK(config->gpu.pass_device_specs);          // from the file
  CHECK(config->sharing.resources.size() == 2);  // from the file
  REQUIRE(config->host_devices.size() == 1);
  // Each flag that overrides a key the file sets says so (a ported file's hardening must not vanish
  // silently); --host-device overrides nothing the file sets.
  CHECK(warnings == std::vector<std::string>{warnings.front(),
                                             "--fail-on-init-error overrides the config file's flags.failOnInitError",
                                             "--mig-strategy overrides the config file's flags.migStrategy",
                                             "--device-list-strategy overrides the config file's "
                                             "flags.plugin.deviceListStrategy"});
  CHECK_THAT(warnings.front(), Catch::Contains("gfd"));

  const auto no_file = from_command_line({"--pass-device-specs"}, warnings);
  REQUIRE(no_file);
  CHECK(no_file->gpu.pass_device_specs);
  CHECK(no_file->gpu.strategies == std::vector<Strategy>{Strategy::envvar});
  CHECK(no_file->metrics_address == "0.0.0.0:8080");

  CHECK_FALSE(from_command_line({"--device-list-strategy", "envvar,volume-mounts"}, warnings));
  CHECK_FALSE(from_command_line({"--mig-strategy", "all"}, warnings));
  CHECK_FALSE(from_command_line({"--config-file", "/nonexistent.yaml"}, warnings));
  CHECK_FALSE(from_command_line({"--host-device", "nvidia.com/gpu=/dev/fuse"}, warnings));

  const auto infrastructure =
      from_command_line({"--infrastructure-namespaces", "kube-system, gpu-operator,,"}, warnings);
  REQUIRE(infrastructure);
  CHECK(infrastructure->infrastructure_namespaces == std::set<std::string>{"gpu-operator", "kube-system"});
  CHECK_FALSE(from_command_line({"--infrastructure-namespaces", "gpu-operator,nvidia/device-plugin"}, warnings));
}

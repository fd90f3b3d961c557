// MPS without a GPU: the real `gpuguard-device-plugin mps-control` over the stand-in NVML, with stand-ins
// for nvidia-smi and nvidia-cuda-mps-control (tests/deviceplugin/mps-stand-ins, which record what they are
// given), in a mount namespace of its own so that its tmpfs mounts end with it; and the real plugin
// serving MPS replicas to the fake kubelet: Unhealthy until the GPU's daemon is ready, and each
// container given its GPU's pipe directory, shm and limits.
#include "eventually.hpp"
#include "plugin_harness.hpp"

#include <nlohmann/json.hpp>

#include <functional>

using namespace gpuguard::test;

namespace {

const fs::path kStandIns = GPUGUARD_SOURCE_DIR "/tests/deviceplugin/mps-stand-ins";

// Running, and not a zombie its new parent has yet to reap.
bool alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat(std::istreambuf_iterator<char>(in), {});
  const auto end_of_name = stat.rfind(") ");
  return end_of_name != std::string::npos && end_of_name + 2 < stat.size() && stat[end_of_name + 2] != 'Z';
}

// Two whole GPUs of 81,559 MiB under the stand-in NVML.
struct MpsNode : Node {
  fs::path nvml_file = host.root() / "nvml.json";
  fs::path transcript = host.root() / "stand-in-transcript";
  fs::path mps_root = host.root() / "run/gpuguard/mps";
  MpsNode() {
    nlohmann::json gpus = {{"gpus",
                            {{{"uuid", kGpu0}, {"minor", 0}, {"memoryMiB", 81559}},
                             {{"uuid", kGpu1}, {"minor", 1}, {"memoryMiB", 81559}}}}};
    std::ofstream(nvml_file) << gpus.dump();
  }
  std::vector<std::string> env() const {
    return {"LD_LIBRARY_PATH=" GPUGUARD_FAKE_NVML_DIR, "GPUGUARD_FAKE_NVML=" + nvml_file.string(),
            "GPUGUARD_STAND_IN_TRANSCRIPT=" + transcript.string()};
  }
  fs::path ready(const std::string& uuid) const { return mps_root / uuid / "ready"; }
  std::string transcript_text() const {
    std::ifstream in(transcript);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // The stand-in daemons still running, by the PID files they keep in each pipe directory.
  std::vector<pid_t> stand_in_daemons() const {
    std::vector<pid_t> pids;
    for (const std::string& uuid : {kGpu0, kGpu1}) {
      std::ifstream in(mps_root / uuid / "pipe/stand-in-daemon.pid");
      pid_t pid = 0;
      if (in >> pid && pid > 0 && alive(pid)) pids.push_back(pid);
    }
    return pids;
  }
  ~MpsNode() {
    for (const pid_t pid : stand_in_daemons()) kill(pid, SIGKILL);  // a failed test leaves none behind
  }
};

// gpuguard-device-plugin mps-control under `unshare --mount --propagation private`, which executes it in
// place: the PID is the daemon's own, and its mounts leave with its namespace.
class MpsControl : public ChildProcess {
 public:
  MpsControl(const MpsNode& node, const fs::path& config, std::vector<std::string> extra_env = {})
      : ChildProcess(argv(node, config),
                     {.env = env(node, std::move(extra_env)), .log = node.host.root() / "mps-control.log"}) {}
  int stop() { return terminate(20s); }

 private:
  static std::vector<std::string> argv(const MpsNode& node, const fs::path& config) {
    return {"unshare",
            "--mount",
            "--propagation",
            "private",
            GPUGUARD_DEVICE_PLUGIN_BIN,
            "mps-control",
            "--discovery",
            "nvml",
            "--host-root",
            node.host.root().string(),
            "--config-file",
            config.string(),
            "--nvidia-smi",
            (kStandIns / "nvidia-smi").string(),
            "--mps-control",
            (kStandIns / "nvidia-cuda-mps-control").string(),
            "--shm-size",
            "16m",
            "--check-interval",
            "1"};
  }
  static std::vector<std::string> env(const MpsNode& node, std::vector<std::string> extra) {
    std::vector<std::string> all = node.env();
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  }
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("mps-control: a daemon per GPU seeing that GPU alone, its own shm, limits, readiness, and quit") {
  MpsNode node;
  const fs::path config = node.host.root() / "plugin.yaml";
  std::ofstream(config) << "sharing: {mps: {resources: [{name: gpu, replicas: 4}]}}\n";
  MpsControl control(node, config);
  REQUIRE(eventually([&] { return fs::exists(node.ready(kGpu0)) && fs::exists(node.ready(kGpu1)); }, 20s));
  INFO(control.log());
  const std::string started = node.transcript_text();
  INFO(started);
  for (const std::string& uuid : {kGpu0, kGpu1}) {
    const std::string dir = (node.mps_root / uuid).string();
    // In this order: the compute mode, the daemon on this GPU alone, then one replica's defaults
    // (81,559 MiB / 4, and 100 % / 4).
    const std::vector<std::string> steps = {
        std::string("nvidia-smi -i ").append(uuid).append(" -c EXCLUSIVE_PROCESS\n"),
        std::string("nvidia-cuda-mps-control -d CUDA_VISIBLE_DEVICES=")
            .append(uuid)
            .append(" CUDA_MPS_PIPE_DIRECTORY=")
            .append(dir)
            .append("/pipe CUDA_MPS_LOG_DIRECTORY=")
            .append(dir)
            .append("/log\n"),
        std::string("nvidia-cuda-mps-control [")
            .append(uuid)
            .append("] set_default_device_pinned_mem_limit 0 20389M\n"),
        std::string("nvidia-cuda-mps-control [").append(uuid).append("] set_default_active_thread_percentage 25\n")};
    std::size_t at = 0;
    for (const std::string& step : steps) {
      INFO(step);
      const auto found = started.find(step, at);
      REQUIRE(found != std::string::npos);
      at = found;
    }
    // The daemon's /dev/shm was this GPU's tmpfs: its mark is there, seen through the daemon's own mount
    // namespace, and not on the directory beneath the mount.
    const fs::path shm = node.mps_root / uuid / "shm";
    const fs::path through = fs::path("/proc") / std::to_string(control.pid()) / "root" / shm.relative_path();
    CHECK(fs::exists(through / ("stand-in-" + uuid)));
    const std::string other = uuid == kGpu0 ? kGpu1 : kGpu0;
    CHECK_FALSE(fs::exists(through / ("stand-in-" + other)));
    CHECK_FALSE(fs::exists(shm / ("stand-in-" + uuid)));
  }
  REQUIRE(node.stand_in_daemons().size() == 2);

  // GPU 1's daemon dies: the next check finds it silent, and it is started again.
  const pid_t gpu1_daemon = node.stand_in_daemons()[1];
  kill(gpu1_daemon, SIGKILL);
  REQUIRE(eventually([&] { return count(node.transcript_text(), "-d CUDA_VISIBLE_DEVICES=" + kGpu1) == 2; }, 20s));
  REQUIRE(eventually([&] { return fs::exists(node.ready(kGpu1)) && node.stand_in_daemons().size() == 2; }, 20s));
  CHECK_THAT(control.log(), Catch::Contains("MPS daemon does not answer") && Catch::Contains(kGpu1));
  CHECK(count(node.transcript_text(), "-d CUDA_VISIBLE_DEVICES=" + kGpu0) == 1);

  // SIGTERM: readiness gone, quit, the compute mode back, nothing left running.
  CHECK(control.stop() == 0);
  const std::string stopped = node.transcript_text();
  for (const std::string& uuid : {kGpu0, kGpu1}) {
    CHECK_FALSE(fs::exists(node.ready(uuid)));
    CHECK_THAT(stopped, Catch::Contains(std::string("nvidia-cuda-mps-control [").append(uuid).append("] quit\n")));
    CHECK_THAT(stopped, Catch::Contains(std::string("nvidia-smi -i ").append(uuid).append(" -c DEFAULT\n")));
    CHECK(stopped.find("nvidia-smi -i " + uuid + " -c DEFAULT") > stopped.find("[" + uuid + "] quit"));
  }
  CHECK(node.stand_in_daemons().empty());
}

TEST_CASE("mps-control: a GPU whose compute mode cannot be set stops it, naming the step, and starts nothing") {
  MpsNode node;
  const fs::path config = node.host.root() / "plugin.yaml";
  std::ofstream(config) << "sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n";
  MpsControl control(node, config, {"GPUGUARD_STAND_IN_FAIL=1"});
  CHECK(control.wait_exit(20s) == 1);
  CHECK_THAT(control.log(),
             Catch::Contains("-c EXCLUSIVE_PROCESS: exit 4: Unable to set the compute mode") && Catch::Contains(kGpu0));
  CHECK_FALSE(fs::exists(node.ready(kGpu0)));
  CHECK(count(node.transcript_text(), "-d CUDA_VISIBLE_DEVICES") == 0);
  CHECK(node.stand_in_daemons().empty());
}

TEST_CASE("mps-control: without sharing.mps it starts no daemon and idles until SIGTERM") {
  MpsNode node;
  const fs::path config = node.host.root() / "plugin.yaml";
  std::ofstream(config) << "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}\n";
  MpsControl control(node, config);
  REQUIRE(eventually([&] { return control.log().find("no GPU is shared with MPS") != std::string::npos; }, 20s));
  CHECK(control.stop() == 0);
  CHECK_FALSE(fs::exists(node.transcript));
}

TEST_CASE("the plugin serves MPS replicas Unhealthy until their GPU's daemon is ready, then each container its pipe") {
  MpsNode node;
  FakeKubelet kubelet(node.plugin_dir);
  const fs::path config = node.host.root() / "plugin.yaml";
  std::ofstream(config) << "sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n";
  PluginProcess plugin(node.plugin_dir, node.host.root(), {"--discovery", "nvml", "--config-file", config.string()},
                       node.env());
  REQUIRE(kubelet.wait_for(1).size() == 1);
  auto gpus = plugin_client(node.plugin_dir, "gpuguard-nvidia-com-gpu.sock");
  DeviceWatch watch(*gpus);
  const auto first = watch.next();
  REQUIRE(first);
  REQUIRE(first->devices_size() == 4);
  for (const auto& device : first->devices()) CHECK(device.health() == "Unhealthy");
  v1beta1::AllocateResponse refused;
  CHECK_FALSE(allocate(*gpus, {kGpu0 + "::0"}, refused).ok());

  // The daemon of GPU 0 is ready: its replicas alone turn Healthy.
  fs::create_directories(node.mps_root / kGpu0);
  std::ofstream(node.ready(kGpu0)) << "ready\n";
  REQUIRE(watch.until(kGpu0 + "::1", "Healthy"));
  v1beta1::AllocateResponse response;
  REQUIRE(allocate(*gpus, {kGpu0 + "::1"}, response).ok());
  const auto& container = response.container_responses(0);
  CHECK(container.envs().at("NVIDIA_VISIBLE_DEVICES") == kGpu0);
  CHECK(container.envs().at("CUDA_MPS_PIPE_DIRECTORY") == "/run/gpuguard/mps/pipe");
  CHECK(container.envs().at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "50");
  CHECK(container.envs().at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "0=40779M");
  REQUIRE(container.mounts_size() == 2);
  CHECK(container.mounts(0).host_path() == "/run/gpuguard/mps/" + kGpu0 + "/pipe");
  CHECK(container.mounts(1).host_path() == "/run/gpuguard/mps/" + kGpu0 + "/shm");
  CHECK(container.mounts(1).container_path() == "/dev/shm");
  v1beta1::AllocateResponse still_refused;
  CHECK_FALSE(allocate(*gpus, {kGpu1 + "::0"}, still_refused).ok());

  // The daemon goes (mps-control removes the file): its replicas are Unhealthy again.
  fs::remove(node.ready(kGpu0));
  REQUIRE(watch.until(kGpu0 + "::0", "Unhealthy"));
  CHECK(plugin.terminate() == 0);
  CHECK_THAT(plugin.log(), Catch::Contains("MPS daemon not ready"));
}

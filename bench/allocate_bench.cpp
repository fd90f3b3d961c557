// Allocate latency over the device plugin's unix socket: the real binary on a fake host tree with eight
// GPUs, called as the kubelet calls it.
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "deviceplugin/v1beta1/api.grpc.pb.h"

extern char** environ;
namespace fs = std::filesystem;

namespace {

struct Plugin {
  fs::path root =
      fs::temp_directory_path() / (std::string("gpuguard-allocate-bench-").append(std::to_string(::getpid())));
  pid_t pid = -1;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;

  Plugin() {
    fs::remove_all(root);
    fs::create_directories(root / "plugins");
    for (int i = 0; i < 8; ++i) {
      const std::string pci = std::string("0000:").append(std::to_string(10 + i)) + ":00.0";
      fs::create_directories(root / "proc/driver/nvidia/gpus" / pci);
      std::ofstream(root / "proc/driver/nvidia/gpus" / pci / "information")
          << "Model: NVIDIA H100\nGPU UUID: GPU-" << i << "\nDevice Minor: " << i << "\n";
      fs::create_directories(root / "dev");
      std::ofstream(root / "dev" / (std::string("nvidia").append(std::to_string(i))));
    }
    std::vector<std::string> args = {GPUGUARD_DEVICE_PLUGIN_BIN,
                                     "--device-plugin-dir",
                                     (root / "plugins").string(),
                                     "--host-root",
                                     root.string(),
                                     "--discovery",
                                     "procfs",
                                     "--log-level",
                                     "error",
                                     "--metrics-address",
                                     "127.0.0.1:0"};
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
    const fs::path socket = root / "plugins/gpuguard-nvidia-com-gpu.sock";
    for (int i = 0; i < 100 && !fs::exists(socket); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stub = v1beta1::DevicePlugin::NewStub(
        grpc::CreateChannel("unix://" + socket.string(), grpc::InsecureChannelCredentials()));
  }
  ~Plugin() {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    fs::remove_all(root);
  }
};

void allocate(benchmark::State& state) {
  static Plugin plugin;
  v1beta1::AllocateRequest request;
  auto* container = request.add_container_requests();
  for (int i = 0; i < state.range(0); ++i) container->add_devices_ids(std::string("GPU-").append(std::to_string(i)));
  for (auto _ : state) {
    grpc::ClientContext context;
    v1beta1::AllocateResponse response;
    const grpc::Status status = plugin.stub->Allocate(&context, request, &response);
    if (!status.ok()) state.SkipWithError(status.error_message().c_str());
    benchmark::DoNotOptimize(response);
  }
}

}  // namespace

BENCHMARK(allocate)->Arg(1)->Arg(8)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();

#pragma once
// MPS on a node, the pure part: where each shared GPU's control daemon keeps its files, the defaults it is
// given, and the limits a container holding some of its replicas gets. gpuguard runs one daemon per
// physical GPU, started with CUDA_VISIBLE_DEVICES naming that GPU alone, with a /dev/shm of its own;
// NVIDIA's plugin runs one per resource, which sees every GPU (k8s-device-plugin #1299), and one /dev/shm
// for the node. The daemon's process side is mps_control.cpp; what Allocate gives is gpu_resource.cpp.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/deviceplugin/gpu_resource.hpp"

namespace gpuguard::deviceplugin {

// <root>/<uuid>/ on the host: pipe/ (the control pipe and the server's sockets, which clients connect
// to), log/, shm/ (the daemon's and its clients' /dev/shm, a tmpfs) and ready (written once the daemon
// answers with its defaults set, removed before it stops).
struct MpsPaths {
  std::filesystem::path dir, pipe, log, shm, ready;
};
MpsPaths mps_paths(const std::filesystem::path& root, std::string_view gpu_uuid);

// Where a client's container sees its GPU's pipe directory (CUDA_MPS_PIPE_DIRECTORY).
inline constexpr const char* kMpsClientPipe = "/run/gpuguard/mps/pipe";

// One daemon: a GPU of an MPS resource, its clients' number, and its memory where NVML says.
struct MpsGpu {
  std::string uuid;
  unsigned replicas = 2;
  std::optional<std::uint64_t> memory_bytes;
};
// One per GPU of the plan's MPS resources, in the plan's order.
std::vector<MpsGpu> mps_gpus(const GpuPlan& plan);

// A holder of `held` of a GPU's `replicas`: its share of the GPU's threads, in percent (at least 1),
// and of its memory in MiB (nothing when the memory is not known).
unsigned mps_thread_percentage(unsigned held, unsigned replicas);
std::optional<std::uint64_t> mps_memory_limit_mib(std::optional<std::uint64_t> memory_bytes, unsigned held,
                                                  unsigned replicas);

// The control commands, each written alone to nvidia-cuda-mps-control's stdin, that give a daemon its
// defaults: one replica's share for every client process. The daemon sees its one GPU as device 0.
std::vector<std::string> mps_default_commands(const MpsGpu& gpu);

}  // namespace gpuguard::deviceplugin

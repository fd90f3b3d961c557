#include "gpuguard/deviceplugin/mps.hpp"

#include <algorithm>

namespace gpuguard::deviceplugin {

MpsPaths mps_paths(const std::filesystem::path& root, std::string_view gpu_uuid) {
  const std::filesystem::path dir = root / std::string(gpu_uuid);
  return {dir, dir / "pipe", dir / "log", dir / "shm", dir / "ready"};
}

std::vector<MpsGpu> mps_gpus(const GpuPlan& plan) {
  std::vector<MpsGpu> gpus;
  for (const GpuResourcePlan& resource : plan.resources) {
    if (!resource.mps) continue;
    for (const GpuUnit& unit : resource.units) gpus.push_back({unit.gpu_uuid, resource.replicas, unit.memory_bytes});
  }
  return gpus;
}

unsigned mps_thread_percentage(unsigned held, unsigned replicas) {
  if (replicas == 0 || held >= replicas) return 100;
  return std::max(1U, 100 * held / replicas);
}

std::optional<std::uint64_t> mps_memory_limit_mib(std::optional<std::uint64_t> memory_bytes, unsigned held,
                                                  unsigned replicas) {
  if (!memory_bytes || *memory_bytes == 0 || replicas == 0) return std::nullopt;
  constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
  const std::uint64_t mib = *memory_bytes / kMiB;
  return std::max<std::uint64_t>(1, mib * std::min(held, replicas) / replicas);
}

std::vector<std::string> mps_default_commands(const MpsGpu& gpu) {
  std::vector<std::string> commands;
  if (const auto mib = mps_memory_limit_mib(gpu.memory_bytes, 1, gpu.replicas)) {
    commands.push_back("set_default_device_pinned_mem_limit 0 " + std::to_string(*mib) + "M");
  }
  commands.push_back("set_default_active_thread_percentage " + std::to_string(mps_thread_percentage(1, gpu.replicas)));
  return commands;
}

}  // namespace gpuguard::deviceplugin

#pragma once
// What the admission core enforces. Pure data: loading it from a ConfigMap is a transport concern.
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::admission {

struct Policy {
  // The value injected into every container that does not ask for a GPU.
  std::string visible_devices_value = "none";
  // Resource names that count as a GPU; a trailing '*' makes the entry a prefix match.
  std::vector<std::string> gpu_resources = {"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"};
  // A user-set NVIDIA_VISIBLE_DEVICES in a GPU container would override the device plugin's choice.
  bool strip_user_value_from_gpu_containers = true;

  bool is_gpu_resource(std::string_view resource_name) const;
};

}  // namespace gpuguard::admission

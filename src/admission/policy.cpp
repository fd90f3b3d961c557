#include "gpuguard/admission/policy.hpp"

namespace gpuguard::admission {

bool Policy::is_gpu_resource(std::string_view resource_name) const {
  for (const std::string& pattern : gpu_resources) {
    if (!pattern.empty() && pattern.back() == '*') {
      if (resource_name.starts_with(std::string_view(pattern).substr(0, pattern.size() - 1))) return true;
    } else if (resource_name == pattern) {
      return true;
    }
  }
  return false;
}

}  // namespace gpuguard::admission

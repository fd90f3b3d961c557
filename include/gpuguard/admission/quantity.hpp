#pragma once
#include <string_view>

namespace gpuguard::admission {

// True only for a well-formed Kubernetes quantity whose value is zero ("0", "0.0", "0m", "0Ki", "+0e3").
// Anything malformed is reported as non-zero: the apiserver rejects such a pod after admission, and
// treating it as a GPU request means we never inject into it by mistake.
bool is_zero_quantity(std::string_view quantity);

}  // namespace gpuguard::admission

#pragma once
// Kubernetes resource quantities (resource.Quantity's text form), as the webhook, the scheduler extender
// and the device plugin read them.
#include <cstdint>
#include <optional>
#include <string_view>

namespace gpuguard::k8s {

// True only for a well-formed Kubernetes quantity whose value is zero ("0", "0.0", "0m", "0Ki", "+0e3").
// Anything malformed is reported as non-zero: the apiserver rejects such a pod after admission, and
// treating it as a GPU request means we never inject into it by mistake.
bool is_zero_quantity(std::string_view quantity);

// The value of a well-formed, non-negative quantity rounded up to a whole number, as resource.Quantity's
// Value() gives it: "2" -> 2, "1500m" -> 2, "1k" -> 1000, "1Ki" -> 1024. Extended resources such as GPUs
// are whole numbers, so this is their count. Values over 2^62 give 2^62; nullopt for a malformed or
// negative quantity.
std::optional<std::int64_t> quantity_count(std::string_view quantity);

}  // namespace gpuguard::k8s

#pragma once
// The admission core's single entry point: AdmissionReview request JSON in, AdmissionReview response out.
// Pure: no I/O, no clocks, no Boost; safe to call from any number of threads at once.
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "gpuguard/policy/policy.hpp"

namespace gpuguard::admission {

struct ReviewOutcome {
  // false: the body is not an AdmissionReview we can answer; `body` then holds the reason (HTTP 400).
  bool ok = false;
  std::string body;
  // For logs and metrics.
  std::string uid;
  std::string operation;
  bool allowed = true;
  std::string denial;  // why, when !allowed
  bool patched = false;
  std::size_t warnings = 0;
  // Containers changed, by reason: injected, replaced, deduplicated, stripped (kMutationReasons).
  std::array<std::size_t, 4> mutations{};
};

inline constexpr std::array<std::string_view, 4> kMutationReasons = {"injected", "replaced", "deduplicated",
                                                                     "stripped"};

// Takes the body by value so that the server can move its buffer in; the buffer is padded in place for
// simdjson, so reserving a little spare capacity up front avoids a copy.
ReviewOutcome review(std::string body, const policy::Policy& policy);

}  // namespace gpuguard::admission

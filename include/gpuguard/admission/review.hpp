#pragma once
// The admission core's single entry point: AdmissionReview request JSON in, AdmissionReview response out.
// Pure: no I/O, no clocks, no Boost; safe to call from any number of threads at once.
#include <cstddef>
#include <string>

#include "gpuguard/admission/policy.hpp"

namespace gpuguard::admission {

struct ReviewOutcome {
  // false: the body is not an AdmissionReview we can answer; `body` then holds the reason (HTTP 400).
  bool ok = false;
  std::string body;
  // For logs and metrics.
  std::string uid;
  std::string operation;
  std::size_t containers_mutated = 0;
  std::size_t warnings = 0;
  bool patched = false;
};

// Takes the body by value so that the server can move its buffer in; the buffer is padded in place for
// simdjson, so reserving a little spare capacity up front avoids a copy.
ReviewOutcome review(std::string body, const Policy& policy);

}  // namespace gpuguard::admission

#pragma once
// How the webhook fits in its pod's memory limit: which part of it goes to the process itself, to each
// event loop, to the one large review decoded at a time, and what is left for connections and for the
// request bytes in flight. Pure arithmetic, so that docs/operations.md and the tests can check it.
#include <cstddef>
#include <optional>
#include <string>

namespace gpuguard::webhook {

// What each part costs at most, in bytes; measured as docs/operations.md ("Memory") says.
struct MemoryCosts {
  std::size_t process = std::size_t{24} << 20;  // binary, libraries, policy, claim cache, metrics
  // Each loop's own review decoder, kept for reviews up to admission::kReusableParserLimit, and one
  // such review's answer.
  std::size_t per_thread = std::size_t{4} << 20;
  // Decoding a review and building its answer, per byte of the review, at worst (a document of tiny
  // numbers: simdjson's index and tape take 12 bytes per byte); one review over the reusable limit is
  // decoded at a time.
  std::size_t per_review_byte = 14;
  // A connection at its largest: its TLS state and record buffers, the TLS stream's read-ahead (one record),
  // its bounded read buffer (headers and one record of body) and a one-record answer.
  std::size_t per_connection = std::size_t{112} << 10;
};

struct MemoryPlan {
  unsigned threads = 0;
  std::size_t max_connections = 0;
  std::size_t inflight_bytes = 0;  // bodies and large answers held at once, over all connections
  std::size_t fixed = 0;           // process + threads + the large review
};

// The plan for a pod limited to `memory_limit` bytes. `threads` 0 takes one per core (`cores`), as many
// as fit; `max_connections` 0 takes what fits. Half of what is left after the fixed parts goes to request
// bytes in flight (at least two reviews of `body_limit`), half to connections. nullopt, with `why` set,
// when the limit cannot hold that.
std::optional<MemoryPlan> plan_memory(std::size_t memory_limit, unsigned threads, unsigned cores,
                                      std::size_t body_limit, std::size_t max_connections, const MemoryCosts& costs,
                                      std::string& why);

}  // namespace gpuguard::webhook

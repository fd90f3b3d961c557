#include "gpuguard/webhook/memory_plan.hpp"

#include <algorithm>

namespace gpuguard::webhook {
namespace {

std::string mebibytes(std::size_t bytes) { return std::to_string((bytes + (std::size_t{1} << 20) - 1) >> 20) + " MiB"; }

// Connections below this many would refuse an apiserver's ordinary pool of keep-alive connections.
constexpr std::size_t kFewestConnections = 16;

}  // namespace

std::optional<MemoryPlan> plan_memory(std::size_t memory_limit, unsigned threads, unsigned cores,
                                      std::size_t body_limit, std::size_t max_connections, const MemoryCosts& costs,
                                      std::string& why) {
  const std::size_t large_review = body_limit * costs.per_review_byte;
  const std::size_t least_inflight = 2 * body_limit;
  const std::size_t least_connections = std::max(max_connections, kFewestConnections) * costs.per_connection;
  const std::size_t base = costs.process + large_review + least_inflight + least_connections;
  const auto fixed_for = [&](unsigned n) { return costs.process + n * costs.per_thread + large_review; };
  MemoryPlan plan;
  plan.threads = threads;
  if (threads == 0) {
    // One per core, fewer when the limit cannot hold them, never none.
    plan.threads = std::max(1u, cores);
    while (plan.threads > 1 && base + plan.threads * costs.per_thread > memory_limit) --plan.threads;
  }
  plan.fixed = fixed_for(plan.threads);
  if (base + plan.threads * costs.per_thread > memory_limit) {
    why = "a memory limit of " + mebibytes(memory_limit) + " cannot hold " + std::to_string(plan.threads) +
          " threads and reviews of up to " + mebibytes(body_limit) + ": it needs at least " +
          mebibytes(base + plan.threads * costs.per_thread) +
          " (docs/operations.md, \"Memory\"); raise --memory-limit, or lower --threads or --body-limit";
    return std::nullopt;
  }
  const std::size_t left = memory_limit - plan.fixed;
  if (max_connections != 0) {
    plan.max_connections = max_connections;
    plan.inflight_bytes = left - max_connections * costs.per_connection;
  } else {
    plan.inflight_bytes = std::max(left / 2, least_inflight);
    plan.max_connections = (left - plan.inflight_bytes) / costs.per_connection;
  }
  return plan;
}

}  // namespace gpuguard::webhook

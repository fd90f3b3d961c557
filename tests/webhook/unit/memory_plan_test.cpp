// webhook::plan_memory: the arithmetic that docs/operations.md ("Memory") walks through, for the chart's
// 128 Mi and for limits that cannot hold what is asked.
#include <catch2/catch.hpp>

#include "gpuguard/webhook/memory_plan.hpp"

using gpuguard::webhook::MemoryCosts;
using gpuguard::webhook::plan_memory;

namespace {
constexpr std::size_t kMiB = std::size_t{1} << 20;
}

TEST_CASE("memory plan: the chart's 128 Mi with two threads and 4 MiB reviews, as docs/operations.md adds it up") {
  std::string why;
  const auto plan = plan_memory(128 * kMiB, 2, 16, 4 * kMiB, 0, MemoryCosts{}, why);
  REQUIRE(plan);
  CHECK(plan->threads == 2);
  CHECK(plan->fixed == 24 * kMiB + 2 * (4 * kMiB) + 14 * (4 * kMiB));  // 88 MiB
  CHECK(plan->inflight_bytes == 20 * kMiB);
  CHECK(plan->max_connections == 20 * kMiB / (std::size_t{112} * 1024));  // 182
  // Every part at its worst stays within the limit.
  CHECK(plan->fixed + plan->inflight_bytes + plan->max_connections * MemoryCosts{}.per_connection <= 128 * kMiB);
}

TEST_CASE("memory plan: threads 0 takes one per core, as many as the limit holds") {
  std::string why;
  const auto many = plan_memory(128 * kMiB, 0, 64, 4 * kMiB, 0, MemoryCosts{}, why);
  REQUIRE(many);
  CHECK(many->threads < 64);
  CHECK(many->threads >= 1);
  CHECK(many->fixed + many->inflight_bytes + many->max_connections * MemoryCosts{}.per_connection <= 128 * kMiB);
  const auto two = plan_memory(128 * kMiB, 0, 2, 4 * kMiB, 0, MemoryCosts{}, why);
  REQUIRE(two);
  CHECK(two->threads == 2);
}

TEST_CASE("memory plan: a limit too small for what is asked is refused, and says what it needs") {
  std::string why;
  CHECK_FALSE(plan_memory(64 * kMiB, 2, 2, 4 * kMiB, 0, MemoryCosts{}, why));
  CHECK_THAT(why, Catch::Contains("cannot hold 2 threads") && Catch::Contains("needs at least") &&
                      Catch::Contains("--memory-limit"));
  why.clear();
  CHECK_FALSE(plan_memory(128 * kMiB, 32, 32, 4 * kMiB, 0, MemoryCosts{}, why));
  CHECK_THAT(why, Catch::Contains("32 threads"));
  // A smaller body limit fits the same pod.
  CHECK(plan_memory(64 * kMiB, 2, 2, 1 * kMiB, 0, MemoryCosts{}, why));
}

TEST_CASE("memory plan: an explicit connection limit takes its share first, the rest goes to bytes in flight") {
  std::string why;
  const auto plan = plan_memory(128 * kMiB, 2, 2, 4 * kMiB, 100, MemoryCosts{}, why);
  REQUIRE(plan);
  CHECK(plan->max_connections == 100);
  CHECK(plan->inflight_bytes == 40 * kMiB - 100 * MemoryCosts{}.per_connection);
  CHECK_FALSE(plan_memory(128 * kMiB, 2, 2, 4 * kMiB, 1000, MemoryCosts{}, why));
}

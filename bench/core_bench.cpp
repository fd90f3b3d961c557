// The admission core against a nlohmann DOM parse of the same document, in the same run: the ratio is
// what justifies simdjson on the decode path.
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include "gpuguard/admission/review.hpp"
#include "review_documents.hpp"

namespace {

const std::string& document(std::int64_t kib) {
  static std::map<std::int64_t, std::string> cache;
  auto& text = cache[kib];
  if (text.empty()) text = gpuguard::bench::review_of_size(static_cast<std::size_t>(kib) * 1024);
  return text;
}

// decode + decide + patch + encode, as the server runs it (the body is moved in, so copying it is timed).
void review_document(benchmark::State& state) {
  const std::string& body = document(state.range(0));
  const gpuguard::policy::Policy policy;
  for (auto _ : state) {
    std::string copy;
    copy.reserve(body.size() + 64);
    copy = body;
    auto outcome = gpuguard::admission::review(std::move(copy), policy);
    if (!outcome.patched) state.SkipWithError("not patched");
    benchmark::DoNotOptimize(outcome);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size()));
  state.counters["bytes"] = static_cast<double>(body.size());
}

void nlohmann_dom_parse(benchmark::State& state) {
  const std::string& body = document(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(nlohmann::json::parse(body));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size()));
  state.counters["bytes"] = static_cast<double>(body.size());
}

}  // namespace

// ~3 KB, ~8 KB, ~72 KB and ~1 MiB reviews.
BENCHMARK(review_document)->Arg(3)->Arg(8)->Arg(72)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK(nlohmann_dom_parse)->Arg(3)->Arg(8)->Arg(72)->Arg(1024)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();

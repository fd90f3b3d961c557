// The admission core against, in the same run: a nlohmann DOM parse of the same document (what justifies
// simdjson on the decode path), a bare simdjson On-Demand walk of every value in it (the floor the issue
// holds the review to: at most 3x), and simdjson's DOM parser, which the review itself uses and which
// picks the best SIMD kernel for the CPU at run time, alone and followed by a bare walk of every value (the
// least any review built on it can cost). Every allocation in this program is counted, so that the
// review's allocations per request are reported beside its time.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include <simdjson.h>
#include <nlohmann/json.hpp>

#include "gpuguard/admission/review.hpp"
#include "review_documents.hpp"

#define GPUGUARD_STRINGIFY_(x) #x
#define GPUGUARD_STRINGIFY(x) GPUGUARD_STRINGIFY_(x)

namespace {
std::atomic<std::uint64_t> allocations{0};
}  // namespace

// The counting allocator: replacing these also covers new[] and delete[]. All of them stay out of line so
// that GCC, seeing free() on memory from new, does not warn about a mismatch that is not one.
[[gnu::noinline]] void* operator new(std::size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* memory = std::malloc(size == 0 ? 1 : size)) return memory;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* memory) noexcept { std::free(memory); }
[[gnu::noinline]] void operator delete(void* memory, std::size_t /*size*/) noexcept { std::free(memory); }

namespace {

const std::string& document(std::int64_t kib) {
  static std::map<std::int64_t, std::string> cache;
  auto& text = cache[kib];
  if (text.empty()) text = gpuguard::bench::review_of_size(static_cast<std::size_t>(kib) * 1024);
  return text;
}

// decode + decide + patch + encode, as the server runs it. The server moves each body in, so the copies
// that the reviews consume are made ahead, a batch at a time, outside the timed part and the count.
void review_document(benchmark::State& state) {
  const std::string& body = document(state.range(0));
  const gpuguard::policy::Policy policy;
  std::vector<std::string> bodies(64);
  std::size_t next = bodies.size();
  std::uint64_t counted = 0;
  for (auto _ : state) {
    if (next == bodies.size()) {
      state.PauseTiming();
      for (std::string& copy : bodies) {
        copy.reserve(body.size() + 64);  // as the server reserves: simdjson's padding fits without a copy
        copy = body;
      }
      next = 0;
      state.ResumeTiming();
    }
    const std::uint64_t allocations_before = allocations.load(std::memory_order_relaxed);
    auto outcome = gpuguard::admission::review(std::move(bodies[next++]), policy);
    if (!outcome.patched) state.SkipWithError("not patched");
    benchmark::DoNotOptimize(outcome);
    counted += allocations.load(std::memory_order_relaxed) - allocations_before;
  }
  state.counters["allocs"] = static_cast<double>(counted) / static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size()));
  state.counters["bytes"] = static_cast<double>(body.size());
}

void nlohmann_dom_parse(benchmark::State& state) {
  const std::string& body = document(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(nlohmann::json::parse(body));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size()));
  state.counters["bytes"] = static_cast<double>(body.size());
}

// Visits every value once, unescaping keys and strings as a reader that uses them would.
std::size_t walk(simdjson::ondemand::value value) {
  namespace od = simdjson::ondemand;
  std::size_t visited = 1;
  od::json_type type = od::json_type::null;
  if (value.type().get(type)) return visited;
  if (type == od::json_type::object) {
    for (auto field : value.get_object()) {
      std::string_view key;
      od::value child;
      if (field.unescaped_key().get(key) || field.value().get(child)) break;
      visited += walk(child);
    }
  } else if (type == od::json_type::array) {
    for (auto element : value.get_array()) {
      od::value child;
      if (element.get(child)) break;
      visited += walk(child);
    }
  } else if (type == od::json_type::string) {
    std::string_view text;
    benchmark::DoNotOptimize(value.get_string().get(text));
  } else if (type == od::json_type::number) {
    double number = 0;
    benchmark::DoNotOptimize(value.get_double().get(number));
  }
  return visited;
}

void simdjson_ondemand_walk(benchmark::State& state) {
  const std::string& body = document(state.range(0));
  const simdjson::padded_string padded(body);
  simdjson::ondemand::parser parser;
  for (auto _ : state) {
    simdjson::ondemand::document doc = parser.iterate(padded);
    simdjson::ondemand::value root = doc.get_value();
    benchmark::DoNotOptimize(walk(root));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size()));
  // On-Demand is compiled into this program: its kernel is the one the build's target allows.
  state.SetLabel(GPUGUARD_STRINGIFY(SIMDJSON_BUILTIN_IMPLEMENTATION));
}

// Visits every value of a parsed document once: with the parse, the least a DOM-based review of the same
// bytes can cost before it decides anything.
std::size_t walk(simdjson::dom::element value) {
  std::size_t visited = 1;
  if (simdjson::dom::object object; value.get_object().get(object) == simdjson::SUCCESS) {
    for (auto field = object.begin(); field != object.end(); ++field) {
      benchmark::DoNotOptimize(field.key());
      visited += walk(field.value());
    }
  } else if (simdjson::dom::array array; value.get_array().get(array) == simdjson::SUCCESS) {
    for (const simdjson::dom::element element : array) visited += walk(element);
  } else if (std::string_view text; value.get_string().get(text) == simdjson::SUCCESS) {
    benchmark::DoNotOptimize(text);
  } else if (double number = 0; value.get_double().get(number) == simdjson::SUCCESS) {
    benchmark::DoNotOptimize(number);
  }
  return visited;
}

void simdjson_dom_parse_and_walk(benchmark::State& state) {
  const std::string& body = document(state.range(0));
  const simdjson::padded_string padded(body);
  simdjson::dom::parser parser;
  for (auto _ : state) {
    simdjson::dom::element root;
    if (parser.parse(padded).get(root) != simdjson::SUCCESS) state.SkipWithError("parse failed");
    benchmark::DoNotOptimize(walk(root));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size()));
  state.SetLabel(simdjson::get_active_implementation()->name());
}

void simdjson_dom_parse(benchmark::State& state) {
  const std::string& body = document(state.range(0));
  const simdjson::padded_string padded(body);
  simdjson::dom::parser parser;
  for (auto _ : state) benchmark::DoNotOptimize(parser.parse(padded));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size()));
  state.SetLabel(simdjson::get_active_implementation()->name());
}

}  // namespace

// ~3 KB, ~8 KB, ~72 KB and ~1 MiB reviews.
BENCHMARK(review_document)->Arg(3)->Arg(8)->Arg(72)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK(nlohmann_dom_parse)->Arg(3)->Arg(8)->Arg(72)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK(simdjson_ondemand_walk)->Arg(3)->Arg(8)->Arg(72)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK(simdjson_dom_parse)->Arg(3)->Arg(8)->Arg(72)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK(simdjson_dom_parse_and_walk)->Arg(3)->Arg(8)->Arg(72)->Arg(1024)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();

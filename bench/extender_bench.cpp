// The extender's verbs on a cluster of N nodes with 8 GPUs each, against a nlohmann DOM parse of the
// same request body in the same run: the parse is the least any JSON service does per call, so the
// ratio says what the decision itself adds.
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include "gpuguard/extender/cluster_state.hpp"
#include "gpuguard/extender/scheduling.hpp"
#include "stores.hpp"

namespace {

using nlohmann::json;

json gpu_pod(const std::string& name, const std::string& node, int gpus) {
  return {{"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", "uid-" + name}}},
          {"spec",
           {{"nodeName", node},
            {"containers",
             {{{"name", "train"},
               {"image", "nvcr.io/nvidia/pytorch:24.05-py3"},
               {"resources",
                {{"limits", {{"nvidia.com/gpu", std::to_string(gpus)}, {"cpu", "8"}}},
                 {"requests", {{"nvidia.com/gpu", std::to_string(gpus)}, {"cpu", "8"}}}}}}}}}},
          {"status", {{"phase", "Running"}}}};
}

json gpu_node(const std::string& name) {
  json labels = json::object();
  for (int i = 0; i < 40; ++i)
    labels[std::string("example.com/label-").append(std::to_string(i))] =
        std::string("value-").append(std::to_string(i));
  return {{"metadata", {{"name", name}, {"labels", labels}}},
          {"status",
           {{"allocatable", {{"cpu", "96"}, {"memory", "1Ti"}, {"nvidia.com/gpu", "8"}}},
            {"capacity", {{"cpu", "96"}, {"memory", "1Ti"}, {"nvidia.com/gpu", "8"}}}}}};
}

struct Cluster {
  gpuguard::extender::ClusterState state;
  std::string names_body, nodes_body;
};

// N nodes, each holding a 1-, 2- or 4-GPU pod; the request asks for 2 GPUs on all of them.
const Cluster& cluster(std::int64_t nodes) {
  static std::map<std::int64_t, Cluster> cache;
  auto [found, inserted] = cache.try_emplace(nodes);
  Cluster& c = found->second;
  if (!inserted) return c;
  std::vector<json> node_objects, pods;
  json names = json::array(), items = json::array();
  for (std::int64_t i = 0; i < nodes; ++i) {
    const std::string name = std::string("gpu-node-").append(std::to_string(i));
    node_objects.push_back(gpu_node(name));
    pods.push_back(gpu_pod(std::string("pod-").append(std::to_string(i)), name, 1 << (i % 3)));
    names.push_back(name);
    if (i < 100) items.push_back(node_objects.back());
  }
  gpuguard::test::list(c.state.nodes(), node_objects);
  gpuguard::test::list(c.state.pods(), pods);
  const json pod = gpu_pod("incoming", "", 2);
  c.names_body = json{{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", names}}.dump();
  c.nodes_body = json{{"Pod", pod}, {"Nodes", {{"items", items}}}, {"NodeNames", nullptr}}.dump();
  return c;
}

void filter_node_names(benchmark::State& state) {
  const Cluster& c = cluster(state.range(0));
  const gpuguard::policy::Policy policy;
  for (auto _ : state) benchmark::DoNotOptimize(gpuguard::extender::filter(c.names_body, c.state, policy, true));
  state.counters["bytes"] = static_cast<double>(c.names_body.size());
}

void prioritize_node_names(benchmark::State& state) {
  const Cluster& c = cluster(state.range(0));
  const gpuguard::policy::Policy policy;
  for (auto _ : state) benchmark::DoNotOptimize(gpuguard::extender::prioritize(c.names_body, c.state, policy, true));
  state.counters["bytes"] = static_cast<double>(c.names_body.size());
}

void parse_node_names(benchmark::State& state) {
  const Cluster& c = cluster(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(json::parse(c.names_body));
  state.counters["bytes"] = static_cast<double>(c.names_body.size());
}

// 100 full Node objects (nodeCacheCapable: false): the passing ones are echoed whole.
void filter_full_nodes(benchmark::State& state) {
  const Cluster& c = cluster(5000);
  const gpuguard::policy::Policy policy;
  for (auto _ : state) benchmark::DoNotOptimize(gpuguard::extender::filter(c.nodes_body, c.state, policy, true));
  state.counters["bytes"] = static_cast<double>(c.nodes_body.size());
}

void parse_full_nodes(benchmark::State& state) {
  const Cluster& c = cluster(5000);
  for (auto _ : state) benchmark::DoNotOptimize(json::parse(c.nodes_body));
  state.counters["bytes"] = static_cast<double>(c.nodes_body.size());
}

}  // namespace

BENCHMARK(filter_node_names)->Arg(100)->Arg(1000)->Arg(5000)->Unit(benchmark::kMicrosecond);
BENCHMARK(prioritize_node_names)->Arg(100)->Arg(1000)->Arg(5000)->Unit(benchmark::kMicrosecond);
BENCHMARK(parse_node_names)->Arg(100)->Arg(1000)->Arg(5000)->Unit(benchmark::kMicrosecond);
BENCHMARK(filter_full_nodes)->Unit(benchmark::kMicrosecond);
BENCHMARK(parse_full_nodes)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();

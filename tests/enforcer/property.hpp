#pragma once
// The node enforcer's property, over containers made up by a generator: for any container, the enforcer's
// adjustment applied as containerd applies it (NRI's generator) gives a set of GPUs, MIG devices and IMEX
// channels inside the allocation under every NVIDIA toolkit the node may run (toolkit_model.hpp), or the
// container is refused. The generator draws on a Choices: a seeded generator in the unit test
// (property_test.cpp), the fuzzer's bytes in fuzz/enforcer_model_fuzz.cpp. Each container mixes what a device
// plugin gives (its variables, device nodes, device list mounts, CDI devices and annotations) with what an
// attacker may add (each door the toolkit reads, in the forms it reads them).
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpuguard/enforcement/decision.hpp"
#include "toolkit_model.hpp"

namespace gpuguard::test::property {

class Choices {
 public:
  virtual ~Choices() = default;
  virtual std::size_t pick(std::size_t n) = 0;  // in [0, n); n > 0
  bool chance(std::size_t percent) { return pick(100) < percent; }
  template <typename T>
  const T& one_of(const std::vector<T>& items) {
    return items[pick(items.size())];
  }
};

struct Case {
  toolkit::Node node;                    // the node as it is
  enforcement::NodeView known;           // the node as the enforcer reads it
  std::vector<toolkit::Config> configs;  // every toolkit the node may run, as far as the enforcer can tell
  std::string pod, container;            // NRI's PodSandbox and Container, as the runtime sends them
  toolkit::Spec spec;                    // the same container as the toolkit reads it
  enforcement::Allocation allocation;
  policy::Policy policy;
  std::string story;  // what was made, for a counterexample
};

Case generate(Choices& choices);

// The environment once NRI's generator applied `set_env` as containerd v2.4.2 does
// (nri pkg/runtime-tools/generate/generate.go AdjustEnv, containerd internal/cri/nri/spec_generator_linux.go
// AddProcessEnv): entries without '=' dropped, the first entry of an adjusted name replaced, every later
// entry added again over it, names not there appended.
std::vector<std::string> apply_env(const std::vector<std::string>& env,
                                   const std::map<std::string, std::string>& set_env);

// nullopt when the property holds; otherwise the counterexample.
std::optional<std::string> check(const Case& c);

}  // namespace gpuguard::test::property

// The node enforcer held to NVIDIA's toolkit (property.hpp, toolkit_model.hpp): containers made up from a
// seeded generator, each decided by the enforcer, its adjustment applied as NRI's generator applies it, and
// read by every toolkit the node may run. Also the model itself against what real nodes showed
// (shared/reference/real-node.md), so that the yardstick is checked too.
#include <catch2/catch.hpp>

#include <random>

#include "gpuguard/nri/container_view.hpp"
#include "property.hpp"

using namespace gpuguard;
using namespace gpuguard::test;

namespace {

class Seeded final : public property::Choices {
 public:
  explicit Seeded(std::uint64_t seed) : engine_(seed) {}
  std::size_t pick(std::size_t n) override { return std::uniform_int_distribution<std::size_t>(0, n - 1)(engine_); }

 private:
  std::mt19937_64 engine_;
};

toolkit::Node two_gpus() {
  toolkit::Node node;
  node.gpus = {{"GPU-a", 0, "0000:10:00.0", {}}, {"GPU-b", 1, "0000:20:00.0", {}}};
  node.cdi = {{"nvidia.com/gpu=all", {"/dev/nvidia0", "/dev/nvidia1"}},
              {"nvidia.com/gpu=0", {"/dev/nvidia0"}},
              {"nvidia.com/gpu=1", {"/dev/nvidia1"}}};
  return node;
}

}  // namespace

TEST_CASE(
    "enforcer: for any container, what the enforcer lets through gives only allocated GPUs under every toolkit the "
    "node may run") {
  std::size_t refused = 0, adjusted = 0, allowed = 0;
  for (std::uint64_t seed = 1; seed <= 40'000; ++seed) {
    Seeded choices(seed);
    const property::Case made = property::generate(choices);
    const auto counterexample = property::check(made);
    INFO("seed " << seed);
    if (counterexample) FAIL(*counterexample);
    const auto view = gpuguard::nri::view_of(made.pod, made.container, made.known, {}, gpuguard::nri::as_written);
    const auto action = enforcement::decide(*view, made.allocation, made.known, made.policy).action;
    refused += action == enforcement::Decision::Action::refuse ? 1 : 0;
    adjusted += action == enforcement::Decision::Action::adjust ? 1 : 0;
    allowed += action == enforcement::Decision::Action::allow ? 1 : 0;
  }
  // The generator reaches each outcome often: a property that only ever saw refusals would hold vacuously.
  CHECK(refused > 4'000);
  CHECK(adjusted > 4'000);
  CHECK(allowed > 4'000);
}

TEST_CASE("enforcer: the toolkit model reads NVIDIA_VISIBLE_DEVICES as a real node did, mode by mode") {
  const toolkit::Node node = two_gpus();
  toolkit::Config cdi;
  cdi.mode = "cdi";
  // real-node.md, containerd v2.4.2 with nvidia-container-runtime v1.20.1 in cdi mode.
  const auto gpus = [&](std::vector<std::string> env, const toolkit::Config& config) {
    toolkit::Spec spec;
    spec.env = std::move(env);
    return toolkit::gives(spec, config, node);
  };
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES=all"}, cdi).gpus == std::set<std::string>{"GPU-a", "GPU-b"});
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES=1"}, cdi).gpus == std::set<std::string>{"GPU-b"});
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES=void"}, cdi).gpus.empty());
  CHECK(gpus({}, cdi).gpus.empty());
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES=none"}, cdi).fails);  // no device named none: unresolvable
  // The toolkit's tracker: none is all on 1.18.0 and 1.18.1 in jit-cdi mode, nothing from 1.18.2.
  toolkit::Config jit;
  jit.mode = "jit-cdi";
  jit.version = {1, 18, 1};
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES=none"}, jit).gpus == std::set<std::string>{"GPU-a", "GPU-b"});
  jit.version = {1, 18, 2};
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES=none"}, jit).gpus.empty());
  // The last entry is read; a legacy image without the variable is all; void anywhere is nothing.
  toolkit::Config legacy;
  legacy.mode = "legacy";
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=0"}, legacy).gpus ==
        std::set<std::string>{"GPU-a"});
  CHECK(gpus({"CUDA_VERSION=11.0"}, legacy).gpus == std::set<std::string>{"GPU-a", "GPU-b"});
  CHECK(gpus({"CUDA_VERSION=12.4", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"}, legacy).gpus.empty());
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES=0,void"}, legacy).gpus.empty());
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES=ALL"}, legacy).gpus == std::set<std::string>{"GPU-a", "GPU-b"});
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES"}, legacy).fails);
  // A hardened toolkit ignores the variable in an unprivileged container, not in one with CAP_SYS_ADMIN.
  legacy.envvar_when_unprivileged = false;
  CHECK(gpus({"NVIDIA_VISIBLE_DEVICES=all"}, legacy).gpus.empty());
  toolkit::Spec admin;
  admin.env = {"NVIDIA_VISIBLE_DEVICES=all"};
  admin.cap_sys_admin = true;
  CHECK(toolkit::gives(admin, legacy, node).gpus.size() == 2);
  // Device lists: /dev/null by string prefix after cleaning, where accepted, before the environment.
  legacy.volume_mounts = true;
  toolkit::Spec listed;
  listed.env = {"NVIDIA_VISIBLE_DEVICES=void"};
  listed.mounts = {{"//var/run/nvidia-container-devicesall", "/dev/null", "bind", {}, {}, {}}};
  CHECK(toolkit::gives(listed, legacy, node).gpus.size() == 2);
  listed.mounts = {{"/run/nvidia-container-devices/all", "/dev/null", "bind", {}, {}, {}}};
  CHECK(toolkit::gives(listed, legacy, node).gpus.empty());
}

TEST_CASE(
    "enforcer: NRI's generator as modelled: the first entry replaced, a later one copied over it, a missing one "
    "appended") {
  using property::apply_env;
  CHECK(apply_env({"A=1", "K=all", "K=GPU-1"}, {{"K", "void"}}) == std::vector<std::string>{"A=1", "K=GPU-1"});
  CHECK(apply_env({"A=1", "K=all"}, {{"K", "void"}}) == std::vector<std::string>{"A=1", "K=void"});
  CHECK(apply_env({"A=1", "BARE"}, {{"K", "void"}}) == std::vector<std::string>{"A=1", "K=void"});
  CHECK(apply_env({"A=1", "BARE"}, {}) == std::vector<std::string>{"A=1", "BARE"});
}

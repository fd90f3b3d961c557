#pragma once
// NVIDIA's container toolkit's reading of a container, as a pure function: from the container's final OCI
// spec (its environment, mounts, device nodes, device cgroup, annotations and CAP_SYS_ADMIN), the toolkit's
// configuration and version, and the node (its GPUs, MIG devices, CDI specs), which GPUs, MIG devices and
// IMEX channels the container gets, or that its creation fails. Written from NVIDIA/nvidia-container-toolkit
// at v1.17.8, v1.18.0, v1.18.1, v1.18.2 and v1.20.1, and libnvidia-container, rule by rule, each citing its
// file (toolkit_model.cpp); apart from the node enforcer's decision, which it checks
// (test:"enforcer: for any container, what the enforcer lets through gives only allocated GPUs under every
// toolkit the node may run").
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gpuguard/enforcement/decision.hpp"

namespace gpuguard::test::toolkit {

struct Spec {
  std::vector<std::string> env;  // process.env, in order
  std::vector<enforcement::Mount> mounts;
  std::vector<enforcement::Device> devices;  // linux.devices: what the runtime's CDI injection and device specs gave
  // linux.resources.devices allow rules as (major, minor): nullopt is a wildcard. A rule for every device
  // (privileged) is every_device.
  std::vector<std::pair<std::optional<std::int64_t>, std::optional<std::int64_t>>> cgroup_allows;
  bool every_device = false;
  std::map<std::string, std::string> annotations;
  bool cap_sys_admin = false;  // in process.capabilities.bounding: "privileged" to the toolkit
};

struct Config {
  std::string mode = "auto";  // legacy, cdi, jit-cdi, csv, auto
  std::tuple<int, int, int> version{1, 20, 1};
  bool envvar_when_unprivileged = true;
  bool volume_mounts = false;
  std::string default_kind = "nvidia.com/gpu";
  std::vector<std::string> annotation_prefixes = {"cdi.k8s.io/"};
  std::vector<std::string> swarm;  // swarm-resource's variables
};

struct Node {
  // By PCI order, which is NVML's index order.
  std::vector<discovery::Gpu> gpus;
  std::map<std::string, std::vector<std::string>> cdi;  // the CDI registry: "vendor/class=name" -> device nodes
  std::set<unsigned> imex_channels;                     // /dev/nvidia-caps-imex-channels/channel<N> that exist
};

struct Given {
  bool fails = false;            // the create fails: the container gets nothing
  std::set<std::string> gpus;    // full GPUs' UUIDs, MIG devices' UUIDs
  std::set<unsigned> gpu_nodes;  // /dev/nvidia<minor> it can open (a MIG device opens its parent's too)
  std::set<unsigned> cap_nodes;  // /dev/nvidia-caps/nvidia-cap<minor>
  std::set<unsigned> imex;       // IMEX channels
  std::string why;               // where it failed, or what gave what, for a failing property
};

Given gives(const Spec& spec, const Config& config, const Node& node);

}  // namespace gpuguard::test::toolkit

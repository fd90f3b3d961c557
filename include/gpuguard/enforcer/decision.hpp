#pragma once
// gpuguard-node-enforcer's decision, pure as the admission core is: what a container is about to get of
// the node's GPUs (its final environment, device nodes, mounts and CDI devices, as the runtime shows them
// to NRI) and what the kubelet allocated it go in; what to do comes out: leave it, set
// NVIDIA_VISIBLE_DEVICES to exactly its GPUs, or refuse the create, with what it would have seen beyond
// its allocation for the report. No I/O, no protobuf: src/enforcer/nri_view.cpp turns NRI's messages into
// this, and allocation.hpp the kubelet's answer.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gpuguard/policy/policy.hpp"

namespace gpuguard::enforcer {

struct Device {
  std::string path;
  std::string type;  // "c", "b", "u"
  std::int64_t major = 0, minor = 0;
};

struct Mount {
  std::string destination, source, type;
  std::vector<std::string> options;
};

// A container as NRI shows it at CreateContainer (or at Synchronize, running).
struct ContainerView {
  std::string pod_namespace, pod_name, pod_uid, container;
  // The pod's service account where known (the enforcer looks it up only where an exemption names it).
  std::string service_account;
  std::map<std::string, std::string> pod_labels;  // the pod's labels, as the kubelet gave them to its sandbox
  std::vector<std::string> env;                   // "KEY=value", in order, CDI's edits included
  std::vector<Device> devices;
  std::vector<Mount> mounts;
  std::vector<std::string> cdi_devices;  // fully qualified names; containerd >= 2.3 fills them, CRI-O never
  // The device cgroup lets the container create and open any device (a privileged container, or one as
  // good as): it can mknod any GPU's node, so nothing at creation confines it.
  bool all_devices_allowed = false;
};

// The node's GPUs as the driver lists them: a GPU's index is its place in PCI address order, as NVML and
// NVIDIA_VISIBLE_DEVICES number them.
struct NodeGpu {
  std::string uuid;
  unsigned minor = 0;
  std::string pci_address;
  // Its MIG devices' UUIDs and their /dev/nvidia-caps minors, where known (NVML).
  std::map<std::string, std::vector<unsigned>> mig_cap_minors;
};

// What the kubelet allocated the container, and where that came from.
struct Allocation {
  enum class Source {
    pod_resources,      // the kubelet's pod-resources API lists the container
    pod_union,          // it lists the pod, not this container (an init or ephemeral container): the pod's
    plugin_annotation,  // gpuguard's device plugin's annotation, which the runtime shows from the kubelet
    unknown,            // none of them could be read
  };
  Source source = Source::unknown;
  std::set<std::string> gpus;          // GPU and MIG UUIDs (a time-sliced replica "<uuid>::<n>" as its UUID)
  std::set<std::string> cdi_devices;   // the CDI devices of its DRA claims
  std::set<std::string> device_paths;  // device nodes those CDI devices bring (from the node's CDI specs)
  std::string detail;                  // for logs and refusals
};

struct Decision {
  enum class Action { allow, adjust, refuse };
  Action action = Action::allow;
  // adjust: what NVIDIA_VISIBLE_DEVICES becomes (the allocated UUIDs, or "void").
  std::optional<std::string> visible_devices;
  // What the container sees beyond its allocation, one line each ("/dev/nvidia1 (GPU-…)",
  // "NVIDIA_VISIBLE_DEVICES=all names GPU-…"): under enforce each is adjusted or refused; under audit,
  // reported; for a privileged container, reported.
  std::vector<std::string> beyond;
  std::string message;  // refuse: what the user sees in kubectl describe; otherwise what was done
  enum class Why { enforced, audited, off, exempt, privileged, allocation_unknown, within } why = Why::within;
};

// The decision for one container. `mode` and the exemptions come from the policy.
Decision decide(const ContainerView& container, const Allocation& allocation, const std::vector<NodeGpu>& node_gpus,
                const policy::Policy& policy);

std::string_view why_name(Decision::Why why);

}  // namespace gpuguard::enforcer

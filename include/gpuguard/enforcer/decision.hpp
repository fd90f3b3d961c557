#pragma once
// gpuguard-node-enforcer's decision, pure as the admission core is: what a container is about to get of
// the node's GPUs (its final environment, device nodes, mounts, annotations and CDI devices, as the runtime
// shows them to NRI), what the node is (its GPUs, its CDI specs, how its NVIDIA toolkit reads a container)
// and what the kubelet allocated it go in; what to do comes out: leave it, set the variables NVIDIA's
// runtime reads to exactly its allocation, or refuse the create, with what it would have reached beyond
// its allocation for the report. No I/O, no protobuf: src/enforcer/nri_view.cpp turns NRI's messages into
// this, allocation.hpp the kubelet's answer, and node.hpp the node's files.
//
// Each door through which NVIDIA's runtime hands a container GPUs is read as that runtime reads it, taking
// the widest reading where the node does not say which applies (docs/node-enforcer.md#how-nvidias-runtime-
// reads-a-container, each rule with its source). What cannot be read (the kubelet's allocation, the node's
// GPUs, a MIG device's capabilities, entries past what a view keeps) is never taken for "nothing": it is
// refused, or allowed where the policy says so (nodeEnforcementUnknown).
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "gpuguard/policy/policy.hpp"

namespace gpuguard::enforcer {

inline constexpr std::string_view kVisibleDevices = "NVIDIA_VISIBLE_DEVICES";
inline constexpr std::string_view kImexChannels = "NVIDIA_IMEX_CHANNELS";

struct Device {
  std::string path;
  std::string type;  // "c", "b", "u"
  std::int64_t major = 0, minor = 0;
};

struct Mount {
  std::string destination, source, type;
  std::vector<std::string> options;
};

// A device cgroup rule that allows NVIDIA's devices: with CAP_MKNOD, which the runtime gives by default, a
// container makes and opens any node its cgroup allows. nullopt is "*".
struct DeviceRule {
  std::optional<std::int64_t> major, minor;
};

// One environment variable the decision reads, however many times the container sets it.
struct EnvVariable {
  std::size_t entries = 0;  // "NAME=value" entries
  std::string last;         // the last entry's value: what NVIDIA's runtime reads
  bool last_cut = false;    // `last` was longer than a view keeps, and is not all there
  bool bare = false;        // an entry "NAME" without '=' as well, which NRI's generator drops
};

// A container as NRI shows it at CreateContainer (or at Synchronize, running), reduced to what the
// decision reads (nri_view.hpp's view_of keeps only that, and at most so many entries of each list).
struct ContainerView {
  std::string pod_namespace, pod_name, pod_uid, container;
  // The pod's service account where known (the enforcer looks it up only where an exemption names it).
  std::string service_account;
  std::map<std::string, std::string> pod_labels;  // the labels exemptions name, as the kubelet gave them
  // The pod's own annotations the decision reads (gpuguard's allocation key, to tell a forged one).
  std::map<std::string, std::string> pod_annotations;
  std::map<std::string, EnvVariable, std::less<>> env;  // the variables NVIDIA's runtime reads (see judged_variable)
  std::vector<Device> devices;                          // NVIDIA's device nodes (judged_device)
  std::vector<DeviceRule> device_rules;                 // allow rules that can reach them (judged_rule)
  std::vector<Mount> mounts;                            // mounts that may reach a GPU (judged_mount)
  std::vector<std::string> cdi_devices;  // fully qualified names; containerd >= 2.3 fills them, CRI-O never
  // The container's annotations the decision reads: the toolkit's CDI annotations, gpuguard's allocation
  // key and CRI-O's copy of the container's own annotations.
  std::map<std::string, std::string> annotations;
  // The device cgroup lets the container create and open any device (a privileged container, or one as
  // good as): it can mknod any GPU's node, so nothing at creation confines it.
  bool all_devices_allowed = false;
  // Entries the view did not keep because a list held more than it keeps: they cannot be judged.
  std::size_t unkept = 0;
};

// The node's GPUs as the driver lists them: a GPU's index is its place in PCI address order, as NVML and
// NVIDIA_VISIBLE_DEVICES number them.
struct NodeGpu {
  std::string uuid;
  unsigned minor = 0;
  std::string pci_address;
  // Its MIG devices' UUIDs and their /dev/nvidia-caps minors, where known (NVML, or the node's CDI specs).
  std::map<std::string, std::vector<unsigned>> mig_cap_minors;
  // MIG mode is on (procfs says so without NVML): then all names its MIG devices, which may not be known.
  bool mig_enabled = false;
  // mig_cap_minors is every MIG device it has (NVML's list), not only those a CDI spec names.
  bool mig_listed = false;
};

using ToolkitVersion = std::tuple<int, int, int>;

// How the node's NVIDIA toolkit reads a container (the node report's facts). Unknown is never "safe":
// each door is then read the widest way any mode and version reads it.
struct Toolkit {
  std::optional<std::string> mode;  // as resolved: "legacy", "cdi", "jit-cdi", "csv"; nullopt: unknown
  std::optional<ToolkitVersion> version;
  std::string default_kind = "nvidia.com/gpu";
  std::vector<std::string> annotation_prefixes = {"cdi.k8s.io/"};
  // swarm-resource: variables read instead of NVIDIA_VISIBLE_DEVICES when any is set.
  std::vector<std::string> swarm_variables;
};

// What the enforcer knows of its node.
struct NodeView {
  std::vector<NodeGpu> gpus;
  // Empty when the driver's list of GPUs was read; otherwise why not (no GPU found, procfs unreadable):
  // then `all` and indices name GPUs that cannot be named.
  std::string gpus_unknown;
  Toolkit toolkit;
  // CDI devices the node's specs define ("vendor/class=name") and the device nodes each brings, its
  // spec's common ones included.
  std::map<std::string, std::vector<std::string>> cdi_devices;
  // gpuguard's MPS root (devicePlugin.mps.root) and NVIDIA's: a bind mount of one of them, of a GPU's
  // directory under it, or of a directory above it, reaches that GPU's MPS server, or every one's.
  std::vector<std::string> mps_roots = {"/run/gpuguard", "/run/nvidia/mps"};
  // Where the specs above were read from: the runtime's CDI directories and the toolkit's spec-dirs.
  std::vector<std::string> cdi_spec_dirs = {"/etc/cdi", "/var/run/cdi"};
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
  // adjust: the variables set (each removed, then set, as NRI needs): NVIDIA_VISIBLE_DEVICES to the
  // allocated UUIDs or "void", NVIDIA_IMEX_CHANNELS to the allocated channels or "void".
  std::map<std::string, std::string> set_env;
  // What the container reaches beyond its allocation, one line each ("/dev/nvidia1 (GPU-…)",
  // "NVIDIA_VISIBLE_DEVICES=all names GPU-…"): under enforce each is adjusted or refused; under audit,
  // reported; for a privileged container, reported. At most kBeyondKept lines; `beyond_count` counts all.
  std::vector<std::string> beyond;
  std::size_t beyond_count = 0;
  // refuse: what the user sees in kubectl describe (at most kMessageMax bytes); otherwise what was done
  std::string message;
  enum class Why { enforced, audited, off, exempt, privileged, cannot_judge, within } why = Why::within;
};

// A refusal names this many of what a container reaches beyond its allocation, then how many more: the
// runtime's answer must stay far inside ttrpc's 4 MiB whatever the container holds.
inline constexpr std::size_t kBeyondKept = 4;
inline constexpr std::size_t kBeyondLineMax = 512;
inline constexpr std::size_t kMessageMax = 4096;

// The decision for one container. `mode`, the exemptions and nodeEnforcementUnknown come from the policy.
Decision decide(const ContainerView& container, const Allocation& allocation, const NodeView& node,
                const policy::Policy& policy);

// MIG devices the node's CDI specs name by UUID (nvidia-ctk's uuid names, gpuguard's plugin's), with their
// parent GPU's node and capabilities, added where the GPUs' list (procfs, without NVML) lacks them.
void add_mig_devices_from_cdi(NodeView& node);

// What view_of keeps (nri_view.hpp): the decision reads nothing else.
bool judged_variable(std::string_view name, const Toolkit& toolkit);
bool judged_annotation(std::string_view key, const Toolkit& toolkit);
bool judged_device(const Device& device);
// A rule "allow <type> <major>:<minor>" the decision reads: one that may allow a character device of the
// driver's major (every device at all is all_devices_allowed).
bool judged_rule(bool allow, std::string_view type, const DeviceRule& rule);
bool judged_mount(const Mount& mount, const NodeView& node);

// The container as the runtime makes it after NRI applies `set_env` (each variable's first entry replaced,
// or one appended; entries without '=' dropped): containerd's and CRI-O's generator, on the view.
ContainerView with_env_set(ContainerView container, const std::map<std::string, std::string>& set_env);

std::string_view why_name(Decision::Why why);

}  // namespace gpuguard::enforcer

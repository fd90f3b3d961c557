#pragma once
// gpuguard-node-enforcer's decision, pure as the admission core is: what a container is about to get of
// the node's GPUs (its final environment, device nodes, mounts, annotations and CDI devices, as the runtime
// shows them to NRI), what the node is (its GPUs, its CDI specs, how its NVIDIA toolkit reads a container)
// and what the kubelet allocated it go in; what to do comes out: leave it, write the variables NVIDIA's
// runtime selects GPUs by, or refuse the create, with what it would have reached beyond its allocation for
// the report. No I/O, no protobuf: src/nri/container_view.cpp turns NRI's messages into a ContainerView,
// allocation.hpp the kubelet's answer, and src/enforcer/node_reader.cpp the node's files into a NodeView.
// The node enforcer's program (src/enforcer) puts it to work.
//
// Safe by construction where it can be. The variables that select GPUs by name (NVIDIA_VISIBLE_DEVICES,
// swarm-resource's, NVIDIA_IMEX_CHANNELS) are not read the many ways NVIDIA's runtime reads them: the
// enforcer writes them from the allocation, in one form, and leaves a value only where it is, token for
// token, what it would have written (docs/node-enforcer.md#what-it-writes). What it cannot write (a
// variable set twice, of which NRI can change only the first entry; a device list mount; a CDI name; a
// device node; a bind mount of the host's devices or an MPS directory) is judged exactly, and refused
// beyond the allocation. What cannot be judged (the kubelet's allocation, the node's GPUs, an input over the
// enforcer's bounds) is never taken for "nothing": it is refused, or allowed where the policy says so
// (nodeEnforcementUnknown).
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "gpuguard/discovery/gpu.hpp"
#include "gpuguard/policy/policy.hpp"

namespace gpuguard::enforcement {

inline constexpr std::string_view kVisibleDevices = "NVIDIA_VISIBLE_DEVICES";
inline constexpr std::string_view kImexChannels = "NVIDIA_IMEX_CHANNELS";
// Variables that reach more than the GPUs selected, which the enforcer writes empty (every toolkit version
// reads an empty one as unset): MIG configuration and monitoring of every GPU, in any container (NVIDIA's
// runtime takes a container with CAP_SYS_ADMIN in its bounding set, which a pod adds without being
// privileged, for privileged: internal/config/image/privileged.go)...
inline constexpr std::string_view kMigConfigDevices = "NVIDIA_MIG_CONFIG_DEVICES";
inline constexpr std::string_view kMigMonitorDevices = "NVIDIA_MIG_MONITOR_DEVICES";
// ...and the features whose device nodes come beside any device request (GPUDirect Storage, MOFED, NVSwitch,
// GDRCopy: internal/modifier/gated.go; legacy mode counts none as a request), in a container allocated none.
inline constexpr std::string_view kFeatureVariables[] = {"NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH",
                                                         "NVIDIA_GDRCOPY"};

// What a view reads, at most. Everything the runtime sends is bounded as it is read: a longer path, value or
// list is not kept but named in ContainerView::unread, and such a container is what the enforcer cannot
// judge. So a view is of a fixed size at most, whatever the request (view_bytes_max below).
inline constexpr std::size_t kPathMax = 4096;      // PATH_MAX: a longer path cannot be mounted by the kernel anyway
inline constexpr std::size_t kListMax = 64;        // device nodes, device rules, CDI names of one container
inline constexpr std::size_t kMountsMax = 16;      // mounts that may reach a GPU, of one container
inline constexpr std::size_t kValueMax = 4096;     // a selection variable's value: 99 UUIDs and their commas
inline constexpr std::size_t kNameMax = 256;       // a name, an ID, an annotation key, one CDI device name
inline constexpr std::size_t kKeptPathMax = 1024;  // a device node's path, a GPU mount's host path, as kept
inline constexpr std::size_t kSwarmMax = 16;       // swarm-resource's variables read (more: none judged)
inline constexpr std::size_t kUnreadKept = 4;      // what was not read, named; the rest counted
// The largest container, as NRI sends it, that may run. At a plugin's registration NRI v0.12 sends every
// running pod and container in Synchronize messages within ttrpc's 4 MiB, split no finer than four pods
// and four containers to a message (pkg/adaptation recalcObjsPerSyncMsg): two containers of 2 MiB running
// keep every NRI plugin on the node from registering again, the enforcer included. Four of these and four
// pods (their annotations at most 256 KiB, as the API server allows) fit.
inline constexpr std::size_t kNriContainerBytesMax = std::size_t{640} << 10;

struct Device {
  std::string path;
  std::string type;  // "c", "b", "u"
  std::int64_t major = 0, minor = 0;
};

// A mount the decision reads: a bind mount whose host path (as written, or as its links lead) may reach a
// GPU, any mount under the device list roots, and a mask (is_mask), which may hide an MPS root.
struct Mount {
  std::string destination, source, type;
  std::vector<std::string> options;
  // The host path runc binds, its links followed inside the host's root; empty: the same as `source`.
  std::string resolved;
  // Not empty: where the source leads cannot be known at the create, and why (a link in a directory that
  // containers write, which can change before runc follows it).
  std::string doubt;
};

// Where a bind mount's host path leads, as runc will bind it: the node's files answer (the node enforcer's
// node state follows the path's links inside the host root); a view records it with the mount.
struct HostPathResolution {
  std::string path;   // the host path its links lead to; empty when it is the path as written
  std::string doubt;  // not empty: why where it leads cannot be trusted to stay as read
};

// A device cgroup rule that allows NVIDIA's devices: with CAP_MKNOD, which the runtime gives by default, a
// container makes and opens any node its cgroup allows. nullopt is "*".
struct DeviceRule {
  std::optional<std::int64_t> major, minor;
};

// A variable NVIDIA's runtime selects devices by, however many times the container sets it.
struct Selection {
  std::size_t entries = 0;  // "NAME=value" entries
  std::string last;         // the last entry's value, which NVIDIA's runtime reads (empty when over kValueMax)
  bool last_over = false;   // the last value was longer than kValueMax: never what the enforcer writes
};

// A container as NRI shows it at CreateContainer (or at Synchronize, running), reduced to what the
// decision reads, within the bounds above (src/nri/container_view.cpp makes it).
struct ContainerView {
  std::string pod_namespace, pod_name, pod_uid, container;
  // The pod's service account where known (the enforcer looks it up only where an exemption names it).
  std::string service_account;
  std::map<std::string, std::string> pod_labels;  // the labels exemptions name, as the kubelet gave them
  // The variables NVIDIA's runtime selects GPUs by that the container sets: NVIDIA_VISIBLE_DEVICES,
  // NVIDIA_IMEX_CHANNELS and swarm-resource's; and those the enforcer writes empty (kMigConfigDevices,
  // kFeatureVariables).
  std::map<std::string, Selection, std::less<>> selections;
  // A legacy CUDA image (CUDA_VERSION set, NVIDIA_REQUIRE_CUDA not): without NVIDIA_VISIBLE_DEVICES, NVIDIA's
  // runtime gives it every GPU (internal/config/image/cuda_image.go).
  bool legacy_cuda_image = false;
  std::vector<Device> devices;           // NVIDIA's device nodes (judged_device)
  std::vector<DeviceRule> device_rules;  // allow rules that can reach them (judged_rule)
  std::vector<Mount> mounts;             // mounts that may reach a GPU (judged_mount)
  std::vector<std::string> cdi_devices;  // fully qualified names; containerd >= 2.3 fills them, CRI-O never
  // The names the toolkit's CDI annotations hold (judged_annotation), each with its annotation's key: the
  // value split at each comma, untrimmed, as the toolkit splits it.
  std::vector<std::pair<std::string, std::string>> cdi_annotation_names;
  // gpuguard's device plugin's allocation annotation as the container carries it, where the runtime shows it
  // as the container's own (allocation.hpp's trusted_annotation decides what counts).
  std::optional<std::string> allocated_annotation;
  bool allocated_annotation_on_pod = false;  // the pod carries the key too (the pod author's, on containerd)
  bool crio_annotations = false;             // CRI-O's copy of the container's own annotations is there
  // Where a mask landed is checked before the container's process runs (unmasked_roots): at its start on
  // containerd, which fails a start the enforcer refuses; on CRI-O, which logs such a refusal and starts
  // the container, by the createRuntime hook (mask_hook.hpp), where the node has it. Without either, no
  // mask is written.
  bool masks_checked = true;
  // The device cgroup lets the container create and open any device (a privileged container, or one as
  // good as): it can mknod any GPU's node, so nothing at creation confines it.
  bool all_devices_allowed = false;
  // The container's message as NRI sent it, in bytes (kNriContainerBytesMax).
  std::size_t nri_bytes = 0;
  // What was sent that the view did not read (over a bound above), the first kUnreadKept named.
  std::vector<std::string> unread;
  std::size_t unread_count = 0;
};

// A host path as the decision compares it: lexical, and the host's /var/run written as /run, which it is.
std::string host_path(std::string_view source);

// Notes something the view did not read.
void note_unread(ContainerView& view, std::string what);

// The bytes a view holds, its own and its strings' (an upper bound of what it costs the heap, short strings
// counted whole); view_bytes_max() is the most any view can hold within the bounds above.
std::size_t view_bytes(const ContainerView& view);
std::size_t view_bytes_max();

using ToolkitVersion = std::tuple<int, int, int>;

// How the node's NVIDIA toolkit reads a container, as far as it changes what the enforcer may leave: only
// whether `none` gives no GPU, where the container sets it more than once and so cannot be rewritten.
struct Toolkit {
  // As configured, or as the runtime binary the container runtime runs forces it: "legacy", "cdi",
  // "jit-cdi", "csv" or "auto"; "absent" where no runtime handler runs NVIDIA's runtime; nullopt: unknown.
  std::optional<std::string> mode;
  // The version of the runtime binary the container runtime runs (its Go build information); nullopt:
  // unknown.
  std::optional<ToolkitVersion> version;
  bool tegra = false;  // the host has Tegra's files: auto is csv there
  std::string default_kind = "nvidia.com/gpu";
  std::vector<std::string> annotation_prefixes = {"cdi.k8s.io/"};
  // swarm-resource: variables read instead of NVIDIA_VISIBLE_DEVICES when any is set; the first kSwarmMax.
  std::vector<std::string> swarm_variables;
  bool swarm_over = false;  // the toolkit names more than kSwarmMax: no container can be judged
};

// What the enforcer knows of its node.
struct NodeView {
  // The node's GPUs as discovery lists them (a GPU's index is its place in PCI address order, as NVML and
  // NVIDIA_VISIBLE_DEVICES number them), with their MIG devices and /dev/nvidia-caps minors where known: NVML's
  // (mig_listed: every one the GPU has), and those the node's CDI specs name (add_mig_devices_from_cdi). MIG
  // mode on (mig_enabled, which procfs shows without NVML) means `all` names MIG devices that may not be known.
  std::vector<discovery::Gpu> gpus;
  // Empty when the driver's list of GPUs was read; otherwise why not (no GPU found, procfs unreadable):
  // then device nodes name GPUs that cannot be named.
  std::string gpus_unknown;
  Toolkit toolkit;
  // CDI devices the node's specs define ("vendor/class=name") and the device nodes each brings, its
  // spec's common ones included.
  std::map<std::string, std::vector<std::string>> cdi_devices;
  // gpuguard's MPS root (devicePlugin.mps.root) and NVIDIA's: a bind mount of one of them, of a GPU's
  // directory under it, or of a directory above it, reaches that GPU's MPS server, or every one's.
  std::vector<std::string> mps_roots = {"/run/gpuguard", "/run/nvidia/mps"};
  // The MPS roots (host paths, as host_path writes them) that are directories on the host with no link on
  // the way: a container's bind mount of a directory above one gets an empty read-only tmpfs over it
  // (Decision::masks) instead of a refusal. A root not there, or reached through a link, cannot be masked:
  // runc would have to make it (through a read-only bind it cannot), or would follow the link inside the
  // container's own root.
  std::set<std::string> mps_roots_maskable;
  // Where each maskable root is, as the kernel names it in a mountinfo: its filesystem's device
  // ("major:minor") and its path inside that filesystem. A root whose place cannot be read is not maskable.
  struct RootPlace {
    std::string root, device, path;
  };
  std::vector<RootPlace> mps_root_places;
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
  std::set<std::string> gpus;          // GPU and MIG IDs as the device plugin named them (a replica's "::n" cut)
  std::set<std::string> cdi_devices;   // the CDI devices of its DRA claims
  std::set<std::string> device_paths;  // device nodes those CDI devices bring (from the node's CDI specs)
  std::string detail;                  // for logs and refusals
};

struct Decision {
  enum class Action { allow, adjust, refuse };
  Action action = Action::allow;
  // adjust: the variables written (each removed, then set, as NRI needs): NVIDIA_VISIBLE_DEVICES and
  // swarm-resource's to the allocated IDs or "void", NVIDIA_IMEX_CHANNELS to the allocated channels or "".
  std::map<std::string, std::string> set_env;
  // What the container reaches beyond its allocation, or what cannot be judged, one line each
  // ("/dev/nvidia1 (GPU-…)", "NVIDIA_VISIBLE_DEVICES=all, not what gpuguard writes"): under enforce each
  // is written over or refused; under audit, reported; for a privileged container, reported. At most
  // kBeyondKept lines; `beyond_count` counts all.
  std::vector<std::string> beyond;
  std::size_t beyond_count = 0;
  // adjust: where an empty, read-only tmpfs goes over an MPS root that a bind mount of a directory above it
  // shows the container (node-exporter's host `/`, a log shipper's `/run`): the container's own paths, each
  // deeper than the bind mount it lies in, so that every runtime mounts it after (NRI's generator and
  // containerd sort mounts by depth). Written under enforce, for privileged containers too.
  std::set<std::string> masks;
  // refuse: what the user sees in kubectl describe (at most kMessageMax bytes); otherwise what was done
  std::string message;
  // oversized: larger than kNriContainerBytesMax, refused under enforce whatever it reaches.
  enum class Why { enforced, audited, off, exempt, privileged, cannot_judge, oversized, within } why = Why::within;
};

// A refusal names this many of what a container reaches beyond its allocation, then how many more: the
// runtime's answer must stay far inside ttrpc's 4 MiB whatever the container holds.
inline constexpr std::size_t kBeyondKept = 4;
inline constexpr std::size_t kBeyondLineMax = 512;
inline constexpr std::size_t kMessageMax = 4096;

// The decision for one container. `mode`, the exemptions and nodeEnforcementUnknown come from the policy.
Decision decide(const ContainerView& container, const Allocation& allocation, const NodeView& node,
                const policy::Policy& policy);

// Whether NVIDIA_VISIBLE_DEVICES=none gives no GPU under every toolkit the node may run: legacy mode; jit-cdi
// from 1.18.2; cdi where the node's specs define <default-kind>=none reaching no GPU; auto where the version
// makes every mode it may resolve to one of those. Never where the mode or the version is not known, nor in
// csv mode, which gives every device for any request but void (docs/node-enforcer.md, each with its source).
bool none_honoured(const NodeView& node);

// MIG devices the node's CDI specs name by UUID (nvidia-ctk's uuid names, gpuguard's plugin's), with their
// parent GPU's node and capabilities, added where the GPUs' list (procfs, without NVML) lacks them.
void add_mig_devices_from_cdi(NodeView& node);

// What a view keeps (src/nri/container_view.cpp): the decision reads nothing else.
bool judged_variable(std::string_view name, const Toolkit& toolkit);
bool judged_annotation(std::string_view key, const Toolkit& toolkit);
bool judged_device(const Device& device);
// A rule "allow <type> <major>:<minor>" the decision reads: one that may allow a character device of the
// driver's major (every device at all is all_devices_allowed).
bool judged_rule(bool allow, std::string_view type, const DeviceRule& rule);
// A mount whose `resolved` and `doubt` are already filled in.
bool judged_mount(const Mount& mount, const NodeView& node);
// Whether a mount is a bind mount (runc binds its source), whose source must be resolved first.
bool is_bind(const Mount& mount);
// Whether a mount is what the enforcer writes over an MPS root (a read-only tmpfs), and so hides what lies
// under its destination.
bool is_mask(const Mount& mount);
// The options of the tmpfs the enforcer writes at each of Decision::masks (is_mask holds for it).
// mask_hook.cpp knows a mask in a mountinfo by this size and mode, as the kernel writes them back.
inline constexpr std::string_view kMaskOptions[] = {"ro", "nosuid", "nodev", "noexec", "size=4k", "mode=0555"};

// The container as the runtime makes it after NRI applies `set_env` (each variable's first entry replaced,
// or one appended; a later entry copied over the change, so the last stays what it was): containerd's and
// CRI-O's generator, on the view.
ContainerView with_env_set(ContainerView container, const std::map<std::string, std::string>& set_env);

// What runc made of the masks, checked before the container's process runs: every place where the
// container's mounts (its /proc/<pid>/mountinfo, read after runc made them) show an MPS root without a mask
// mounted over it later, each "<where it shows> (<root>)". A mask is written at a path in the container that
// runc resolves through the container's own links and mounts; this is what makes where it landed certain.
// `mountinfo` is at most kMountinfoMax bytes of the lines that matter (those on a root's filesystem, and
// tmpfs mounts; the caller keeps only those); over that, the caller cannot judge.
inline constexpr std::size_t kMountinfoMax = std::size_t{4} << 20;
// A path as a mountinfo writes it (space, tab, newline and backslash as \ooo), unescaped.
std::string mountinfo_path(std::string_view text);
// Where the check is made. At the start (containerd) the container's process is in its own root and runc
// has made each tmpfs read-only: a mask is a read-only tmpfs. In the createRuntime hook (CRI-O) it is not
// yet: the mounts lie below `rootfs` among the runtime's own, which are not the container's, and a tmpfs
// is still writable, so any tmpfs over a root hides it (as it would at the start, read-only or not); the
// hook keeps only masks and the tmpfs on an MPS root's filesystem (mask_hook.hpp's is_mask_line).
struct MaskCheck {
  std::string rootfs = "/";
  bool masks_read_only = true;
};
std::vector<std::string> unmasked_roots(std::string_view mountinfo, const std::vector<NodeView::RootPlace>& places,
                                        const MaskCheck& check = {});

// The container after the runtime mounts the masks (Decision::masks) as the enforcer writes them.
ContainerView with_masks(ContainerView container, const std::set<std::string>& masks);

std::string_view why_name(Decision::Why why);

}  // namespace gpuguard::enforcement

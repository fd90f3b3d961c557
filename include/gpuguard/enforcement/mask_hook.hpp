#pragma once
// The mask check on CRI-O: an OCI createRuntime hook the enforcer adds to each container it masks. CRI-O
// logs a start the enforcer refuses and starts the container anyway, so the check made at the start on
// containerd (unmasked_roots) cannot hold there. runc runs a createRuntime hook in the runtime's namespaces
// once it has made every mount of the container, before the container's process runs, and fails the
// create when the hook fails: CRI-O's CreateContainer then fails with the hook's message. The hook is
// gpuguard-mask-check (src/enforcer/mask_check_main.cpp), which the enforcer copies onto the host; what it
// is told, what it reads and what it decides are here, pure, so its unit tests hold them.
#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/enforcement/decision.hpp"

namespace gpuguard::enforcement {

inline constexpr std::string_view kMaskHookName = "gpuguard-mask-check";
// runc waits at most this for the hook, then fails the create.
inline constexpr int kMaskHookTimeoutSeconds = 10;
// The most the hook reads of the state runc writes on its stdin, and of the container's config.json.
inline constexpr std::size_t kHookStateMax = std::size_t{4} << 20;
inline constexpr std::size_t kHookConfigMax = std::size_t{64} << 20;

// What the hook is told: the places of the node's MPS roots (NodeView::mps_root_places, as the enforcer
// read them), and whether a container whose mounts cannot be read starts (nodeEnforcementUnknown: allow).
struct MaskHookCall {
  std::vector<NodeView::RootPlace> places;
  bool unknown_allowed = false;
};

// The hook's argv (argv[0] first, as OCI's hook args are): `path [--unknown=allow] -- ROOT DEVICE PATH...`.
std::vector<std::string> mask_hook_args(const std::string& path, const MaskHookCall& call);
// Read back; nullopt with `why` where they are not what mask_hook_args writes.
std::optional<MaskHookCall> parse_mask_hook_args(const std::vector<std::string>& args, std::string& why);

// The string or number values of a JSON document at the given paths of object keys ("root/path"), read as
// a stream: what is kept is those values alone, whatever the document holds. A path given twice keeps the
// last. nullopt with `why` where it is not JSON, is nested deeper than 64, or a kept value is over kPathMax
// bytes.
std::optional<std::vector<std::string>> json_values(std::istream& in, const std::vector<std::string>& paths,
                                                    std::string& why);

// The container's root, as runc mounts it: config.json's root.path, taken from the bundle where relative.
// Empty with `why` where it is missing or not a plain path.
std::string container_rootfs(const std::string& bundle, const std::string& root_path, std::string& why);

// The fields of a mountinfo line the hook reads: its filesystem's device (the third) and its mount point (the
// fifth), unescaped and lexical; both empty where the line has fewer fields.
struct MountFields {
  std::string_view device;
  std::string point;
};
MountFields mount_fields(std::string_view line);

// Whether a mountinfo line is a mask as the kernel writes one back: a tmpfs whose own options hold
// kMaskOptions' mode (mode=0555 written mode=555) and its size of 4 KiB, rounded up to the page (4, 16 or
// 64 KiB). The container's /dev and /dev/shm are tmpfs too, of other sizes and modes: not a mask.
bool is_mask_line(std::string_view line);

// The verdict on what the hook read: empty where every MPS root its mounts show is masked; else the
// message runc prints and CRI-O returns, naming each place. `problem`: why the mounts could not be read,
// empty where they were.
std::string mask_hook_verdict(const MaskHookCall& call, const std::string& problem, std::string_view mountinfo,
                              const std::string& rootfs);

}  // namespace gpuguard::enforcement

#pragma once
// A host's path read below a directory that holds the host's / (a host root: the host's / mounted into a
// pod, or a fixture). Its symbolic links are followed inside that root, as the host follows them: the
// host's /var/run is a link to the absolute /run, which read through /host/var/run would otherwise be the
// reading container's own /run, not the host's.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::files {

// The path below `root` that the host's `absolute` path leads to, links resolved inside the root (a part
// that does not exist is kept as written); nullopt when its links loop. A root of "/" or "" is the
// process's own: the kernel's resolution is the host's, and the path is returned as it is.
std::optional<std::filesystem::path> in_root(const std::filesystem::path& root, std::string_view absolute);

// Where the host's `absolute` path leads, as the kernel resolves it when runc binds it: every link on the
// way followed inside `root` ("/" or "" is this process's own root), the path given as the host sees it.
//
// One directory descriptor is carried from part to part (openat, fstatat, readlinkat): each part is one
// lookup, as the kernel's own walk is, not a walk from the root again. Bounded besides: at most
// kFollowStepsMax lookups for one path (a part, a link's part, each part walked again after ".."), and
// fewer where `steps_left` is given, which it is taken from; past either, `over_budget`.
inline constexpr std::size_t kFollowStepsMax = 8192;
struct Followed {
  std::string path;                // absolute on the host, no link left in it (a part that does not exist kept)
  std::vector<std::string> links;  // the host paths of the links followed, in order
  bool loops = false;              // more than the kernel's 40 links, or a link unreadable: it does not resolve
  bool over_budget = false;        // more lookups than allowed: not followed to its end
};
Followed follow_in_root(const std::filesystem::path& root, std::string_view absolute,
                        std::size_t* steps_left = nullptr);

}  // namespace gpuguard::files

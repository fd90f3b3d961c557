#pragma once
// A host's path read below a directory that holds the host's / (a host root: the host's / mounted into a
// pod, or a fixture). Its symbolic links are followed inside that root, as the host follows them: the
// host's /var/run is a link to the absolute /run, which read through /host/var/run would otherwise be the
// reading container's own /run, not the host's.
#include <filesystem>
#include <optional>
#include <string_view>

namespace gpuguard::files {

// The path below `root` that the host's `absolute` path leads to, links resolved inside the root (a part
// that does not exist is kept as written); nullopt when its links loop. A root of "/" or "" is the
// process's own: the kernel's resolution is the host's, and the path is returned as it is.
std::optional<std::filesystem::path> in_root(const std::filesystem::path& root, std::string_view absolute);

}  // namespace gpuguard::files

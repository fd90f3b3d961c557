// Where on a host containers write (host_places.hpp says why).
#include "host_places.hpp"

#include <algorithm>
#include <array>
#include <optional>

namespace gpuguard::enforcer {
namespace {

std::vector<std::string_view> parts_of(std::string_view path) {
  std::vector<std::string_view> parts;
  while (!path.empty()) {
    const std::size_t slash = path.find('/');
    if (slash != 0) parts.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return parts;
}

// One part of a place: "*" is any part, "a|b" either, "prefix*" any part that begins so.
bool part_matches(std::string_view pattern, std::string_view part) {
  if (pattern == "*") return true;
  if (pattern.ends_with('*')) return part.starts_with(pattern.substr(0, pattern.size() - 1));
  while (!pattern.empty()) {
    const std::size_t bar = pattern.find('|');
    if (pattern.substr(0, bar) == part) return true;
    if (bar == std::string_view::npos) break;
    pattern.remove_prefix(bar + 1);
  }
  return false;
}

struct Place {
  std::array<std::string_view, 6> parts;  // the place's directory, its unused tail empty
  const char* what;                       // what containers write there
};

constexpr const char* kRootfs = "a container's root filesystem, where its container";
constexpr const char* kVolume = "a pod's volume, whose containers";
constexpr const char* kShm = "a pod's shared memory (/dev/shm), where its containers";

// The runtimes' places, wherever their root is (containerd's /var/lib/containerd and /run/containerd, k3s's
// under /var/lib/rancher, CRI-O's /var/lib/containers/storage and /run/containers/storage): their names
// are their own. The runtime's own files beside them (its socket, a container's resolv.conf and hostname
// under CRI-O's userdata) are not below any.
constexpr Place kRuntimePlaces[] = {
    {{"io.containerd.runtime.v2.task", "*", "*", "rootfs"}, kRootfs},
    {{"io.containerd.snapshotter.v1.*", "snapshots", "*", "fs"}, kRootfs},
    {{"io.containerd.grpc.v1.cri", "sandboxes", "*", "shm"}, kShm},
    {{"io.containerd.grpc.v1.cri", "containers", "*", "volumes", "*"},
     "a container's image volume, where its container"},
    {{"storage", "overlay", "*", "diff|merged"}, kRootfs},
    {{"storage", "overlay-containers", "*", "userdata", "shm"}, kShm},
};

// The kubelet's, below its pods directory, and below its plugins directory beside it.
constexpr Place kPodPlaces[] = {
    {{"*", "volumes", "kubernetes.io~csi", "*", "mount"}, kVolume},
    {{"*", "volumes", "*", "*"}, kVolume},
    {{"*", "volume-subpaths", "*", "*", "*"}, kVolume},
};
constexpr Place kPluginPlaces[] = {
    {{"kubernetes.io", "csi", "*", "*", "globalmount"}, "a CSI volume staged for its pods, whose containers"},
    {{"kubernetes.io", "*", "mounts", "*"}, kVolume},
};

std::size_t length(const Place& place) {
  return static_cast<std::size_t>(std::find(place.parts.begin(), place.parts.end(), std::string_view{}) -
                                  place.parts.begin());
}

// Whether `parts` from `at` begin with `place`; with `below`, whether something lies below it too.
bool at_place(const std::vector<std::string_view>& parts, std::size_t at, const Place& place, bool below) {
  const std::size_t n = length(place);
  if (parts.size() < at + n + (below ? 1 : 0) || (!below && parts.size() != at + n)) return false;
  for (std::size_t i = 0; i < n; ++i) {
    if (!part_matches(place.parts[i], parts[at + i])) return false;
  }
  return true;
}

// Where `dir`'s parts end in `parts`, when `path` lies under `dir`.
std::optional<std::size_t> under(const std::vector<std::string_view>& parts, std::string_view dir) {
  const std::vector<std::string_view> dir_parts = parts_of(dir);
  if (dir.empty() || parts.size() <= dir_parts.size() ||
      !std::equal(dir_parts.begin(), dir_parts.end(), parts.begin())) {
    return std::nullopt;
  }
  return dir_parts.size();
}

std::string because(const char* what) {
  return std::string("it lies in ") + what + " can make it a link before runc binds it";
}

}  // namespace

std::string written_by_containers(std::string_view path, const std::vector<std::string>& kubelet_pods) {
  const std::vector<std::string_view> parts = parts_of(path);
  for (const std::string& pods : kubelet_pods) {
    if (pods.empty()) continue;
    if (const auto at = under(parts, pods)) {
      // A CSI volume's place is its <name>/mount; the general one would take its <name> for it.
      if (at_place(parts, *at, kPodPlaces[0], false)) return {};
      for (const Place& place : kPodPlaces) {
        if (at_place(parts, *at, place, true)) return because(place.what);
      }
    }
    const std::string plugins = pods.substr(0, pods.rfind('/')) + "/plugins";
    if (const auto at = under(parts, plugins)) {
      for (const Place& place : kPluginPlaces) {
        if (at_place(parts, *at, place, true)) return because(place.what);
      }
    }
  }
  for (std::size_t at = 0; at < parts.size(); ++at) {
    for (const Place& place : kRuntimePlaces) {
      if (at_place(parts, at, place, true)) return because(place.what);
    }
  }
  return {};
}

bool made_by_the_kubelet(std::string_view path, const std::vector<std::string>& kubelet_pods) {
  const std::vector<std::string_view> parts = parts_of(path);
  for (const std::string& pods : kubelet_pods) {
    const auto at = under(parts, pods);
    if (!at) continue;
    if (at_place(parts, *at, kPodPlaces[0], false)) return true;
    if (parts.size() > *at + 2 && parts[*at + 2] == "kubernetes.io~csi") return false;  // a CSI volume's <name>
    if (at_place(parts, *at, kPodPlaces[1], false) || at_place(parts, *at, kPodPlaces[2], false)) return true;
  }
  return false;
}

bool in_a_process(std::string_view path) {
  const std::vector<std::string_view> parts = parts_of(path);
  if (parts.size() < 2 || parts[0] != "proc") return false;
  const std::string_view process = parts[1];
  return process == "self" || process == "thread-self" ||
         std::all_of(process.begin(), process.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace gpuguard::enforcer

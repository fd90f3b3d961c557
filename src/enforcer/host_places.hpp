#pragma once
// Where on a host containers write, and what the kubelet makes there: a host path judged by its place alone.
// The enforcer's view of the host is the host's / as it was mounted into its pod, without propagation, so
// the mounts the kubelet and the runtime make later (volumes, root filesystems, a pod's /dev/shm) are empty
// directories in it; and what lies in them, containers can make a link at any moment before runc binds it.
// So a path below such a place is never followed but doubted, whatever the enforcer sees there. Pure: paths
// in, answers out (tests/enforcer/host_places_test.cpp holds the table).
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::enforcer {

// Why containers can change what lies at `path` (below a pod's volume, a subPath, a container's root
// filesystem or image volume, a pod's /dev/shm, a CSI volume staged for its pods), or empty. `kubelet_pods`:
// the kubelet's pods directory, and where its links lead where they lead elsewhere.
std::string written_by_containers(std::string_view path, const std::vector<std::string>& kubelet_pods);

// Whether `path` is a directory the kubelet makes for a pod: a volume's own (for a CSI volume, its
// `<name>/mount`) or a subPath's. Such a path is bound as written: no link can be there, and a network
// volume's server is not asked for it.
bool made_by_the_kubelet(std::string_view path, const std::vector<std::string>& kubelet_pods);

// Whether `path` lies in a process's directory of /proc (a number, self, thread-self), whose links lead
// where the process that follows them is (runc's own working directory, root, descriptors), not where they
// lead for the enforcer.
bool in_a_process(std::string_view path);

}  // namespace gpuguard::enforcer

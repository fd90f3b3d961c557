// Where on a host containers write (src/enforcer/host_places.hpp), as a table: each path, and what the
// enforcer must make of it. Then the lookups' deadline (src/enforcer/path_worker.hpp) with a lookup that never
// comes back, as one on a dead NFS server.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "eventually.hpp"
#include "host_places.hpp"
#include "path_worker.hpp"

using namespace gpuguard;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kPods = {"/var/lib/kubelet/pods", "/data/kubelet/pods"};

enum class Place { none, volume, rootfs, shm, image_volume, staged_csi, kubelet_made, process };

struct Case {
  const char* path;
  Place expected;
};

// Each line is a layout a runtime or the kubelet makes (their sources cited in docs/node-enforcer.md), or a
// near miss of one.
const Case kCases[] = {
    // The kubelet's directories for a pod: made by it, bound as written.
    {"/var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/scratch", Place::kubelet_made},
    {"/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/pvc-1/mount", Place::kubelet_made},
    {"/var/lib/kubelet/pods/uid/volume-subpaths/config/app/0", Place::kubelet_made},
    {"/data/kubelet/pods/uid/volumes/kubernetes.io~nfs/share", Place::kubelet_made},  // its directory, by a link
    // What the pods' containers write in them.
    {"/var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/scratch/link", Place::volume},
    {"/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/pvc-1/mount/link/pipe", Place::volume},
    {"/var/lib/kubelet/pods/uid/volume-subpaths/config/app/0/link", Place::volume},
    {"/data/kubelet/pods/uid/volumes/kubernetes.io~nfs/share/link", Place::volume},
    {"/var/lib/kubelet/plugins/kubernetes.io/csi/driver.example.com/0123/globalmount/link", Place::staged_csi},
    {"/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pvc-1/globalmount/link", Place::staged_csi},
    {"/var/lib/kubelet/plugins/kubernetes.io/nfs/mounts/share/link", Place::volume},
    // The kubelet's own files: neither.
    {"/var/lib/kubelet/pods/uid/containers/app/0123", Place::none},
    {"/var/lib/kubelet/pods/uid/etc-hosts", Place::none},
    {"/var/lib/kubelet/plugins/kubernetes.io/csi/driver.example.com/0123/vol_data.json", Place::none},
    {"/var/lib/kubelet/pods", Place::none},
    // containerd's, wherever its roots (k3s's included).
    {"/run/containerd/io.containerd.runtime.v2.task/k8s.io/0123/rootfs/link", Place::rootfs},
    {"/run/k3s/containerd/io.containerd.runtime.v2.task/k8s.io/0123/rootfs/link", Place::rootfs},
    {"/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/12/fs/root/link", Place::rootfs},
    {"/var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/3/fs/x", Place::rootfs},
    {"/run/containerd/io.containerd.grpc.v1.cri/sandboxes/0123/shm/link", Place::shm},
    {"/var/lib/containerd/io.containerd.grpc.v1.cri/containers/0123/volumes/4567/link", Place::image_volume},
    {"/run/containerd/containerd.sock", Place::none},
    {"/run/containerd/io.containerd.runtime.v2.task/k8s.io", Place::none},
    {"/run/containerd/io.containerd.runtime.v2.task/k8s.io/0123/rootfs", Place::none},  // the mount point itself
    {"/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots", Place::none},
    {"/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/metadata.db", Place::none},
    // CRI-O's: a container's layers and the pod's /dev/shm; its own files for each container are not.
    {"/var/lib/containers/storage/overlay/abcd/merged/link", Place::rootfs},
    {"/var/lib/containers/storage/overlay/abcd/diff/link", Place::rootfs},
    {"/run/containers/storage/overlay-containers/0123/userdata/shm/link", Place::shm},
    {"/run/containers/storage/overlay-containers/0123/userdata/resolv.conf", Place::none},
    {"/run/containers/storage/overlay-containers/0123/userdata/shm", Place::none},
    {"/var/lib/containers/storage/overlay-containers/0123/userdata/.containerenv", Place::none},
    {"/var/lib/containers/storage/overlay/abcd/link", Place::none},
    // A process's directory of /proc; the rest of /proc, and /proc itself, is not one.
    {"/proc/self/cwd/link", Place::process},
    {"/proc/thread-self/root", Place::process},
    {"/proc/1/root/run", Place::process},
    {"/proc/driver/nvidia/gpus", Place::none},
    {"/proc", Place::none},
    // Elsewhere.
    {"/srv/data/pipe", Place::none},
    {"/run/nvidia/mps", Place::none},
};

Place place_of(const std::string& path) {
  const std::string why = enforcer::written_by_containers(path, kPods);
  if (enforcer::in_a_process(path)) return Place::process;
  if (enforcer::made_by_the_kubelet(path, kPods)) return why.empty() ? Place::kubelet_made : Place::none;
  if (why.empty()) return Place::none;
  if (why.find("a pod's volume") != std::string::npos) return Place::volume;
  if (why.find("root filesystem") != std::string::npos) return Place::rootfs;
  if (why.find("shared memory") != std::string::npos) return Place::shm;
  if (why.find("image volume") != std::string::npos) return Place::image_volume;
  if (why.find("staged") != std::string::npos) return Place::staged_csi;
  return Place::none;
}

}  // namespace

TEST_CASE("enforcer: host paths are judged by the place they lie in, as the kubelet and the runtimes lay them out") {
  for (const Case& c : kCases) {
    INFO(c.path);
    CHECK(static_cast<int>(place_of(c.path)) == static_cast<int>(c.expected));
    // Never both: what the kubelet makes is not what containers write.
    CHECK_FALSE(
        (enforcer::made_by_the_kubelet(c.path, kPods) && !enforcer::written_by_containers(c.path, kPods).empty()));
  }
  // Every doubt says what it is and why, in one sentence the refusal quotes.
  const std::string why =
      enforcer::written_by_containers("/run/containerd/io.containerd.runtime.v2.task/k8s.io/1/rootfs/l", kPods);
  CHECK(why == "it lies in a container's root filesystem, where its container can make it a link before runc binds it");
  // An empty kubelet directory (its link not resolved) names nothing.
  CHECK(enforcer::written_by_containers("/plugins/kubernetes.io/csi/d/h/globalmount/x", {""}).empty());
}

TEST_CASE(
    "enforcer: a host path lookup that never comes back is left behind, and the next answered or refused at once") {
  enforcer::PathWorker lookups(50ms, 2);
  const auto answer = [](const std::string& path) {
    return [path] { return enforcement::HostPathResolution{path, {}}; };
  };
  auto quick = lookups.run(answer("/srv/a"));
  REQUIRE(quick);
  CHECK(quick->path == "/srv/a");
  // Two lookups that block, as on an NFS server that is gone: each caller waits the deadline, no longer.
  struct Gate {
    std::mutex mutex;
    std::condition_variable opened;
    bool open = false;
  };
  auto gate = std::make_shared<Gate>();
  const auto blocked = [gate] {
    std::unique_lock lock(gate->mutex);
    gate->opened.wait(lock, [&] { return gate->open; });
    return enforcement::HostPathResolution{"/never", {}};
  };
  for (int i = 0; i < 2; ++i) {
    const auto started = std::chrono::steady_clock::now();
    CHECK_FALSE(lookups.run(blocked));
    CHECK(std::chrono::steady_clock::now() - started < 2s);  // the deadline, far from NRI's 2 s
    CHECK(lookups.stuck() == static_cast<std::size_t>(i + 1));
  }
  // With two left behind, a lookup is refused without being run.
  std::atomic<bool> ran{false};
  CHECK_FALSE(lookups.run([&ran] {
    ran = true;
    return enforcement::HostPathResolution{};
  }));
  CHECK_FALSE(ran.load());
  // Once the server answers, the workers come back and are counted no more; lookups run again.
  {
    const std::lock_guard lock(gate->mutex);
    gate->open = true;
  }
  gate->opened.notify_all();
  test::eventually([&] { return lookups.stuck() == 0; }, 5s, 5ms);
  CHECK(lookups.stuck() == 0);
  auto again = lookups.run(answer("/srv/b"));
  REQUIRE(again);
  CHECK(again->path == "/srv/b");
}

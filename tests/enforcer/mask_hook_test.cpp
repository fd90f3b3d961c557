// The mask check's hook as a pure core (include/gpuguard/enforcement/mask_hook.hpp): its arguments both
// ways, the values it takes from the runtime's JSON, the container's root, and its verdict on mountinfos as
// runc leaves them at createRuntime: the container's mounts below its root, among the runtime's own, and
// the masks not yet read-only.
#include <catch2/catch.hpp>

#include <sstream>

#include "gpuguard/enforcement/mask_hook.hpp"

using namespace gpuguard::enforcement;

namespace {

const std::vector<NodeView::RootPlace> kPlaces = {{"/run/gpuguard", "0:25", "/gpuguard"},
                                                  {"/run/nvidia/mps", "0:25", "/nvidia/mps"}};
const std::string kRootfs = "/var/lib/containers/storage/overlay/abc/merged";

// A line of a mountinfo: the ID, parent, device, root, mount point, options, optional fields, "-", type.
std::string line(int id, const std::string& device, const std::string& root, const std::string& point,
                 const std::string& options, const std::string& type, const std::string& super = "rw") {
  return std::to_string(id) + " 1 " + device + " " + root + " " + point + " " + options + " - " + type + " " + type +
         " " + super + "\n";
}
// A mask's own options as the kernel writes them at createRuntime: still writable.
const std::string kMaskSuper = "rw,size=4k,mode=555";

// node-exporter's shape as runc leaves it at createRuntime: the runtime's own / and /run, then the
// container's root, the host's / bound at /host/root with its /run, and the masks (still writable).
std::string node_exporter(const std::string& mask_at) {
  return line(20, "8:1", "/", "/", "rw,relatime", "ext4") + line(21, "0:25", "/", "/run", "rw,nosuid", "tmpfs") +
         line(30, "0:50", "/", kRootfs, "rw,relatime", "overlay") +
         line(31, "8:1", "/", kRootfs + "/host/root", "ro,relatime", "ext4") +
         line(32, "0:25", "/", kRootfs + "/host/root/run", "ro,nosuid", "tmpfs") +
         line(33, "0:60", "/", kRootfs + mask_at + "/gpuguard", "rw,nosuid,nodev,noexec", "tmpfs", kMaskSuper) +
         line(34, "0:61", "/", kRootfs + mask_at + "/nvidia/mps", "rw,nosuid,nodev,noexec", "tmpfs", kMaskSuper);
}

}  // namespace

TEST_CASE("mask hook: the arguments the enforcer writes are read back as written") {
  const MaskHookCall call{kPlaces, true};
  const std::vector<std::string> args = mask_hook_args("/var/lib/gpuguard/bin/gpuguard-mask-check", call);
  CHECK(args == std::vector<std::string>{"/var/lib/gpuguard/bin/gpuguard-mask-check", "--unknown=allow", "--",
                                         "/run/gpuguard", "0:25", "/gpuguard", "/run/nvidia/mps", "0:25",
                                         "/nvidia/mps"});
  std::string why;
  const std::optional<MaskHookCall> read = parse_mask_hook_args(args, why);
  REQUIRE(read);
  CHECK(read->unknown_allowed);
  REQUIRE(read->places.size() == 2);
  CHECK(read->places[1].root == "/run/nvidia/mps");
  CHECK(read->places[1].device == "0:25");
  CHECK(read->places[1].path == "/nvidia/mps");
  CHECK_FALSE(parse_mask_hook_args(mask_hook_args("hook", {kPlaces, false}), why)->unknown_allowed);
}

TEST_CASE("mask hook: arguments not as the enforcer writes them are refused, saying why") {
  std::string why;
  CHECK_FALSE(parse_mask_hook_args({"hook"}, why));
  CHECK_THAT(why, Catch::StartsWith("usage: gpuguard-mask-check"));
  CHECK_FALSE(parse_mask_hook_args({"hook", "--unknown=refuse", "--"}, why));
  CHECK_FALSE(parse_mask_hook_args({"hook", "--", "/run/gpuguard", "0:25"}, why));
  CHECK_THAT(why, Catch::Contains("threes"));
  CHECK_FALSE(parse_mask_hook_args({"hook", "--", "/run/gpuguard", "25", "/gpuguard"}, why));
  CHECK_THAT(why, Catch::Contains("not an MPS root's place"));
  CHECK_FALSE(parse_mask_hook_args({"hook", "--", "run/gpuguard", "0:25", "/gpuguard"}, why));
}

TEST_CASE("mask hook: the runtime's JSON gives the values at the paths asked for, and nothing in arrays") {
  std::string why;
  std::istringstream state(
      R"({"ociVersion":"1.2.0","id":"abc","status":"creating","pid":4242,"bundle":"/run/crio/abc",)"
      R"("annotations":{"pid":"not this one","root":{"path":"nor this"}},"list":[{"pid":1}]})");
  const auto values = json_values(state, {"pid", "bundle", "root/path"}, why);
  REQUIRE(values);
  CHECK(*values == std::vector<std::string>{"4242", "/run/crio/abc", ""});
  std::istringstream config(R"({"root":{"path":"rootfs","readonly":false},"mounts":[{"root":{"path":"x"}}]})");
  CHECK(json_values(config, {"root/path"}, why) == std::vector<std::string>{"rootfs"});
}

TEST_CASE("mask hook: JSON that is not, or a value past a path's size, is refused, saying why") {
  std::string why;
  std::istringstream broken(R"({"pid": 42, "bundle": )");
  CHECK_FALSE(json_values(broken, {"pid"}, why));
  CHECK_THAT(why, Catch::StartsWith("not JSON"));
  std::istringstream long_path("{\"bundle\":\"/" + std::string(kPathMax, 'a') + "\"}");
  CHECK_FALSE(json_values(long_path, {"bundle"}, why));
  CHECK_THAT(why, Catch::Contains("bundle is over 4096 bytes"));
  // Past a path's size where it is not asked for: read past, not kept.
  std::istringstream long_other("{\"env\":\"" + std::string(3 * kPathMax, 'a') + "\",\"pid\":7}");
  CHECK(json_values(long_other, {"pid"}, why) == std::vector<std::string>{"7"});
}

TEST_CASE("mask hook: the container's root is config.json's, taken from the bundle where relative") {
  std::string why;
  CHECK(container_rootfs("/run/crio/abc", "rootfs", why) == "/run/crio/abc/rootfs");
  CHECK(container_rootfs("/run/crio/abc", kRootfs + "/", why) == kRootfs);
  CHECK(container_rootfs("/run/crio/abc", "", why).empty());
  CHECK(why == "its config.json names no root.path");
  CHECK(container_rootfs("", "rootfs", why).empty());
  CHECK_THAT(why, Catch::Contains("not an absolute path"));
}

TEST_CASE("mask hook: masks that landed over the roots pass, and the runtime's own mounts are not judged") {
  // The runtime's /run shows both roots unmasked: outside the container's root, so not judged.
  CHECK(mask_hook_verdict({kPlaces, false}, "", node_exporter("/host/root/run"), kRootfs).empty());
  // The same mounts read as at the start, where a mask is read-only by then: these are not yet.
  CHECK(unmasked_roots(node_exporter("/host/root/run"), kPlaces, MaskCheck{.rootfs = kRootfs}).size() == 2);
}

TEST_CASE("mask hook: a mask that landed elsewhere than the mount fails the create, naming the place") {
  const std::string refusal = mask_hook_verdict({kPlaces, false}, "", node_exporter("/elsewhere/run"), kRootfs);
  CHECK_THAT(refusal, Catch::StartsWith("gpuguard: the container would show every shared GPU's MPS server"));
  CHECK_THAT(refusal, Catch::Contains("(/host/root/run/gpuguard (/run/gpuguard), /host/root/run/nvidia/mps "
                                      "(/run/nvidia/mps))"));
  // A mask mounted before the mount it should hide hides nothing.
  std::string before = line(30, "0:50", "/", kRootfs, "rw", "overlay") +
                       line(33, "0:60", "/", kRootfs + "/host/root/run/nvidia/mps", "rw", "tmpfs", kMaskSuper) +
                       line(32, "0:25", "/", kRootfs + "/host/root/run", "ro", "tmpfs");
  CHECK_THAT(mask_hook_verdict({kPlaces, false}, "", before, kRootfs),
             Catch::Contains("/host/root/run/nvidia/mps (/run/nvidia/mps)"));
}

TEST_CASE("mask hook: mounts that show no container root, or no mask below it, cannot be checked") {
  // A process whose mounts are not where runc made the container's (a VM's runtime): nothing there shows
  // a root, and the check would pass on nothing.
  std::string elsewhere = line(20, "8:1", "/", "/", "rw", "ext4") + line(21, "0:25", "/", "/run", "rw", "tmpfs");
  CHECK_THAT(mask_hook_verdict({kPlaces, false}, "", elsewhere, kRootfs),
             Catch::Contains("cannot be checked: its process's mounts show no mount at its root (" + kRootfs + ")"));
  CHECK(mask_hook_verdict({kPlaces, true}, "", elsewhere, kRootfs).empty());
  // The root, and the host's / below it, but no mask at all.
  std::string bare =
      line(30, "0:50", "/", kRootfs, "rw", "overlay") + line(31, "8:1", "/", kRootfs + "/host/root", "ro", "ext4");
  CHECK_THAT(mask_hook_verdict({kPlaces, false}, "", bare, kRootfs),
             Catch::Contains("cannot be checked: its process's mounts show no mask at all below its root"));
  // The container's own /dev and /dev/shm are tmpfs too, of other sizes and modes: not a mask.
  bare += line(35, "0:70", "/", kRootfs + "/dev", "rw,nosuid", "tmpfs", "rw,size=65536k,mode=755") +
          line(36, "0:71", "/", kRootfs + "/dev/shm", "rw,nosuid", "tmpfs", "rw,size=4k,mode=1777");
  CHECK_THAT(mask_hook_verdict({kPlaces, false}, "", bare, kRootfs),
             Catch::Contains("cannot be checked: its process's mounts show no mask at all below its root"));
}

TEST_CASE("mask hook: a mask is known by its size and mode as the kernel writes them, whatever the page size") {
  const std::string at = kRootfs + "/host/root/run/gpuguard";
  CHECK(is_mask_line(line(33, "0:60", "/", at, "rw", "tmpfs", "rw,size=4k,mode=555")));
  CHECK(is_mask_line(line(33, "0:60", "/", at, "ro", "tmpfs", "ro,size=64k,mode=555,inode64")));   // 64 KiB pages
  CHECK_FALSE(is_mask_line(line(33, "0:60", "/", at, "rw", "tmpfs", "rw,size=65536k,mode=755")));  // a /dev
  CHECK_FALSE(is_mask_line(line(33, "0:60", "/", at, "rw", "tmpfs", "rw,size=4k,mode=1777")));
  CHECK_FALSE(is_mask_line(line(33, "0:60", "/", at, "rw", "ext4", "rw,size=4k,mode=555")));
}

TEST_CASE("mask hook: a mountinfo line gives its device and its mount point unescaped") {
  const MountFields fields = mount_fields("33 1 0:60 / /var/lib/a\\040b/merged rw - tmpfs tmpfs rw");
  CHECK(fields.device == "0:60");
  CHECK(fields.point == "/var/lib/a b/merged");
  CHECK(mount_fields("33 1 0:60 /").point.empty());
}

TEST_CASE("mask hook: JSON nested past its depth is refused, whatever it holds") {
  std::string why;
  std::istringstream deep(std::string(100, '[') + std::string(100, ']'));
  CHECK_FALSE(json_values(deep, {"pid"}, why));
  CHECK_THAT(why, Catch::Contains("nested deeper than 64"));
}

TEST_CASE("mask hook: mounts that cannot be read fail the create, unless nodeEnforcementUnknown allows") {
  CHECK(mask_hook_verdict({kPlaces, false}, "its mounts cannot be read", "", kRootfs) ==
        "gpuguard: the container has masks over MPS roots whose place cannot be checked: its mounts cannot be read");
  CHECK(mask_hook_verdict({kPlaces, true}, "its mounts cannot be read", "", kRootfs).empty());
}

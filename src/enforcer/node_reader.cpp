// What the node enforcer knows of its node (node_reader.hpp).
#include "node_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <set>

#include "gpuguard/discovery/discovery.hpp"
#include "gpuguard/files/in_root.hpp"
#include "gpuguard/files/read_file.hpp"
#include "gpuguard/k8s/host_path.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/nodereport/host_root.hpp"
#include "gpuguard/nodereport/report.hpp"
#include "host_places.hpp"

namespace gpuguard::enforcer {
namespace {

namespace fs = std::filesystem;
using enforcement::add_mig_devices_from_cdi;
using enforcement::kSwarmMax;
using enforcement::Toolkit;
using enforcement::ToolkitVersion;

constexpr std::size_t kCdiSpecMax = std::size_t{1} << 20;
// containerd's and CRI-O's CDI directories; the toolkit's own (spec-dirs) are read besides.
constexpr const char* kRuntimeSpecDirs[] = {"/etc/cdi", "/var/run/cdi"};
constexpr std::string_view kKnownModes[] = {"legacy", "cdi", "jit-cdi", "csv", "auto"};
// Where the runtimes' configurations and their drop-ins are: a file added there changes what runs.
constexpr const char* kRuntimeConfigDirs[] = {"/etc/containerd", "/etc/containerd/conf.d", "/etc/crio",
                                              "/etc/crio/crio.conf.d", "/etc/nvidia-container-runtime"};

std::optional<ToolkitVersion> parse_version(std::string_view text) {
  int parts[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parts[i]);
    if (error != std::errc()) return std::nullopt;
    text.remove_prefix(static_cast<std::size_t>(end - text.data()));
    if (i < 2) {
      if (!text.starts_with('.')) return std::nullopt;
      text.remove_prefix(1);
    }
  }
  return ToolkitVersion{parts[0], parts[1], parts[2]};
}

// The paths of an object's containerEdits.deviceNodes (a spec's or a device's), where it has them.
std::vector<std::string> device_node_paths(const YAML::Node& holder) {
  std::vector<std::string> paths;
  const YAML::Node edits = holder["containerEdits"];
  if (!edits || !edits.IsMap() || !edits["deviceNodes"] || !edits["deviceNodes"].IsSequence()) return paths;
  for (const auto& node : edits["deviceNodes"]) {
    if (node.IsMap() && node["path"] && node["path"].IsScalar()) paths.push_back(node["path"].as<std::string>());
  }
  return paths;
}

std::vector<std::string> spec_dirs(const std::vector<std::string>& toolkit_dirs) {
  std::vector<std::string> dirs(std::begin(kRuntimeSpecDirs), std::end(kRuntimeSpecDirs));
  for (const std::string& dir : toolkit_dirs) {
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
  }
  return dirs;
}

// The toolkit as the decision needs it, from the node report's facts.
Toolkit toolkit_of(const nodereport::Facts& facts) {
  Toolkit toolkit;
  if (!facts.runtime_config_unreadable.empty()) {
    // The runtime's configuration cannot be read: whether NVIDIA's runtime runs containers is not known, so
    // neither is the mode (unknown: judged as the strictest, and the log says why).
  } else if (!facts.container_runtime.empty() && !facts.default_is_nvidia && facts.nvidia_handlers.empty()) {
    toolkit.mode = "absent";  // no runtime handler runs NVIDIA's runtime: no variable selects anything
  } else if (std::find(std::begin(kKnownModes), std::end(kKnownModes), facts.runtime_mode) != std::end(kKnownModes)) {
    toolkit.mode = facts.runtime_mode;  // as configured (auto where the toolkit's configuration is absent)
  }
  if (facts.toolkit_version) toolkit.version = parse_version(*facts.toolkit_version);
  toolkit.tegra = facts.tegra;
  toolkit.default_kind = facts.default_kind;
  toolkit.annotation_prefixes = facts.annotation_prefixes;
  toolkit.swarm_variables = facts.swarm_variables;
  toolkit.swarm_over = toolkit.swarm_variables.size() > kSwarmMax;
  if (toolkit.swarm_over) toolkit.swarm_variables.resize(kSwarmMax);
  return toolkit;
}

// A mountinfo, at most enforcement::kMountinfoMax bytes (procfs says no size: read until the end).
std::optional<std::string> read_mountinfo(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buffer[16384];
  ssize_t n = 0;
  while ((n = ::read(fd, buffer, sizeof buffer)) > 0 && text.size() <= enforcement::kMountinfoMax) {
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (n < 0 || text.size() > enforcement::kMountinfoMax) return std::nullopt;
  return text;
}

// The path of `local` (a path in this process's view) inside its filesystem: the deepest mount of this
// process's that holds it, on `device`, its root joined with the rest. Empty where none is found.
std::string path_in_filesystem(std::string_view own, const std::string& device, const std::string& local) {
  std::string best_point, best_root;
  while (!own.empty()) {
    const std::size_t end = own.find('\n');
    const std::string_view line = own.substr(0, end);
    std::vector<std::string_view> fields;
    for (std::string_view rest = line; !rest.empty();) {
      const std::size_t space = rest.find(' ');
      fields.push_back(rest.substr(0, space));
      if (space == std::string_view::npos) break;
      rest.remove_prefix(space + 1);
    }
    if (fields.size() > 4 && fields[2] == device) {
      const std::string point = k8s::lexical_path(enforcement::mountinfo_path(fields[4]));
      if (k8s::is_or_under(local, point) && point.size() >= best_point.size()) {
        best_point = point;
        best_root = enforcement::mountinfo_path(fields[3]);
      }
    }
    if (end == std::string_view::npos) break;
    own.remove_prefix(end + 1);
  }
  if (best_point.empty()) return {};
  return k8s::lexical_path(best_root + "/" + local.substr(best_point == "/" ? 0 : best_point.size()));
}

constexpr const char* kInAProcess =
    "it leads through /proc, whose links lead where the process that follows them is, runc's own then";

// Where a host path leads, its links followed inside the host root with at most `steps_left` lookups; the
// doubts a link's place raises. Run on a PathWorker: it owns what it reads.
HostPathResolution follow(const fs::path& host_root, const std::string& lexical, const std::vector<std::string>& pods,
                          std::size_t& steps_left) {
  HostPathResolution where;
  const files::Followed followed = files::follow_in_root(host_root, lexical, &steps_left);
  if (followed.over_budget) {
    where.doubt = "its links and parts are more than the enforcer follows for one container";
    return where;
  }
  if (followed.loops) {
    where.doubt = "its links loop, or cannot be read";
    return where;
  }
  for (const std::string& link : followed.links) {
    if (in_a_process(link)) {
      where.doubt = kInAProcess;
      return where;
    }
    const std::string dir = fs::path(link).parent_path().string();
    const bool in_pods = std::any_of(pods.begin(), pods.end(),
                                     [&](const std::string& p) { return !p.empty() && k8s::is_or_under(dir, p); });
    if (in_pods || !written_by_containers(link, pods).empty()) {
      where.doubt = "it leads through the link " + link + ", where containers write, which they can change";
      return where;
    }
    // The directory's parts are links no more: read as they are, each part one lookup of the budget.
    const std::size_t lookups = static_cast<std::size_t>(std::count(dir.begin(), dir.end(), '/'));
    if (lookups > steps_left) {
      where.doubt = "its links and parts are more than the enforcer follows for one container";
      return where;
    }
    steps_left -= lookups;
    const fs::path local = host_root.empty() ? fs::path(dir) : host_root / fs::path(dir).relative_path();
    struct stat status {};
    if (::stat(local.c_str(), &status) == 0 && (status.st_mode & S_IWOTH) != 0) {
      where.doubt = "it leads through the link " + link + ", in a directory anyone may write";
      return where;
    }
  }
  // Where the links lead may itself be where containers write, though no link there is seen yet: one made
  // after the enforcer's view of the host was mounted, or made between this look and runc's.
  if (std::string why = written_by_containers(followed.path, pods); !why.empty()) {
    where.doubt = std::move(why);
    return where;
  }
  if (in_a_process(followed.path)) {
    where.doubt = kInAProcess;
    return where;
  }
  where.path = followed.path;
  return where;
}

}  // namespace

NodeReader::NodeReader(fs::path host_root, std::vector<std::string> mps_roots, const fs::path& kubelet_root)
    : host_root_(std::move(host_root)),
      mps_roots_(std::move(mps_roots)),
      kubelet_pods_(k8s::lexical_path((kubelet_root / "pods").string())),
      kubelet_pods_followed_(std::make_shared<const std::string>()) {
  refresh();
}

NodeReader::Stamp NodeReader::stamp(const std::string& host_path) const {
  const auto path = files::in_root(host_root_, host_path);
  struct stat status {};
  if (!path || ::stat(path->c_str(), &status) != 0) return {};
  return {true,
          fs::file_time_type(std::chrono::seconds(status.st_mtim.tv_sec) +
                             std::chrono::nanoseconds(status.st_mtim.tv_nsec)),
          static_cast<std::uintmax_t>(status.st_size), static_cast<std::uintmax_t>(status.st_ino)};
}

std::vector<NodeReader::Stamp> NodeReader::stamps(const std::vector<std::string>& host_paths) const {
  std::vector<Stamp> out;
  out.reserve(host_paths.size());
  for (const std::string& path : host_paths) out.push_back(stamp(path));
  return out;
}

std::shared_ptr<const NodeView> NodeReader::current() {
  std::shared_ptr<const NodeView> node = node_.load();
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return node;  // another thread is reading it
  const Stamp driver = stamp("/proc/driver/nvidia");
  const bool toolkit = stamps(watched_.toolkit_paths) != watched_.toolkit;
  const bool specs = stamps(watched_.spec_dirs) != watched_.specs;
  const bool gpus = driver.exists != watched_.driver.exists;
  const bool mps = stamps(node->mps_roots) != watched_.mps;
  if (!toolkit && !specs && !gpus && !mps) return node;
  auto fresh = std::make_shared<NodeView>(*node);
  if (mps) read_mps_roots(*fresh, watched_);
  if (gpus) {
    read_gpus(*fresh);
    watched_.driver = driver;
  }
  if (toolkit) read_toolkit(*fresh, watched_);
  read_specs(*fresh);
  watched_.spec_dirs = fresh->cdi_spec_dirs;
  watched_.specs = stamps(watched_.spec_dirs);
  log::info("node read again, as what it is read from changed",
            {{"toolkit", toolkit},
             {"cdi_specs", specs},
             {"driver", gpus},
             {"mps_roots", mps},
             {"gpus", fresh->gpus.size()},
             {"toolkit_mode", fresh->toolkit.mode.value_or("unknown")}});
  node_.store(fresh);
  return fresh;
}

void NodeReader::refresh() {
  auto node = std::make_shared<NodeView>();
  const std::lock_guard lock(mutex_);
  watched_.driver = stamp("/proc/driver/nvidia");
  read_gpus(*node);
  read_toolkit(*node, watched_);
  for (const std::string& root : mps_roots_) {
    if (std::find(node->mps_roots.begin(), node->mps_roots.end(), root) == node->mps_roots.end()) {
      node->mps_roots.push_back(root);
    }
  }
  read_specs(*node);
  read_mps_roots(*node, watched_);
  const files::Followed pods = files::follow_in_root(host_root_, kubelet_pods_);
  kubelet_pods_followed_.store(
      std::make_shared<const std::string>(pods.path != kubelet_pods_ ? pods.path : std::string()));
  watched_.spec_dirs = node->cdi_spec_dirs;
  watched_.specs = stamps(watched_.spec_dirs);
  log::info("node read", {{"gpus", node->gpus.size()},
                          {"gpus_unknown", node->gpus_unknown},
                          {"toolkit_mode", node->toolkit.mode.value_or("unknown")},
                          {"cdi_devices", node->cdi_devices.size()}});
  node_.store(std::move(node));
}

void NodeReader::read_gpus(NodeView& node) const {
  node.gpus.clear();
  node.gpus_unknown.clear();
  try {
    node.gpus = discovery::discover(discovery::DiscoveryMode::automatic, host_root_).gpus;
    if (node.gpus.empty()) {
      std::error_code ec;
      node.gpus_unknown = fs::exists(discovery::host_path(host_root_, "/proc/driver/nvidia"), ec)
                              ? "the driver lists no GPU (/proc/driver/nvidia/gpus)"
                              : "no driver is loaded (/proc/driver/nvidia)";
    }
  } catch (const std::exception& e) {
    node.gpus_unknown = std::string("the driver's list of GPUs cannot be read: ") + e.what();
  }
}

void NodeReader::read_toolkit(NodeView& node, Watched& watched) const {
  const nodereport::HostRoot host(host_root_);
  const nodereport::Facts facts = nodereport::judge(host, "void").facts;
  node.toolkit = toolkit_of(facts);
  if (!facts.runtime_config_unreadable.empty()) {
    log::warn(
        "cannot judge the container runtime's configuration: the toolkit's mode is unknown, and judged as the "
        "strictest until it can be read",
        {{"runtime", facts.container_runtime}, {"unreadable", facts.runtime_config_unreadable}});
  }
  node.cdi_spec_dirs = spec_dirs(facts.spec_dirs);
  std::set<std::string> paths(std::begin(kRuntimeConfigDirs), std::end(kRuntimeConfigDirs));
  paths.insert(facts.runtime_config_files.begin(), facts.runtime_config_files.end());
  paths.insert(facts.read_files.begin(), facts.read_files.end());
  for (const std::string* path : {&facts.toolkit_config_file, &facts.default_runtime_binary,
                                  &facts.nvidia_runtime_binary, &facts.toolkit_version_source}) {
    if (path->starts_with('/')) paths.insert(*path);
  }
  watched.toolkit_paths.assign(paths.begin(), paths.end());
  watched.toolkit = stamps(watched.toolkit_paths);
}

void NodeReader::read_specs(NodeView& node) const {
  node.cdi_devices.clear();
  for (const std::string& dir : node.cdi_spec_dirs) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(discovery::host_path(host_root_, dir), ec)) {
      const std::string extension = entry.path().extension().string();
      // A spec may be a link, which the host follows from its own root.
      const fs::path spec_path = discovery::host_path(host_root_, dir + "/" + entry.path().filename().string());
      if ((extension != ".yaml" && extension != ".yml" && extension != ".json") ||
          fs::file_size(spec_path, ec) > kCdiSpecMax || ec) {
        continue;
      }
      const auto text = files::read_file(spec_path);
      if (!text) continue;
      try {
        const YAML::Node spec = YAML::Load(*text);
        if (!spec.IsMap() || !spec["kind"] || !spec["kind"].IsScalar() || !spec["devices"] ||
            !spec["devices"].IsSequence()) {
          continue;
        }
        const std::string kind = spec["kind"].as<std::string>();
        const std::vector<std::string> common = device_node_paths(spec);
        for (const auto& device : spec["devices"]) {
          if (!device.IsMap() || !device["name"] || !device["name"].IsScalar()) continue;
          std::vector<std::string>& nodes = node.cdi_devices[kind + "=" + device["name"].as<std::string>()];
          nodes.insert(nodes.end(), common.begin(), common.end());
          const std::vector<std::string> own = device_node_paths(device);
          nodes.insert(nodes.end(), own.begin(), own.end());
        }
      } catch (const YAML::Exception&) {
        // A spec the runtime would not read either: it injects nothing.
      }
    }
  }
  add_mig_devices_from_cdi(node);
}

// An MPS root is masked where it is a directory on the host, reached without a link: runc mounts the mask
// at the same path below a container's bind mount, following links there inside the container's root. Its
// place (the filesystem it is on, and its path there) is what a container's mountinfo is checked against at
// its start; a root whose place cannot be read is not masked.
void NodeReader::read_mps_roots(NodeView& node, Watched& watched) const {
  node.mps_roots_maskable.clear();
  node.mps_root_places.clear();
  const std::optional<std::string> own = read_mountinfo("/proc/self/mountinfo");
  for (const std::string& configured : node.mps_roots) {
    const std::string root = enforcement::host_path(configured);
    const files::Followed followed = files::follow_in_root(host_root_, root);
    const auto local = files::in_root(host_root_, root);
    struct stat status {};
    if (!followed.links.empty() || followed.loops || followed.over_budget || followed.path != root || !local ||
        ::lstat(local->c_str(), &status) != 0 || !S_ISDIR(status.st_mode)) {
      continue;
    }
    const std::string device = std::to_string(major(status.st_dev)) + ":" + std::to_string(minor(status.st_dev));
    std::string path = own ? path_in_filesystem(*own, device, local->string()) : std::string();
    if (path.empty()) {
      log::warn("an MPS root's place cannot be read: containers that mount a directory above it are refused",
                {{"root", root}});
      continue;
    }
    node.mps_roots_maskable.insert(root);
    node.mps_root_places.push_back({root, device, std::move(path)});
  }
  watched.mps = stamps(node.mps_roots);
}

// The lines of a process's mountinfo the check reads (enforcement::unmasked_roots): those on an MPS root's
// filesystem, and tmpfs mounts. Read as a stream, whatever the whole (an agent that binds the host's / holds
// the host's every mount): what is kept is at most kMountinfoMax bytes, and the reading stops at 250 ms.
std::optional<std::string> NodeReader::mountinfo(std::uint32_t pid, std::string& why) {
  const std::string path = (host_root_ / "proc" / std::to_string(pid) / "mountinfo").string();
  std::set<std::string, std::less<>> devices;
  for (const auto& place : node_.load()->mps_root_places) devices.insert(" " + place.device + " ");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    why = "its mounts (" + path + ") cannot be read";
    return std::nullopt;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
  std::string kept, line;
  std::array<char, 65536> buffer{};
  const auto keep = [&](std::string_view text) {
    // The third field is the device: " major:minor " after the two IDs.
    const std::size_t second = text.find(' ', text.find(' ') + 1);
    const std::size_t third = second == std::string_view::npos ? second : text.find(' ', second + 1);
    const bool on_root = third != std::string_view::npos && devices.contains(text.substr(second, third - second + 1));
    if (third == std::string_view::npos) return;
    // A mask is a read-only tmpfs: the sixth field, its mount's options, is ro or starts with "ro,".
    const std::size_t fourth = text.find(' ', third + 1);
    const std::size_t fifth = fourth == std::string_view::npos ? fourth : text.find(' ', fourth + 1);
    const std::string_view options = fifth == std::string_view::npos ? std::string_view() : text.substr(fifth + 1, 3);
    const bool read_only_tmpfs =
        (options == "ro," || options == "ro ") && text.find(" - tmpfs ") != std::string_view::npos;
    if (on_root || read_only_tmpfs) kept.append(text).push_back('\n');
  };
  ssize_t n = 1;
  while (n > 0 && kept.size() <= enforcement::kMountinfoMax && line.size() <= 4 * enforcement::kPathMax + 1024 &&
         std::chrono::steady_clock::now() < deadline) {
    n = ::read(fd, buffer.data(), buffer.size());
    std::string_view chunk(buffer.data(), n > 0 ? static_cast<std::size_t>(n) : 0);
    for (std::size_t end = chunk.find('\n'); end != std::string_view::npos; end = chunk.find('\n')) {
      line.append(chunk.substr(0, end));
      keep(line);
      line.clear();
      chunk.remove_prefix(end + 1);
    }
    line.append(chunk);
  }
  ::close(fd);
  if (n == 0 && kept.size() <= enforcement::kMountinfoMax) {
    if (!line.empty()) keep(line);
    return kept;
  }
  if (n < 0) {
    why = "its mounts (" + path + ") cannot be read";
  } else if (kept.size() > enforcement::kMountinfoMax) {
    why =
        "its mounts on an MPS root's filesystem are over " + std::to_string(enforcement::kMountinfoMax >> 10) + " KiB";
  } else if (line.size() > 4 * enforcement::kPathMax + 1024) {
    why = "a line of its mounts is longer than any the kernel writes";
  } else {
    why = "its mounts take longer than 250 ms to read";
  }
  return std::nullopt;
}

HostPathResolution NodeReader::resolve(std::string_view host_path, std::size_t& steps_left) {
  HostPathResolution where;
  const std::string lexical = k8s::lexical_path(host_path);
  std::vector<std::string> pods = {kubelet_pods_};
  if (const auto followed = kubelet_pods_followed_.load(); !followed->empty()) pods.push_back(*followed);
  if (std::string why = written_by_containers(lexical, pods); !why.empty()) {
    where.doubt = std::move(why);
    return where;
  }
  if (in_a_process(lexical)) {
    where.doubt = kInAProcess;
    return where;
  }
  if (made_by_the_kubelet(lexical, pods)) return where;  // bound as written; a dead NFS server never asked
  auto left = std::make_shared<std::size_t>(steps_left);
  std::optional<HostPathResolution> found = lookups_.run([host_root = host_root_, lexical, pods = std::move(pods),
                                                          left] { return follow(host_root, lexical, pods, *left); });
  if (!found) {
    log::warn("a host path could not be looked up in time: a network filesystem may not answer",
              {{"path", lexical.substr(0, 256)}, {"stuck_lookups", lookups_.stuck()}});
    where.doubt = "the enforcer cannot look it up in time (a network filesystem that does not answer?)";
    return where;
  }
  steps_left = *left;
  return std::move(*found);
}

}  // namespace gpuguard::enforcer

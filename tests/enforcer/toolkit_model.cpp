// NVIDIA's container toolkit's reading of a container (toolkit_model.hpp). Paths without a tag are
// NVIDIA/nvidia-container-toolkit v1.20.1; "1.17.8:" and "1.18.x:" mark the rules of older tags. Nothing here
// is shared with src/enforcer: it is the second implementation the node enforcer's decision is held to.
#include "toolkit_model.hpp"

#include <algorithm>
#include <cctype>
#include <tuple>

namespace gpuguard::test::toolkit {
namespace {

using Version = std::tuple<int, int, int>;

constexpr std::string_view kDevicesRoot = "/var/run/nvidia-container-devices";  // cuda_image.go:34
constexpr std::string_view kJitKind = "runtime.nvidia.com/gpu";                 // internal/modifier/cdi.go:45-49
constexpr std::string_view kManagementKind = "management.nvidia.com/gpu";       // pkg/nvcdi/management.go
constexpr std::int64_t kNvidiaMajor = 195;

// Go's filepath.Clean, for the absolute and relative paths mounts hold.
std::string clean(std::string_view path) {
  const bool absolute = path.starts_with('/');
  std::vector<std::string> parts;
  std::size_t at = 0;
  while (at <= path.size()) {
    const std::size_t slash = std::min(path.find('/', at), path.size());
    const std::string_view part = path.substr(at, slash - at);
    if (part == "..") {
      if (!parts.empty() && parts.back() != "..") {
        parts.pop_back();
      } else if (!absolute) {
        parts.emplace_back("..");
      }
    } else if (!part.empty() && part != ".") {
      parts.emplace_back(part);
    }
    at = slash + 1;
  }
  std::string out = absolute ? "/" : "";
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i == 0 ? "" : "/") + parts[i];
  return out.empty() ? "." : out;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

std::vector<std::string> split(std::string_view s, char separator) {
  std::vector<std::string> parts;
  while (true) {
    const std::size_t at = s.find(separator);
    parts.emplace_back(s.substr(0, at));
    if (at == std::string_view::npos) return parts;
    s.remove_prefix(at + 1);
  }
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

bool decimal(std::string_view s) {
  return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// CDI's parser.IsQualifiedName: vendor/class=name, each part non-empty.
bool qualified(std::string_view name) {
  const std::size_t equals = name.find('=');
  if (equals == std::string_view::npos || equals + 1 == name.size()) return false;
  const std::size_t slash = name.substr(0, equals).find('/');
  return slash != std::string_view::npos && slash > 0 && slash + 1 < equals;
}

// A request list as NewVisibleDevices makes it (internal/config/image/devices.go:36-117): nullopt is void.
// The first all or none decides; otherwise the ids, where a duplicate leaves "" at its earlier place
// (devices.go:90-117 writes each id at its last index into a list of the original length).
std::optional<std::vector<std::string>> visible_devices(const std::vector<std::string>& tokens) {
  if (tokens.empty() || std::find(tokens.begin(), tokens.end(), "void") != tokens.end()) return std::nullopt;
  for (const std::string& token : tokens) {
    if (token == "all") return std::vector<std::string>{"all"};
    if (token == "none") return std::vector<std::string>{""};
  }
  std::vector<std::string> list(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto last = std::find(tokens.rbegin(), tokens.rend(), tokens[i]);
    list[tokens.size() - 1 - static_cast<std::size_t>(last - tokens.rbegin())] = tokens[i];
  }
  return list;
}

// Comma-split, each trimmed, empty ones dropped (cuda_image.go:149-166).
std::vector<std::string> tokens_of(std::string_view value) {
  std::vector<std::string> out;
  for (const std::string& part : split(value, ',')) {
    if (std::string t = trim(part); !t.empty()) out.push_back(std::move(t));
  }
  return out;
}

class Reading {
 public:
  Reading(const Spec& spec, const Config& config, const Node& node) : spec_(spec), config_(config), node_(node) {}

  Given run() {
    // builder.go:107-119: process.env folded into a map, later entries winning; one without '=' fails.
    for (const std::string& entry : spec_.env) {
      const std::size_t equals = entry.find('=');
      if (equals == std::string::npos) return fail("invalid environment variable " + entry);
      env_[entry.substr(0, equals)] = entry.substr(equals + 1);
    }
    if (!resolve_mode()) return given_;
    if (mode_ == "legacy") {
      legacy();
    } else if (mode_ == "cdi") {
      cdi_mode();
    } else {
      jit(mode_ == "csv");
    }
    if (given_.fails) return given_;
    spec_devices();
    return given_;
  }

 private:
  bool at_least(Version v) const { return config_.version >= v; }

  Given fail(std::string why) {
    given_ = Given{};
    given_.fails = true;
    given_.why = std::move(why);
    return given_;
  }

  std::optional<std::string> var(const std::string& name) const {
    const auto found = env_.find(name);
    return found == env_.end() ? std::nullopt : std::optional<std::string>(found->second);
  }

  // cuda_image.go:101-105.
  bool legacy_image() const {
    return !var("CUDA_VERSION").value_or("").empty() && var("NVIDIA_REQUIRE_CUDA").value_or("").empty();
  }

  // The environment's request (cuda_image.go:168-176, 239-251): the swarm variables where one is set, else
  // NVIDIA_VISIBLE_DEVICES; neither set on a legacy image is all.
  std::optional<std::vector<std::string>> env_request() const {
    std::vector<std::string> tokens;
    bool set = false;
    for (const std::string& name : config_.swarm) {
      if (const auto value = var(name)) {
        set = true;
        for (std::string& t : tokens_of(*value)) tokens.push_back(std::move(t));
      }
    }
    if (!set) {
      if (const auto value = var("NVIDIA_VISIBLE_DEVICES")) {
        set = true;
        tokens = tokens_of(*value);
      }
    }
    if (!set) return legacy_image() ? std::optional<std::vector<std::string>>({"all"}) : std::nullopt;
    return visible_devices(tokens);
  }

  // Device lists mounted from /dev/null (cuda_image.go:358-388): the cleaned destination by string prefix,
  // the rest with '/' trimmed; deduplicated by destination.
  std::vector<std::string> mount_names() const {
    std::vector<std::string> names, seen;
    for (const enforcement::Mount& mount : spec_.mounts) {
      if (clean(mount.source) != "/dev/null") continue;
      const std::string destination = clean(mount.destination);
      if (!destination.starts_with(kDevicesRoot)) continue;
      if (std::find(seen.begin(), seen.end(), destination) != seen.end()) continue;
      seen.push_back(destination);
      std::string_view name = std::string_view(destination).substr(kDevicesRoot.size());
      while (name.starts_with('/')) name.remove_prefix(1);
      while (name.ends_with('/')) name.remove_suffix(1);
      if (!name.empty()) names.emplace_back(name);
    }
    return names;
  }

  // The GPU requests among them (cuda_image.go:336-355, 399-414): imex/ ones are not; cdi/<v>/<c>/<d> and
  // cdi/<v>/<c>=<d> are qualified names (1.17.8: the three-part form only, and only in cdi mode); others raw.
  std::vector<std::string> mount_requests() const {
    std::vector<std::string> out;
    for (const std::string& name : mount_names()) {
      if (name.starts_with("imex/")) continue;
      if (name.starts_with("cdi/")) {
        const std::vector<std::string> parts = split(std::string_view(name).substr(4), '/');
        if (parts.size() == 3) {
          out.push_back(parts[0] + "/" + parts[1] + "=" + parts[2]);
        } else if (parts.size() == 2 && parts[1].find('=') != std::string::npos && at_least({1, 18, 0})) {
          out.push_back(parts[0] + "/" + parts[1]);
        }
        continue;
      }
      out.push_back(name);
    }
    return out;
  }

  // cdi.k8s.io/ annotations, keys sorted, values comma-split untrimmed (cuda_image.go:300-324).
  std::vector<std::string> annotation_requests() const {
    std::vector<std::string> out;
    for (const auto& annotation : spec_.annotations) {  // a std::map: sorted
      const std::string& key = annotation.first;
      const bool matches = std::any_of(config_.annotation_prefixes.begin(), config_.annotation_prefixes.end(),
                                       [&](const std::string& prefix) { return key.starts_with(prefix); });
      if (!matches) continue;
      for (std::string& name : split(annotation.second, ',')) out.push_back(std::move(name));
    }
    return out;
  }

  // VisibleDevices (cuda_image.go:258-292): annotations (where read), else mounts (where accepted, with no
  // privilege check), else the environment (only privileged, unless envvar-when-unprivileged).
  std::optional<std::vector<std::string>> requests(bool with_annotations, bool& from_env) const {
    from_env = false;
    if (with_annotations) {
      if (auto names = annotation_requests(); !names.empty()) return names;
    }
    if (config_.volume_mounts) {
      if (auto names = mount_requests(); !names.empty()) return names;
    }
    if (!spec_.cap_sys_admin && !config_.envvar_when_unprivileged) return std::nullopt;
    from_env = true;
    return env_request();
  }

  // internal/info/auto.go:111-136 (1.17.8: auto.go:49-55, cuda_image.go:201-217).
  bool resolve_mode() {
    mode_ = config_.mode;
    if (mode_ == "jit-cdi" && !at_least({1, 18, 0})) {
      fail("invalid runtime mode jit-cdi (1.17.8: runtime_factory.go:110-121)");
      return false;
    }
    if (mode_ != "auto") return true;
    bool qualified_only = false;
    if (at_least({1, 18, 0})) {
      bool from_env = false;
      const auto first = requests(true, from_env);
      qualified_only = first && !first->empty() &&
                       std::all_of(first->begin(), first->end(), [](const std::string& n) { return qualified(n); });
    } else {
      // 1.17.8: NVIDIA_VISIBLE_DEVICES (privilege ignored) and every device list mount, each cdi/.
      std::vector<std::string> names;
      if (const auto env = var("NVIDIA_VISIBLE_DEVICES")) names = tokens_of(*env);
      bool mounts_cdi = true;
      for (const std::string& name : mount_names()) mounts_cdi = mounts_cdi && name.starts_with("cdi/");
      qualified_only = !names.empty() && mounts_cdi &&
                       std::all_of(names.begin(), names.end(), [](const std::string& n) { return qualified(n); });
    }
    mode_ = qualified_only ? "cdi" : (at_least({1, 18, 0}) ? "jit-cdi" : "legacy");
    return true;
  }

  // One device token as libnvidia-container's CLI selects it (src/cli/common.c select_devices, read at
  // 921e2f3, the commit toolkit 1.16.2 pins; the matching is the same since 9cd2a5f, 2020): all, case-insensitive,
  // is every GPU and every MIG device; then select_gpu_device: a GPU- UUID of the same length, case-insensitive;
  // a PCI bus id as sscanf("%x:%02x:%02x.0") reads it (three numbers; the ".0" is not checked), compared with
  // each GPU's bus id by its normalised prefix; a decimal index read whole by strtoumax; then
  // select_mig_device: a MIG- UUID likewise; "%lu:%lu" as sscanf reads it, trailing bytes ignored (so
  // "1:0.0" is MIG device 0 of GPU 1). Anything else fails ("unknown device").
  bool legacy_select(const std::string& id) {
    if (id.empty()) return true;  // skipped
    if (iequals(id, "all")) {
      for (const discovery::Gpu& gpu : node_.gpus) {
        add_gpu(gpu);
        for (const auto& mig : gpu.mig_devices) add_mig(gpu, mig.uuid);
      }
      return true;
    }
    for (const discovery::Gpu& gpu : node_.gpus) {
      if (id.size() > 4 && iequals(id.substr(0, 4), "GPU-") && iequals(id, gpu.uuid)) {
        add_gpu(gpu);
        return true;
      }
    }
    if (const auto bus = scan_pci(id)) {
      for (const discovery::Gpu& gpu : node_.gpus) {
        if (const auto own = scan_pci(gpu.pci_address); own && *own == *bus) {
          add_gpu(gpu);
          return true;
        }
      }
    }
    if (decimal(id) && std::stoul(id) < node_.gpus.size()) {
      add_gpu(node_.gpus[std::stoul(id)]);
      return true;
    }
    for (const discovery::Gpu& gpu : node_.gpus) {
      for (const auto& mig : gpu.mig_devices) {
        if (id.size() > 4 && iequals(id.substr(0, 4), "MIG-") && iequals(id, mig.uuid)) {
          add_mig(gpu, mig.uuid);
          return true;
        }
      }
    }
    if (const auto pair = scan_two(id); pair && pair->first < node_.gpus.size()) {
      const discovery::Gpu& gpu = node_.gpus[pair->first];
      if (pair->second < gpu.mig_devices.size()) {
        add_mig(gpu, gpu.mig_devices[pair->second].uuid);
        return true;
      }
    }
    return false;
  }

  // sscanf's %lu: leading spaces, an optional sign, decimal digits (strtoul: a minus wraps).
  static std::optional<unsigned long> scan_unsigned(std::string_view& s, int base = 10, std::size_t width = 0) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    bool negative = false;
    if (!s.empty() && (s.front() == '+' || s.front() == '-')) {
      negative = s.front() == '-';
      s.remove_prefix(1);
    }
    std::size_t n = 0;
    unsigned long value = 0;
    while (n < s.size() && (width == 0 || n < width) && std::isxdigit(static_cast<unsigned char>(s[n])) &&
           (base == 16 || std::isdigit(static_cast<unsigned char>(s[n])))) {
      const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[n])));
      value = value * static_cast<unsigned long>(base) + static_cast<unsigned long>(c <= '9' ? c - '0' : c - 'a' + 10);
      ++n;
    }
    if (n == 0) return std::nullopt;
    s.remove_prefix(n);
    return negative ? 0UL - value : value;
  }

  // sscanf(id, "%lu:%lu", &i, &j) == 2.
  static std::optional<std::pair<unsigned long, unsigned long>> scan_two(std::string_view s) {
    const auto i = scan_unsigned(s);
    if (!i || !s.starts_with(':')) return std::nullopt;
    s.remove_prefix(1);
    const auto j = scan_unsigned(s);
    if (!j) return std::nullopt;
    return std::pair{*i, *j};
  }

  // sscanf(id, "%x:%02x:%02x.0", &domain, &bus, &device) == 3, as the three numbers.
  static std::optional<std::tuple<unsigned long, unsigned long, unsigned long>> scan_pci(std::string_view s) {
    const auto domain = scan_unsigned(s, 16);
    if (!domain || !s.starts_with(':')) return std::nullopt;
    s.remove_prefix(1);
    const auto bus = scan_unsigned(s, 16, 2);
    if (!bus || !s.starts_with(':')) return std::nullopt;
    s.remove_prefix(1);
    const auto device = scan_unsigned(s, 16, 2);
    if (!device) return std::nullopt;
    return std::tuple{*domain, *bus, *device};
  }

  bool index_select(const std::string& id) {
    const std::size_t colon = id.find(':');
    const std::string gpu_part = id.substr(0, colon);
    if (!decimal(gpu_part)) return false;
    const std::size_t index = std::stoul(gpu_part);
    if (index >= node_.gpus.size()) return false;
    const discovery::Gpu& gpu = node_.gpus[index];
    if (colon == std::string::npos) {
      add_gpu(gpu);
      return true;
    }
    const std::string mig_part = id.substr(colon + 1);
    if (!decimal(mig_part) || std::stoul(mig_part) >= gpu.mig_devices.size()) return false;
    add_mig(gpu, gpu.mig_devices[std::stoul(mig_part)].uuid);
    return true;
  }

  void add_gpu(const discovery::Gpu& gpu) {
    given_.gpus.insert(gpu.uuid);
    given_.gpu_nodes.insert(gpu.minor);
  }

  void add_mig(const discovery::Gpu& gpu, const std::string& mig) {
    given_.gpus.insert(mig);
    given_.gpu_nodes.insert(gpu.minor);  // a MIG device's container opens its parent's node
    const auto& caps = discovery::find_mig(gpu, mig)->cap_minors;
    given_.cap_nodes.insert(caps.begin(), caps.end());
  }

  // What a device node brings, by its path (CDI specs name host paths).
  void node_path(std::string_view path) {
    constexpr std::string_view kGpu = "/dev/nvidia", kCap = "/dev/nvidia-caps/nvidia-cap",
                               kImex = "/dev/nvidia-caps-imex-channels/channel";
    if (path.starts_with(kImex) && decimal(path.substr(kImex.size()))) {
      given_.imex.insert(static_cast<unsigned>(std::stoul(std::string(path.substr(kImex.size())))));
    } else if (path.starts_with(kCap) && decimal(path.substr(kCap.size()))) {
      given_.cap_nodes.insert(static_cast<unsigned>(std::stoul(std::string(path.substr(kCap.size())))));
    } else if (path.starts_with(kGpu) && decimal(path.substr(kGpu.size()))) {
      const auto minor = static_cast<unsigned>(std::stoul(std::string(path.substr(kGpu.size()))));
      if (minor < 254) given_.gpu_nodes.insert(minor);  // 254 nvidia-modeset, 255 nvidiactl
    }
  }

  // Legacy mode: nvidia-container-runtime-hook prestart hands the requests to nvidia-container-cli, which
  // makes the nodes at prestart (internal/modifier/stable.go; cmd/nvidia-container-runtime-hook). No
  // annotations are read. From 1.19, a gated variable (NVIDIA_GDS, _MOFED, _NVSWITCH, _GDRCOPY = enabled)
  // has NVIDIA_VISIBLE_DEVICES=void written into the spec before the hook reads it (gated.go:44,
  // pkg/nvcdi/wrapper.go:99).
  void legacy() {
    bool from_env = false;
    auto list = requests(false, from_env);
    const bool gated = std::any_of(std::begin(kGated), std::end(kGated), [&](const char* name) {
      return var(name) == std::optional<std::string>("enabled");
    });
    if (list && from_env && gated && at_least({1, 19, 0}) && var("NVIDIA_VISIBLE_DEVICES")) list.reset();
    if (list) {
      for (const std::string& id : *list) {
        // A raw mount name is one id to the runtime, and the hook joins ids with commas for the CLI.
        for (const std::string& part : split(id, ',')) {
          if (!legacy_select(trim(part))) {
            fail("unknown device " + part + " (libnvidia-container select_devices)");
            return;
          }
        }
      }
    }
    imex(true, list.has_value());
  }

  static constexpr const char* kGated[] = {"NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH", "NVIDIA_GDRCOPY"};

  // IMEX channels (cuda_image.go:416-469): imex/<id> mounts where mounts are accepted, else
  // NVIDIA_IMEX_CHANNELS under the privilege rule, parsed as devices are; exactly ["all"] is dropped (1.18+).
  // Legacy: --imex-channel (1.17.8 passes all on); JIT (1.18+, only beside a GPU request on that path): each
  // id's node, "" (none) being every channel (lib-imex.go; wrapper.go:52-55).
  void imex(bool legacy_mode, bool gpus_requested) {
    std::vector<std::string> ids;
    bool any = false;
    if (config_.volume_mounts) {
      for (const std::string& name : mount_names()) {
        if (name.starts_with("imex/")) {
          ids.push_back(name.substr(5));
          any = true;
        }
      }
    }
    if (!any && (spec_.cap_sys_admin || config_.envvar_when_unprivileged)) {
      if (const auto value = var("NVIDIA_IMEX_CHANNELS")) {
        auto list = visible_devices(tokens_of(*value));
        if (list && !(at_least({1, 18, 0}) && *list == std::vector<std::string>{"all"})) ids = *list;
      }
    }
    // Only a GPU container is set up at all; the CDI modes read IMEX requests from 1.18.
    if (!gpus_requested || (!legacy_mode && !at_least({1, 18, 0}))) return;
    for (std::string id : ids) {
      if (id.starts_with("channel")) id.erase(0, 7);
      if (id == "all" || (id.empty() && !legacy_mode)) {
        given_.imex.insert(node_.imex_channels.begin(), node_.imex_channels.end());
      } else if (decimal(id) && node_.imex_channels.contains(static_cast<unsigned>(std::stoul(id)))) {
        given_.imex.insert(static_cast<unsigned>(std::stoul(id)));
      }
    }
  }

  // The CDI registry (internal/modifier/cdi/registry.go:40-62): every name must resolve, or the create fails.
  bool registry(const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      const auto found = node_.cdi.find(name);
      if (found == node_.cdi.end()) {
        fail("unresolvable CDI devices " + name);
        return false;
      }
      for (const std::string& path : found->second) node_path(path);
    }
    return true;
  }

  // cdi mode (internal/modifier/cdi.go:45-132): the requests, annotations first, each qualified with the
  // default kind ("" is none from 1.18.2; before, the name ends at '=' and resolves nowhere); NVIDIA's JIT
  // kind goes to JIT, alone.
  void cdi_mode() {
    bool from_env = false;
    std::optional<std::vector<std::string>> list;
    if (at_least({1, 18, 0})) {
      list = requests(true, from_env);
    } else {
      list = requests_1_17(from_env);
      if (given_.fails) return;
    }
    if (!list) return;
    std::vector<std::string> names;
    for (std::string id : *list) {
      if (id.empty() && at_least({1, 18, 2})) id = "none";
      std::string name = qualified(id) ? id : config_.default_kind + "=" + id;
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
    }
    route(names);
  }

  // 1.17.8's cdi mode: annotations (each qualified, or the create fails), then cdi/<v>/<c>/<d> mounts, then
  // the environment under the privilege rule (1.17.8: internal/modifier/cdi.go:68-117).
  std::optional<std::vector<std::string>> requests_1_17(bool& from_env) {
    from_env = false;
    std::vector<std::string> names = annotation_requests();
    if (!names.empty()) {
      for (const std::string& n : names) {
        if (!qualified(n)) {
          fail("unqualified CDI annotation " + n);
          return std::nullopt;
        }
      }
      return names;
    }
    for (const std::string& name : mount_names()) {
      const auto parts = split(name, '/');
      if (parts.size() == 4 && parts[0] == "cdi") names.push_back(parts[1] + "/" + parts[2] + "=" + parts[3]);
    }
    if (!names.empty()) return names;
    if (!spec_.cap_sys_admin && !config_.envvar_when_unprivileged) return std::nullopt;
    from_env = true;
    const auto value = var("NVIDIA_VISIBLE_DEVICES");
    return value ? visible_devices(tokens_of(*value)) : std::nullopt;
  }

  // JIT names, registry names, never both (cdi.go:61-72).
  void route(const std::vector<std::string>& names) {
    const auto jit_kind = [](const std::string& n) { return n.starts_with(std::string(kJitKind) + "="); };
    if (std::any_of(names.begin(), names.end(), jit_kind)) {
      if (!std::all_of(names.begin(), names.end(), jit_kind)) {
        fail("JIT and registry CDI names mixed (cdi.go:61-64)");
        return;
      }
      std::vector<std::string> ids;
      ids.reserve(names.size());
      for (const std::string& n : names) ids.push_back(n.substr(kJitKind.size() + 1));
      jit_ids(ids);
      if (!given_.fails) imex(false, true);
      return;
    }
    for (const std::string& name : names) {
      if (name.starts_with(std::string(kManagementKind) + "=")) {
        // Every GPU's node and every IMEX channel (pkg/nvcdi/management.go:96-108).
        for (const discovery::Gpu& gpu : node_.gpus) {
          given_.gpu_nodes.insert(gpu.minor);
          given_.gpus.insert(gpu.uuid);
          for (const auto& mig : gpu.mig_devices) given_.cap_nodes.insert(mig.cap_minors.begin(), mig.cap_minors.end());
        }
        given_.imex.insert(node_.imex_channels.begin(), node_.imex_channels.end());
        continue;
      }
      if (!registry({name})) return;
    }
  }

  // jit-cdi and csv (cdi.go:116-132, 243-293; pkg/nvcdi/lib-nvml.go:65-212): unqualified ids become the JIT
  // kind's; "" is none from 1.18.2, and dropped before it, where no id left means every GPU (#1555).
  void jit(bool csv) {
    bool from_env = false;
    const auto list = requests(false, from_env);
    if (!list) return;
    if (csv && !at_least({1, 19, 0})) {
      // 1.14 to 1.18: any request but void is the whole CSV spec (internal/modifier/csv.go NewCSVModifier).
      for (const discovery::Gpu& gpu : node_.gpus) add_gpu(gpu);
      return;
    }
    if (csv && node_.gpus.size() <= 1) {
      // 1.19 and later, one device or no NVML: only all and 0 are read, each the whole spec (csv.go).
      for (const std::string& id : *list) {
        if (!id.empty() && id != "all" && id != "0") {
          fail("unsupported device id " + id + " (csv.go)");
          return;
        }
      }
      for (const discovery::Gpu& gpu : node_.gpus) add_gpu(gpu);
      return;
    }
    std::vector<std::string> names;
    for (std::string id : *list) {
      if (id.empty()) {
        if (!at_least({1, 18, 2}) || csv) continue;  // dropped (1.18.0-1.18.1); csv: mode=csv,id= is all
        id = "none";
      }
      std::string name = qualified(id) ? id : std::string(kJitKind) + "=" + id;
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
    }
    if (names.empty()) {
      // GetSpec with no ids is all (wrapper.go:52-55).
      for (const discovery::Gpu& gpu : node_.gpus) add_gpu(gpu);
      imex(false, true);
      return;
    }
    route(names);
  }

  // NVML ids in order: the first none is nothing else, the first all every GPU (its MIG devices where MIG is
  // on); else each index, i:j or UUID; any other fails (lib-nvml.go:65-212).
  void jit_ids(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      if (id == "none") {
        if (at_least({1, 18, 2})) return;
        fail("identifier none is not a valid UUID or index (before 1.18.2)");
        return;
      }
      if (id == "all") {
        for (const discovery::Gpu& gpu : node_.gpus) {
          if (gpu.mig_devices.empty()) {
            add_gpu(gpu);
          } else {
            for (const auto& mig : gpu.mig_devices) add_mig(gpu, mig.uuid);
          }
        }
        return;
      }
    }
    for (const std::string& id : ids) {
      bool found = false;
      for (const discovery::Gpu& gpu : node_.gpus) {
        if (id == gpu.uuid) {
          add_gpu(gpu);
          found = true;
        }
        for (const auto& mig : gpu.mig_devices) {
          if (id == mig.uuid) {
            add_mig(gpu, mig.uuid);
            found = true;
          }
        }
      }
      if (!found && !index_select(id)) {
        fail("identifier " + id + " is not a valid UUID or index (lib-nvml.go:163-212)");
        return;
      }
    }
  }

  // What the spec itself holds: device nodes the runtime's CDI injection or device specs put there, and
  // device cgroup rules, with which a container holding CAP_MKNOD (the runtime's default) makes any node
  // they allow.
  void spec_devices() {
    for (const enforcement::Device& device : spec_.devices) {
      if (device.major == kNvidiaMajor && device.minor >= 0 && device.minor < 254) {
        given_.gpu_nodes.insert(static_cast<unsigned>(device.minor));
      } else {
        node_path(device.path);
      }
    }
    for (const auto& [major, minor] : spec_.cgroup_allows) {
      if (major && *major != kNvidiaMajor) continue;
      for (const discovery::Gpu& gpu : node_.gpus) {
        if (!minor || *minor == gpu.minor) given_.gpu_nodes.insert(gpu.minor);
      }
    }
    if (spec_.every_device) {
      for (const discovery::Gpu& gpu : node_.gpus) add_gpu(gpu);
    }
    for (const discovery::Gpu& gpu : node_.gpus) {
      if (given_.gpu_nodes.contains(gpu.minor) && gpu.mig_devices.empty()) given_.gpus.insert(gpu.uuid);
    }
  }

  const Spec& spec_;
  const Config& config_;
  const Node& node_;
  std::map<std::string, std::string> env_;
  std::string mode_;
  Given given_;
};

}  // namespace

Given gives(const Spec& spec, const Config& config, const Node& node) { return Reading(spec, config, node).run(); }

}  // namespace gpuguard::test::toolkit

// The node report's facts and verdict (report.hpp). The toolkit's behaviour by mode, version and value is
// in docs/security.md ("The node decides"), each cell with its source; this file is that table in code.
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 0
// toml++ 3.3 asserts, in parse_key, a precondition that malformed input breaks (a table header cut
// short), and checks it again right after to report a parse error; with NDEBUG the assertion becomes an
// optimiser assumption under clang. The fuzzer found it. Its assertions are off here in every build, and
// NDEBUG is hidden from it, so that its own error path decides and no build assumes what input breaks.
#define TOML_ASSERT(expr) static_cast<void>(0)
#pragma push_macro("NDEBUG")
#undef NDEBUG
#include <toml++/toml.h>
#pragma pop_macro("NDEBUG")
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <tuple>

#include "go_buildinfo.hpp"
#include "gpuguard/nodereport/report.hpp"
#include "rpm_database.hpp"

namespace gpuguard::nodereport {
namespace {

constexpr std::string_view kToolkitConfig = "/etc/nvidia-container-runtime/config.toml";
constexpr std::string_view kDpkgStatus = "/var/lib/dpkg/status";
constexpr std::string_view kContainerdConfig = "/etc/containerd/config.toml";
constexpr std::string_view kCrioConfig = "/etc/crio/crio.conf";
constexpr std::string_view kCrioDropIns = "/etc/crio/crio.conf.d";
constexpr std::size_t kCrioDropInsMax = 256;
constexpr int kCrioDropInsDepth = 8;

using Version = std::tuple<int, int, int>;

// "1.18.1-1", "1.18.0~rc.2-1" or "1:1.17.8-1": the upstream version's first three numbers.
std::optional<Version> parse_version(std::string_view text) {
  if (const auto colon = text.find(':'); colon != std::string_view::npos) text.remove_prefix(colon + 1);
  std::array<int, 3> parts{};
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parts[i]);
    if (ec != std::errc{}) return std::nullopt;
    text.remove_prefix(static_cast<std::size_t>(end - text.data()));
    if (i + 1 < parts.size()) {
      if (!text.starts_with('.')) return std::nullopt;
      text.remove_prefix(1);
    }
  }
  return Version{parts[0], parts[1], parts[2]};
}

std::string upstream_version(std::string_view text) {
  if (const auto colon = text.find(':'); colon != std::string_view::npos) text.remove_prefix(colon + 1);
  return std::string(text.substr(0, text.rfind('-')));
}

std::string basename_of(std::string_view path) {
  const auto slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

std::string directory_of(std::string_view path) {
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? std::string(".") : std::string(path.substr(0, slash));
}

bool is_nvidia_runtime(std::string_view binary) { return basename_of(binary).starts_with("nvidia-container-runtime"); }

// The mode a runtime binary forces, whatever the config says: NVIDIA ships .cdi and .legacy variants.
std::string forced_mode(std::string_view binary) {
  const std::string name = basename_of(binary);
  if (name == "nvidia-container-runtime.cdi") return "cdi";
  if (name == "nvidia-container-runtime.legacy") return "legacy";
  return "";
}

class Judge {
 public:
  Judge(const HostFiles& host, std::string_view value) : host_(host) { report_.value = std::string(value); }

  Report run() {
    read_runtime();  // first: where NVIDIA's runtime is installed says where its config and version are
    read_runtime_binary();
    read_toolkit_config();
    read_toolkit_version();
    read_tegra();
    read_cdi_specs();
    resolve_mode();
    decide();
    judge_hardening();
    add_findings();
    return std::move(report_);
  }

 private:
  Facts& facts() { return report_.facts; }

  void find(Severity severity, std::string code, std::string message, std::string file = {}, int line = 0) {
    report_.findings.push_back({severity, std::move(code), std::move(message), std::move(file), line});
  }

  // A file that is there and does not parse is a finding, with `then` saying what follows from it, and
  // why it does not parse in `why` where given.
  std::optional<toml::table> parse_toml(const std::string& path, std::string_view then = "read as if it were absent",
                                        std::string* why = nullptr) {
    auto text = host_.read(path);
    if (!text) return std::nullopt;
    // toml++ 3.3's Unicode tables reach __builtin_unreachable for some characters (the fuzzer found
    // U+0100 and others), so no byte outside ASCII reaches it: each is read as '?'. TOML allows them only
    // in comments and strings, and no value read here (modes, handler names, paths) holds one.
    std::replace_if(
        text->begin(), text->end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; }, '?');
    toml::parse_result parsed = toml::parse(*text, path);
    if (!parsed) {
      const auto& error = parsed.error();
      const std::string reason =
          std::string(error.description()) + " (line " + std::to_string(error.source().begin.line) + ")";
      find(Severity::warning, "malformed-file", path + ": " + reason + "; " + std::string(then), path,
           static_cast<int>(error.source().begin.line));
      if (why != nullptr) *why = reason;
      return std::nullopt;
    }
    return std::move(parsed).table();
  }

  // The directory of NVIDIA's runtime when it is installed outside the package's /usr/bin: the GPU
  // Operator's toolkit container copies it, its libraries and its config to one directory
  // (/usr/local/nvidia/toolkit by default), and a wrapper points the runtime at the config there.
  std::optional<std::string> toolkit_install_dir() const {
    const std::string& binary = report_.facts.nvidia_runtime_binary;
    if (!binary.starts_with('/')) return std::nullopt;
    const std::string dir = directory_of(binary);
    if (dir == "/usr/bin" || dir == "/usr/local/bin" || dir == "/bin") return std::nullopt;
    return dir;
  }

  void read_toolkit_config() {
    std::string path(kToolkitConfig);
    if (!wrapper_config_.empty()) {
      path = wrapper_config_;  // what the GPU Operator's wrapper points the runtime at
    } else if (const auto dir = toolkit_install_dir()) {
      if (const std::string installed = *dir + "/.config/nvidia-container-runtime/config.toml"; host_.exists(installed))
        path = installed;
    }
    facts().read_files.push_back(path);
    const auto config = parse_toml(path);
    if (!config) return;
    facts().toolkit_config = true;
    facts().toolkit_config_file = path;
    const toml::table& t = *config;
    facts().envvar_when_unprivileged =
        t["accept-nvidia-visible-devices-envvar-when-unprivileged"].value_or(facts().envvar_when_unprivileged);
    facts().volume_mounts = t["accept-nvidia-visible-devices-as-volume-mounts"].value_or(facts().volume_mounts);
    const auto runtime = t["nvidia-container-runtime"];
    facts().mode = runtime["mode"].value_or(facts().mode);
    const auto cdi = runtime["modes"]["cdi"];
    facts().default_kind = cdi["default-kind"].value_or(facts().default_kind);
    if (const toml::array* dirs = cdi["spec-dirs"].as_array()) {
      facts().spec_dirs.clear();
      for (const auto& dir : *dirs) {
        if (const auto text = dir.value<std::string>()) facts().spec_dirs.push_back(*text);
      }
    }
    if (const toml::array* prefixes = cdi["annotation-prefixes"].as_array()) {
      facts().annotation_prefixes.clear();
      for (const auto& prefix : *prefixes) {
        if (const auto text = prefix.value<std::string>()) facts().annotation_prefixes.push_back(*text);
      }
    }
    // A comma-separated list, each name trimmed of white space (internal/config/image/builder.go:
    // strings.TrimSpace, which also trims U+0085 and U+00A0; ASCII white space here).
    std::string_view swarm = t["swarm-resource"].value_or(std::string_view{});
    constexpr std::string_view kSpace = " \t\n\r\v\f";
    while (!swarm.empty()) {
      const std::size_t comma = swarm.find(',');
      std::string_view name = swarm.substr(0, comma);
      while (!name.empty() && kSpace.find(name.front()) != std::string_view::npos) name.remove_prefix(1);
      while (!name.empty() && kSpace.find(name.back()) != std::string_view::npos) name.remove_suffix(1);
      if (!name.empty()) facts().swarm_variables.emplace_back(name);
      swarm = comma == std::string_view::npos ? std::string_view{} : swarm.substr(comma + 1);
    }
  }

  // The package database: the version of nvidia-container-toolkit-base, or of nvidia-container-toolkit.
  // Else, in the GPU Operator's install directory, the name of the libnvidia-container it copied there
  // (libnvidia-container.so.1.17.8): the toolkit's packages require the libnvidia-container of their own
  // version.
  void read_toolkit_version() {
    if (!runtime_executable_.empty()) {
      if (auto version = toolkit_version_of_binary(host_, runtime_executable_)) {
        facts().toolkit_version = std::move(version);
        facts().toolkit_version_source = runtime_executable_;
        return;
      }
    }
    const auto dir = toolkit_install_dir();
    // The package database says what a package installed: the version of what runs only where the runtime
    // binary is the package's own.
    if (!dir) {
      read_dpkg_version();
      if (!facts().toolkit_version) read_rpm_version();
      return;
    }
    constexpr std::string_view kLibrary = "libnvidia-container.so.";
    for (const std::string& name : host_.list(*dir)) {
      if (!name.starts_with(kLibrary)) continue;
      const std::string version = name.substr(kLibrary.size());
      if (version.starts_with("1.") && parse_version(version)) {
        facts().toolkit_version = version;
        facts().toolkit_version_source = *dir + "/" + name;
        return;
      }
    }
  }

  // rpm 4.16 and later keep their database in SQLite; Fedora and openSUSE under /usr/lib/sysimage.
  void read_rpm_version() {
    for (const std::string path : {"/var/lib/rpm/rpmdb.sqlite", "/usr/lib/sysimage/rpm/rpmdb.sqlite"}) {
      if (!host_.exists(path)) continue;
      const RpmLookup lookup =
          find_rpm_packages(host_, path, {"nvidia-container-toolkit-base", "nvidia-container-toolkit"});
      if (!lookup.error.empty()) {
        find(Severity::warning, "unreadable-package-database",
             path + ": " + lookup.error + "; the toolkit's version is not known from it", path);
        continue;
      }
      const RpmPackage* found = nullptr;
      for (const RpmPackage& package : lookup.packages) {
        if (found == nullptr || package.name == "nvidia-container-toolkit-base") found = &package;
      }
      if (found != nullptr) {
        facts().toolkit_version = found->version;
        facts().toolkit_version_source = path;
        return;
      }
    }
  }

  void read_dpkg_version() {
    const std::string path(kDpkgStatus);
    const auto status = host_.read(path);
    if (!status) return;
    std::string package, state, version;
    std::optional<std::string> base, toolkit;
    const auto end_stanza = [&] {
      if (state.find(" installed") != std::string::npos || state.ends_with("installed")) {
        if (package == "nvidia-container-toolkit-base") base = version;
        if (package == "nvidia-container-toolkit") toolkit = version;
      }
      package.clear();
      state.clear();
      version.clear();
    };
    std::string_view rest = *status;
    while (!rest.empty()) {
      const auto newline = rest.find('\n');
      const std::string_view line = rest.substr(0, newline);
      rest = newline == std::string_view::npos ? std::string_view{} : rest.substr(newline + 1);
      if (line.empty()) {
        end_stanza();
      } else if (line.starts_with("Package: ")) {
        package = std::string(line.substr(9));
      } else if (line.starts_with("Status: ")) {
        state = std::string(line.substr(8));
      } else if (line.starts_with("Version: ")) {
        version = std::string(line.substr(9));
      }
    }
    end_stanza();
    if (const auto& found = base ? base : toolkit) {
      facts().toolkit_version = upstream_version(*found);
      facts().toolkit_version_source = path;
    }
  }

  // Later tables win key by key, as containerd merges its imports and CRI-O its drop-ins.
  static void merge(toml::table& into, const toml::table& from) {
    for (const auto& [key, node] : from) {
      toml::table* target = into[key].as_table();
      if (target != nullptr && node.is_table()) {
        merge(*target, *node.as_table());
      } else {
        into.insert_or_assign(key, node);
      }
    }
  }

  // A path of containerd's `imports`: absolute or relative to the main file, a `*` allowed in its name.
  std::vector<std::string> expand_import(const std::string& pattern, const std::string& main_file) {
    const std::string path = pattern.starts_with('/') ? pattern : directory_of(main_file) + "/" + pattern;
    const std::string name = basename_of(path);
    const auto star = name.find('*');
    if (star == std::string::npos) return {path};
    const std::string prefix = name.substr(0, star), suffix = name.substr(star + 1);
    std::vector<std::string> matches;
    for (const std::string& file : host_.list(directory_of(path))) {
      if (file.size() >= prefix.size() + suffix.size() && file.starts_with(prefix) && file.ends_with(suffix)) {
        matches.push_back(directory_of(path) + "/" + file);
      }
    }
    return matches;
  }

  // One of the container runtime's files, parsed; when it is there but does not parse, the first such is
  // recorded, and the report cannot judge (decide).
  std::optional<toml::table> parse_runtime_config(const std::string& path) {
    std::string why = "it cannot be read";
    auto table = parse_toml(path, "the container runtime's configuration cannot be judged", &why);
    if (table) {
      facts().runtime_config_files.push_back(path);
    } else if (host_.exists(path)) {
      facts().runtime_config_files.push_back(path);
      if (facts().runtime_config_unreadable.empty()) facts().runtime_config_unreadable = path + ": " + why;
    }
    return table;
  }

  void read_runtime() {
    const std::string containerd_path(kContainerdConfig);
    if (host_.exists(containerd_path)) {
      facts().container_runtime = "containerd";
      auto config = parse_runtime_config(containerd_path);
      if (!config) return;
      // Copied first: merging an imported file that has imports of its own replaces the array.
      std::vector<std::string> imports;
      if (const toml::array* listed = (*config)["imports"].as_array()) {
        for (const auto& entry : *listed) imports.push_back(entry.value_or(std::string()));
      }
      for (const std::string& pattern : imports) {
        for (const std::string& file : expand_import(pattern, containerd_path)) {
          if (auto imported = parse_runtime_config(file)) merge(*config, *imported);
        }
      }
      read_containerd(*config);
      return;
    }
    toml::table crio;
    std::vector<std::string> files = {std::string(kCrioConfig)};
    std::size_t budget = kCrioDropInsMax;
    crio_drop_ins(std::string(kCrioDropIns), 0, budget, files);
    for (const std::string& file : files) {
      if (auto part = parse_runtime_config(file)) merge(crio, *part);
    }
    // CRI-O is configured where any of its files is there, read or not.
    if (!facts().runtime_config_files.empty() || !facts().runtime_config_unreadable.empty()) {
      facts().container_runtime = "cri-o";
      read_crio(crio);
    }
  }

  // CRI-O's drop-ins as it walks them (pkg/config UpdateFromPath: filepath.Walk, every file whatever its
  // name, directories entered in their place in lexical order, links to directories not followed), up to
  // kCrioDropInsMax entries and kCrioDropInsDepth levels; past them the configuration cannot be judged, and
  // the walk stops. Each directory is read again when it changes (read_files).
  void crio_drop_ins(const std::string& directory, int depth, std::size_t& budget, std::vector<std::string>& files) {
    facts().read_files.push_back(directory);
    std::vector<std::pair<std::string, bool>> entries;  // name, is a directory
    for (std::string& name : host_.list(directory)) entries.emplace_back(std::move(name), false);
    for (std::string& name : host_.subdirectories(directory)) entries.emplace_back(std::move(name), true);
    std::sort(entries.begin(), entries.end());
    for (const auto& [name, is_directory] : entries) {
      if (!facts().runtime_config_unreadable.empty()) return;
      std::string path = directory;
      path.append("/").append(name);
      if (budget == 0 || (is_directory && depth + 1 >= kCrioDropInsDepth)) {
        facts().runtime_config_unreadable = path + ": past the " + std::to_string(kCrioDropInsMax) + " entries and " +
                                            std::to_string(kCrioDropInsDepth) + " levels of drop-ins this reads";
        return;
      }
      --budget;
      if (is_directory) {
        crio_drop_ins(path, depth + 1, budget, files);
      } else {
        files.push_back(path);
      }
    }
  }

  void read_containerd(const toml::table& config) {
    const std::int64_t version = config["version"].value_or(std::int64_t{1});
    const auto cri = version >= 3   ? config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
                     : version == 2 ? config["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
                                    : config["plugins"]["cri"]["containerd"];
    facts().default_runtime = cri["default_runtime_name"].value_or(std::string("runc"));
    if (const toml::table* runtimes = cri["runtimes"].as_table()) {
      for (const auto& [name, runtime] : *runtimes) {
        const std::string binary = toml::node_view<const toml::node>(runtime)["options"]["BinaryName"].value_or(
            std::string(name.str()) == "runc" ? std::string("runc") : std::string());
        handler(std::string(name.str()), binary.empty() ? "runc" : binary);
      }
    }
    if (facts().default_runtime_binary.empty()) facts().default_runtime_binary = "runc";
  }

  void read_crio(const toml::table& config) {
    const auto runtime = config["crio"]["runtime"];
    facts().default_runtime = runtime["default_runtime"].value_or(std::string("crun"));
    if (const toml::table* runtimes = runtime["runtimes"].as_table()) {
      for (const auto& [name, entry] : *runtimes) {
        // Without runtime_path CRI-O looks the handler's name up in PATH.
        handler(std::string(name.str()),
                toml::node_view<const toml::node>(entry)["runtime_path"].value_or(std::string(name.str())));
      }
    }
    if (facts().default_runtime_binary.empty()) facts().default_runtime_binary = facts().default_runtime;
  }

  void handler(const std::string& name, const std::string& binary) {
    if (is_nvidia_runtime(binary)) {
      facts().nvidia_handlers.push_back(name);
      if (facts().nvidia_runtime_binary.empty()) facts().nvidia_runtime_binary = binary;
    }
    if (name == facts().default_runtime) {
      facts().default_runtime_binary = binary;
      facts().default_is_nvidia = is_nvidia_runtime(binary);
      if (facts().default_is_nvidia) facts().nvidia_runtime_binary = binary;
    }
  }

  // NVIDIA's runtime binary, as the container runtime's configuration names it. The GPU Operator names a
  // shell script that starts the real binary with the configuration's path in its environment
  // (cmd/nvidia-ctk-installer/toolkit/installer/executables.go: NVIDIA_CTK_CONFIG_FILE_PATH from 1.18,
  // XDG_CONFIG_HOME before): the script is followed to the binary it starts, and its configuration.
  void read_runtime_binary() {
    const std::string& binary = facts().nvidia_runtime_binary;
    if (!binary.starts_with('/')) return;
    facts().read_files.push_back(binary);
    runtime_executable_ = binary;
    const auto head = host_.read_range(binary, 0, 8192);
    if (!head || !head->starts_with("#!")) return;
    std::string_view script = *head;
    while (!script.empty()) {
      const std::size_t newline = script.find('\n');
      std::string_view line = script.substr(0, newline);
      script = newline == std::string_view::npos ? std::string_view{} : script.substr(newline + 1);
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
      while (!line.empty() && (line.back() == ' ' || line.back() == '\\')) line.remove_suffix(1);
      const auto value_of = [&](std::string_view key) -> std::optional<std::string> {
        if (!line.starts_with(key)) return std::nullopt;
        std::string_view value = line.substr(key.size());
        if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front()) {
          value = value.substr(1, value.size() - 2);
        }
        return std::string(value);
      };
      if (auto config = value_of("NVIDIA_CTK_CONFIG_FILE_PATH=")) {
        wrapper_config_ = *config;
      } else if (auto home = value_of("XDG_CONFIG_HOME=")) {
        if (wrapper_config_.empty()) wrapper_config_ = *home + "/nvidia-container-runtime/config.toml";
      } else if (line.starts_with('/') && line.find(' ') == std::string_view::npos && line.ends_with(".real")) {
        runtime_executable_ = std::string(line);
      }
    }
    facts().read_files.push_back(runtime_executable_);
  }

  // Tegra as the toolkit tells it (go-nvlib's info: /etc/nv_tegra_release, or a soc0 family of tegra).
  void read_tegra() {
    const auto family = host_.read("/sys/devices/soc0/family");
    std::string lower = family.value_or("");
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    facts().tegra = host_.exists("/etc/nv_tegra_release") || lower.starts_with("tegra");
  }

  void read_cdi_specs() {
    for (const std::string& dir : facts().spec_dirs) {
      for (const std::string& name : host_.list(dir)) {
        if (!name.ends_with(".yaml") && !name.ends_with(".yml") && !name.ends_with(".json")) continue;
        std::string path = dir;
        path.append("/").append(name);
        const auto text = host_.read(path);
        if (!text) continue;
        facts().cdi_spec_files.push_back(path);
        try {
          const YAML::Node spec = YAML::Load(*text);
          if (spec["kind"].as<std::string>("") != facts().default_kind) continue;
          for (const YAML::Node& device : spec["devices"]) {
            const std::string device_name = device["name"].as<std::string>("");
            facts().gpu_devices.push_back(facts().default_kind + "=" + device_name);
            if (device_name == "none") facts().none_device = true;
          }
        } catch (const YAML::Exception& e) {
          find(Severity::warning, "malformed-file", path + ": " + e.msg + "; its devices are not counted", path,
               e.mark.is_null() ? 0 : e.mark.line + 1);
        }
      }
    }
  }

  // `auto` as the toolkit resolves it (internal/info/auto.go): csv on Tegra; jit-cdi from 1.18.0, with or
  // without a driver; legacy before it. Nothing here depends on whether the driver is loaded yet.
  void resolve_mode() {
    const std::string forced = forced_mode(facts().nvidia_runtime_binary);
    facts().runtime_mode = forced.empty() ? facts().mode : forced;
    if (facts().runtime_mode != "auto") {
      facts().resolved_mode = facts().runtime_mode;
      return;
    }
    if (facts().tegra) {
      facts().resolved_mode = "csv";
      return;
    }
    const auto version = facts().toolkit_version ? parse_version(*facts().toolkit_version) : std::nullopt;
    if (!version) {
      facts().resolved_mode = "";  // legacy before 1.18.0, jit-cdi from it: the version decides
    } else {
      facts().resolved_mode = *version < Version{1, 18, 0} ? "legacy" : "jit-cdi";
    }
  }

  // The container runtime's configuration does not parse: which handler creates containers is not known.
  bool cannot_judge() {
    if (facts().runtime_config_unreadable.empty()) return false;
    report_.verdict = Verdict::cannot_judge;
    report_.reason = "cannot judge: the " + facts().container_runtime + " configuration " +
                     facts().runtime_config_unreadable +
                     ", so which runtime handler creates containers, and what the value does there, is not known";
    return true;
  }

  void decide() {
    Report& r = report_;
    if (cannot_judge()) return;
    if (!facts().default_is_nvidia) {
      r.verdict = Verdict::not_acted_on;
      r.reason = facts().container_runtime.empty()
                     ? "no containerd or CRI-O configuration: their default runtime is not NVIDIA's"
                     : "the default runtime handler '" + facts().default_runtime + "' runs " +
                           facts().default_runtime_binary + ", not NVIDIA's runtime";
      for (const std::string& name : facts().nvidia_handlers) {
        r.doors.push_back("a pod with runtimeClassName for the handler '" + name +
                          "', which runs NVIDIA's runtime: the variable decides there");
      }
      if (!facts().gpu_devices.empty()) {
        r.doors.push_back("CDI devices the CRI injects (a device plugin's or a DRA driver's allocations): " +
                          std::to_string(facts().gpu_devices.size()) + " GPU devices in the specs");
      }
      r.doors.push_back("a privileged container, which sees every device node");
      return;
    }
    if (!facts().envvar_when_unprivileged) {
      r.verdict = Verdict::honoured;
      r.reason =
          "NVIDIA's runtime ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers "
          "(accept-nvidia-visible-devices-envvar-when-unprivileged = false); a privileged one still sees every GPU";
      return;
    }
    const std::string& mode = facts().resolved_mode;
    const bool none = r.value == "none";
    if (mode == "legacy") {
      r.verdict = Verdict::honoured;
      r.reason = none ? "legacy mode: none gives no GPU (the driver's libraries are still mounted)"
                      : "legacy mode: void sets nothing up for the container";
    } else if (mode == "csv") {
      // Every CSV device for any request but void, none included, in every version (1.14 to 1.18:
      // internal/modifier/csv.go; 1.19 and later: through the JIT path, where an empty id is every device).
      r.verdict = none ? Verdict::leaks : Verdict::honoured;
      r.reason = none ? "csv mode: none is a device request, and csv mode gives every device for any request"
                      : "csv mode: void is no device request";
    } else if (mode == "cdi") {
      if (!none) {
        r.verdict = Verdict::honoured;
        r.reason = "cdi mode: void is no device request";
      } else if (facts().none_device) {
        r.verdict = Verdict::honoured;
        r.reason = "cdi mode: none names the CDI device " + facts().default_kind + "=none, which the specs define";
      } else {
        r.verdict = Verdict::breaks_pods;
        r.reason = "cdi mode: none names the CDI device " + facts().default_kind +
                   "=none, which no spec defines, so creating any container without a GPU fails "
                   "(unresolvable CDI devices)";
      }
    } else if (mode == "jit-cdi") {
      const auto version = parse_version(facts().toolkit_version.value_or(""));
      if (!none) {
        r.verdict = Verdict::honoured;
        r.reason = "jit-cdi mode: void is no device request";
      } else if (version && *version >= Version{1, 18, 2}) {
        r.verdict = Verdict::honoured;
        r.reason = "jit-cdi mode on " + *facts().toolkit_version + ": none gives no GPU (fixed in 1.18.2)";
      } else {
        r.verdict = Verdict::leaks;
        r.reason = version ? "jit-cdi mode on " + *facts().toolkit_version +
                                 ": none is read as all (NVIDIA/nvidia-container-toolkit#1555, fixed in 1.18.2)"
                           : "jit-cdi mode, toolkit version unknown: on 1.18.0 and 1.18.1 none is read as all "
                             "(NVIDIA/nvidia-container-toolkit#1555); it cannot be ruled out";
      }
    } else if (mode.empty()) {
      // auto with no version: legacy or jit-cdi.
      r.verdict = none ? Verdict::leaks : Verdict::honoured;
      r.reason = none ? "mode auto and no toolkit version in the package database: it is jit-cdi from 1.18.0, "
                        "where 1.18.0 and 1.18.1 read none as all; it cannot be ruled out"
                      : "void is no device request in every mode";
    } else {
      r.verdict = none ? Verdict::leaks : Verdict::honoured;
      r.reason = "mode '" + mode + "' is not one this report knows; void is no device request in every mode known";
      find(Severity::warning, "unknown-mode", "the toolkit's mode '" + mode + "' is not one this report knows",
           std::string(kToolkitConfig));
    }
  }

  void judge_hardening() {
    const Facts& f = facts();
    const bool nvidia_used = f.default_is_nvidia || !f.nvidia_handlers.empty();
    if (!f.runtime_config_unreadable.empty()) {
      report_.hardened = false;
      report_.hardening =
          "the container runtime's configuration cannot be read, so whether NVIDIA's runtime reads "
          "containers' environments is not known";
    } else if (!nvidia_used) {
      report_.hardened = true;
      report_.hardening = "no runtime handler runs NVIDIA's runtime: no container's environment selects GPUs";
    } else if (!f.envvar_when_unprivileged) {
      report_.hardened = true;
      report_.hardening =
          "NVIDIA's runtime ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers "
          "(accept-nvidia-visible-devices-envvar-when-unprivileged = false): GPU containers get theirs through "
          "device lists or CDI, and a container created while the node enforcer does not answer gets none by its "
          "environment";
    } else {
      report_.hardened = false;
      report_.hardening =
          "NVIDIA's runtime reads NVIDIA_VISIBLE_DEVICES in unprivileged containers: where the node enforcer does "
          "not answer, a container's environment decides (docs/security.md#harden-the-nodes-the-nvidia-toolkit)";
    }
  }

  void add_findings() {
    const Facts& f = facts();
    const auto version = parse_version(f.toolkit_version.value_or(""));
    if (f.default_is_nvidia) {
      find(Severity::warning, "nvidia-default-runtime",
           "every container runs through NVIDIA's runtime (default handler '" + f.default_runtime +
               "'), so NVIDIA_VISIBLE_DEVICES decides what each sees; the GPU Operator's CDI setup does not need it",
           f.runtime_config_files.empty() ? std::string() : f.runtime_config_files.back());
    }
    const bool nvidia_used = f.default_is_nvidia || !f.nvidia_handlers.empty();
    if (nvidia_used && f.envvar_when_unprivileged) {
      find(Severity::warning, "envvar-when-unprivileged",
           "accept-nvidia-visible-devices-envvar-when-unprivileged is true: any unprivileged container that reaches "
           "NVIDIA's runtime can ask for every GPU by its environment",
           std::string(kToolkitConfig));
    }
    if (nvidia_used && f.volume_mounts) {
      // The hardening security.md recommends (with the variable refused from unprivileged containers), so
      // not a warning: the door it opens is one the webhook closes.
      find(Severity::info, "volume-mounts-accepted",
           "accept-nvidia-visible-devices-as-volume-mounts is true: NVIDIA's runtime takes a container's device "
           "list from the host's /dev/null mounted under /var/run/nvidia-container-devices before its "
           "environment, so a hostPath volume of /dev/null mounted at /var/run/nvidia-container-devices/all "
           "asks for every GPU; the webhook's hostDeviceMounts judges hostPath mounts of /dev/null",
           std::string(kToolkitConfig));
    }
    if (f.resolved_mode == "jit-cdi" && version && *version >= Version{1, 18, 0} && *version < Version{1, 18, 2}) {
      find(Severity::critical, "known-bad-version",
           "toolkit " + *f.toolkit_version +
               " in jit-cdi mode reads NVIDIA_VISIBLE_DEVICES=none as all; upgrade to "
               "1.18.2 or later",
           f.toolkit_version_source);
    }
    if (report_.value == "none" && f.resolved_mode == "cdi" && !f.none_device && f.default_is_nvidia) {
      find(Severity::critical, "no-none-device",
           "cdi mode with no CDI device " + f.default_kind +
               "=none: every container without a GPU fails to start "
               "under none; inject void instead, or add a device named none with empty edits");
    }
    if (nvidia_used && !f.toolkit_version) {
      find(Severity::info, "toolkit-version-unknown",
           "no nvidia-container-toolkit package in " + std::string(kDpkgStatus) +
               ", the rpm database (SQLite) or beside the runtime binary (an rpm database in BerkeleyDB or ndb "
               "is not read): the version-dependent checks are off");
    }
    if (version) {
      const bool uses_cdi = f.resolved_mode == "cdi" || f.resolved_mode == "jit-cdi";
      for (const auto& fix : kSecurityFixes) {
        if (*version < fix.fixed && !(fix.cdi_unaffected && uses_cdi)) {
          find(Severity::critical, "missing-security-fix",
               std::string(fix.cve) + " is fixed in " + std::string(fix.fixed_text) + ", this node runs " +
                   *f.toolkit_version + ": " + std::string(fix.what),
               f.toolkit_version_source);
        }
      }
    }
  }

  // The toolkit's security fixes, each as NVIDIA states it in its own CVE record (NVIDIA is the CVE
  // numbering authority for its products; the record names the affected versions and links the bulletin).
  struct SecurityFix {
    std::string_view cve;
    Version fixed;
    std::string_view fixed_text;
    bool cdi_unaffected;  // the record says modes that use CDI are not affected
    std::string_view what;
  };
  static constexpr std::array<SecurityFix, 2> kSecurityFixes{{
      {"CVE-2024-0132", Version{1, 16, 2}, "1.16.2", true,
       "a crafted image may gain access to the host's file system (TOCTOU, default configuration; "
       "NVIDIA security bulletin 5582)"},
      {"CVE-2025-23266", Version{1, 17, 8}, "1.17.8", false,
       "a crafted image may run code with elevated permissions through a hook that initializes the container "
       "(in CDI mode only before 1.17.5)"},
  }};

  const HostFiles& host_;
  std::string runtime_executable_;  // the binary NVIDIA's runtime is: the one named, or what its wrapper starts
  std::string wrapper_config_;      // the configuration a wrapper script points the runtime at
  Report report_;
};

}  // namespace

std::string_view verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::honoured: return "honoured";
    case Verdict::leaks: return "leaks";
    case Verdict::breaks_pods: return "breaks-pods";
    case Verdict::not_acted_on: return "not-acted-on";
    case Verdict::cannot_judge: return "cannot-judge";
  }
  return "";
}

std::string_view severity_name(Severity severity) {
  switch (severity) {
    case Severity::info: return "info";
    case Severity::warning: return "warning";
    case Severity::critical: return "critical";
  }
  return "";
}

Report judge(const HostFiles& host, std::string_view value) { return Judge(host, value).run(); }

}  // namespace gpuguard::nodereport

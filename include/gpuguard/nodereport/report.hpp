#pragma once
// The node report: does the NVIDIA_VISIBLE_DEVICES value the webhook injects (`none` or `void`) keep GPUs
// out of containers on this node? That is decided on the node, by the container runtime's default runtime
// and by NVIDIA's runtime (its mode, version and settings, and the CDI specs it resolves names in), so it
// is judged from the host's files alone. Pure: a HostFiles in, a Report out; nothing is executed or
// written, and a missing or malformed file is a fact or a finding, never an error.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::nodereport {

// Read access to a host's files, by their absolute path on the host.
class HostFiles {
 public:
  virtual ~HostFiles() = default;
  virtual std::optional<std::string> read(const std::string& path) const = 0;
  // Up to `length` bytes from `offset` (fewer at the end); for a file too large to read whole, such as
  // the rpm database.
  virtual std::optional<std::string> read_range(const std::string& path, std::uint64_t offset,
                                                std::size_t length) const = 0;
  // The names of the regular files in a directory, sorted; empty when there is no such directory.
  virtual std::vector<std::string> list(const std::string& directory) const = 0;
  // The names of the directories in a directory, not links to them, sorted; empty when there is no such
  // directory.
  virtual std::vector<std::string> subdirectories(const std::string& directory) const = 0;
  virtual bool exists(const std::string& path) const = 0;
};

enum class Verdict {
  honoured,      // a container without a GPU sees no GPU
  leaks,         // it sees GPUs
  breaks_pods,   // its creation fails
  not_acted_on,  // the variable is not the door on this node; `doors` names the doors there are
  cannot_judge,  // the container runtime's configuration is there but cannot be read: `reason` names it
};
std::string_view verdict_name(Verdict verdict);

enum class Severity { info, warning, critical };
std::string_view severity_name(Severity severity);

struct Finding {
  Severity severity = Severity::info;
  std::string code;  // stable, for alerts: e.g. "known-bad-version", "malformed-file"
  std::string message;
  std::string file;  // the host file it is about, when there is one
  int line = 0;      // 1-based; 0 when not about a line
};

// What was read, as the report states it.
struct Facts {
  // NVIDIA's toolkit: /etc/nvidia-container-runtime/config.toml and the package database, or where the
  // GPU Operator installed it (the directory of the runtime binary the container runtime names).
  bool toolkit_config = false;
  std::string toolkit_config_file;  // the one read
  std::string mode = "auto";        // as configured
  std::string runtime_mode;         // the mode a runtime binary forces, else as configured (auto unresolved)
  std::string resolved_mode;        // what auto comes to for a container that asks by name, or runtime_mode
  bool envvar_when_unprivileged = true;
  bool volume_mounts = false;
  std::string default_kind = "nvidia.com/gpu";
  std::vector<std::string> spec_dirs = {"/etc/cdi", "/var/run/cdi"};
  // Read by the node enforcer, not stated in the report: the annotation prefixes cdi mode reads CDI names
  // from, and swarm-resource's variables, read instead of NVIDIA_VISIBLE_DEVICES when one is set.
  std::vector<std::string> annotation_prefixes = {"cdi.k8s.io/"};
  std::vector<std::string> swarm_variables;
  // "1.18.2", without the package revision: from the Go build information of the runtime binary the
  // container runtime runs (through the GPU Operator's wrapper script to the binary it starts), else from
  // the package database where that binary is the package's, else from the libnvidia-container beside it.
  std::optional<std::string> toolkit_version;
  std::string toolkit_version_source;  // the file it came from
  bool tegra = false;                  // the host has Tegra's files: auto is csv there
  // Every file the facts came from, for a reader that reads them again when one changes.
  std::vector<std::string> read_files;
  // The container runtime: containerd's or CRI-O's configuration, drop-ins included.
  std::string container_runtime;  // "containerd", "cri-o", or "" when neither is configured
  std::vector<std::string> runtime_config_files;
  // "<file>: <why>" for the first of those files that is there and does not parse: which handler runs
  // containers is then unknown, and nothing is guessed in its place (a cannot_judge verdict).
  std::string runtime_config_unreadable;
  std::string default_runtime;         // the CRI's default runtime handler
  std::string default_runtime_binary;  // what that handler runs
  bool default_is_nvidia = false;
  std::vector<std::string> nvidia_handlers;  // runtime handlers that run NVIDIA's runtime
  std::string nvidia_runtime_binary;         // the default handler's when it is NVIDIA's, else the first's
  // CDI specs in the spec directories.
  std::vector<std::string> cdi_spec_files;
  std::vector<std::string> gpu_devices;  // fully qualified, of the default kind
  bool none_device = false;              // a device of the default kind is named "none"
};

struct Report {
  std::string value;  // what the webhook injects: "none" or "void"
  Verdict verdict = Verdict::honoured;
  std::string reason;
  std::vector<std::string> doors;  // under not_acted_on: how containers do reach GPUs on this node
  Facts facts;
  std::vector<Finding> findings;
  // A second line under the node enforcer: an unprivileged container's environment asks NVIDIA's runtime
  // for no GPU on this node (accept-nvidia-visible-devices-envvar-when-unprivileged = false, or no NVIDIA
  // runtime at all), so a container created while the enforcer does not answer still gets none that way.
  bool hardened = false;
  std::string hardening;  // why, in words

  bool value_honoured() const { return verdict == Verdict::honoured || verdict == Verdict::not_acted_on; }
};

Report judge(const HostFiles& host, std::string_view value);

std::string to_json(const Report& report);
std::string to_text(const Report& report);

}  // namespace gpuguard::nodereport

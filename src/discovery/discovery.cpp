#include "gpuguard/discovery/discovery.hpp"

#include <algorithm>
#include <system_error>
#include <tuple>

#include "gpuguard/files/in_root.hpp"
#include "gpuguard/files/read_file.hpp"

namespace gpuguard::discovery {
namespace {

namespace fs = std::filesystem;

std::string_view trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\r\n";
  const std::size_t first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

std::optional<unsigned> to_unsigned(std::string_view text) {
  if (text.empty() || text.size() > 9 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return static_cast<unsigned>(std::stoul(std::string(text)));
}

}  // namespace

fs::path host_path(const fs::path& host_root, std::string_view absolute) {
  // Links that loop lead nowhere on the host either: the path as written, which the kernel refuses too.
  return files::in_root(host_root, absolute).value_or(host_root / fs::path(absolute).relative_path());
}

std::map<std::string, std::string> parse_information(std::string_view text) {
  std::map<std::string, std::string> fields;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    fields.emplace(std::string(trim(line.substr(0, colon))), std::string(trim(line.substr(colon + 1))));
  }
  return fields;
}

std::optional<std::int64_t> numa_node_of(const fs::path& host_root, const std::string& pci_address) {
  // sysfs names PCI devices in lower case; the driver's procfs directories may not be.
  std::string lower = pci_address;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  const auto text = files::read_file(host_path(host_root, "/sys/bus/pci/devices") / lower / "numa_node");
  if (!text) return std::nullopt;
  try {
    const long long node = std::stoll(std::string(trim(*text)));
    if (node < 0) return std::nullopt;
    return node;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::vector<MigCapability> mig_capabilities(const fs::path& host_root, unsigned gpu_minor) {
  // "DeviceFileMinor: 12" among the access file's lines.
  auto cap_minor = [](const fs::path& access) -> std::optional<unsigned> {
    const auto text = files::read_file(access);
    if (!text) return std::nullopt;
    const auto fields = parse_information(*text);
    const auto minor = fields.find("DeviceFileMinor");
    return minor == fields.end() ? std::nullopt : to_unsigned(minor->second);
  };
  // "gi3" -> 3
  auto instance = [](const fs::path& dir, std::string_view prefix) -> std::optional<unsigned> {
    const std::string name = dir.filename().string();
    if (!name.starts_with(prefix)) return std::nullopt;
    return to_unsigned(std::string_view(name).substr(prefix.size()));
  };
  std::vector<MigCapability> found;
  std::error_code ec;
  const fs::path mig =
      host_path(host_root, "/proc/driver/nvidia/capabilities") / ("gpu" + std::to_string(gpu_minor)) / "mig";
  for (const auto& gi_dir : fs::directory_iterator(mig, ec)) {
    const auto gi = instance(gi_dir.path(), "gi");
    const auto gi_minor = gi ? cap_minor(gi_dir.path() / "access") : std::nullopt;
    if (!gi_minor) continue;
    std::error_code ci_ec;
    for (const auto& ci_dir : fs::directory_iterator(gi_dir.path(), ci_ec)) {
      const auto ci = instance(ci_dir.path(), "ci");
      const auto ci_minor = ci ? cap_minor(ci_dir.path() / "access") : std::nullopt;
      if (ci_minor) found.push_back({*gi, *ci, *gi_minor, *ci_minor});
    }
  }
  std::sort(found.begin(), found.end(),
            [](const MigCapability& a, const MigCapability& b) { return std::tie(a.gi, a.ci) < std::tie(b.gi, b.ci); });
  return found;
}

std::vector<Gpu> discover_procfs(const fs::path& host_root) {
  std::vector<Gpu> gpus;
  std::error_code ec;
  const fs::path dir = host_path(host_root, "/proc/driver/nvidia/gpus");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto text = files::read_file(entry.path() / "information");
    if (!text) continue;
    const auto fields = parse_information(*text);
    const auto uuid = fields.find("GPU UUID");
    const auto minor = fields.find("Device Minor");
    if (uuid == fields.end() || minor == fields.end() || uuid->second.empty()) continue;
    const auto minor_number = to_unsigned(minor->second);
    if (!minor_number) continue;
    const auto excluded = fields.find("GPU Excluded");
    if (excluded != fields.end() && excluded->second == "Yes") continue;
    Gpu gpu;
    gpu.uuid = uuid->second;
    gpu.minor = *minor_number;
    gpu.pci_address = entry.path().filename().string();
    if (auto model = fields.find("Model"); model != fields.end()) gpu.model = model->second;
    gpu.numa_node = numa_node_of(host_root, gpu.pci_address);
    gpu.mig_enabled = !mig_capabilities(host_root, gpu.minor).empty();
    gpus.push_back(std::move(gpu));
  }
  std::sort(gpus.begin(), gpus.end(), [](const Gpu& a, const Gpu& b) { return a.minor < b.minor; });
  return gpus;
}

std::string driver_version(const fs::path& host_root) {
  const auto text = files::read_file(host_path(host_root, "/proc/driver/nvidia/version"));
  if (!text) return {};
  return std::string(trim(std::string_view(*text).substr(0, text->find('\n'))));
}

std::vector<std::string> control_device_nodes(const fs::path& host_root) {
  std::vector<std::string> nodes;
  for (const char* node : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}) {
    std::error_code ec;
    if (fs::exists(host_path(host_root, node), ec)) nodes.emplace_back(node);
  }
  return nodes;
}

std::vector<Gpu> discover_nvml(Nvml& nvml, const fs::path& host_root) {
  const std::vector<Gpu> from_procfs = discover_procfs(host_root);
  std::vector<Gpu> gpus;
  for (const Nvml::Device& device : nvml.devices()) {
    Gpu gpu;
    gpu.uuid = device.uuid;
    gpu.minor = device.minor;
    gpu.mig_enabled = device.mig_enabled;
    gpu.mig_listed = true;
    gpu.mig_devices = device.mig_devices;
    gpu.memory_bytes = device.memory_bytes;
    if (!gpu.mig_devices.empty()) {
      const auto capabilities = mig_capabilities(host_root, gpu.minor);
      for (MigDevice& mig : gpu.mig_devices) {
        const auto cap = std::find_if(capabilities.begin(), capabilities.end(),
                                      [&](const MigCapability& c) { return c.gi == mig.gi && c.ci == mig.ci; });
        if (cap != capabilities.end()) mig.cap_minors = {cap->gi_cap_minor, cap->ci_cap_minor};
      }
    }
    const auto known =
        std::find_if(from_procfs.begin(), from_procfs.end(), [&](const Gpu& g) { return g.minor == device.minor; });
    if (known != from_procfs.end()) {
      gpu.pci_address = known->pci_address;
      gpu.model = known->model;
      gpu.numa_node = known->numa_node;
    }
    gpus.push_back(std::move(gpu));
  }
  std::sort(gpus.begin(), gpus.end(), [](const Gpu& a, const Gpu& b) { return a.minor < b.minor; });
  return gpus;
}

std::optional<DiscoveryMode> parse_discovery_mode(std::string_view name) {
  if (name == "auto") return DiscoveryMode::automatic;
  if (name == "nvml") return DiscoveryMode::nvml;
  if (name == "procfs") return DiscoveryMode::procfs;
  if (name == "none") return DiscoveryMode::none;
  return std::nullopt;
}

Discovery discover(DiscoveryMode mode, const fs::path& host_root) {
  Discovery found;
  found.source = "none";
  if (mode == DiscoveryMode::none) return found;
  if (mode != DiscoveryMode::procfs) {
    std::string why_not;
    found.nvml = load_nvml(why_not);
    if (found.nvml) {
      try {
        found.gpus = discover_nvml(*found.nvml, host_root);
        found.source = "nvml";
        return found;
      } catch (const Nvml::Error& e) {
        why_not = e.what();
        found.nvml.reset();
      }
    }
    if (mode == DiscoveryMode::nvml) throw std::runtime_error("--discovery nvml: " + why_not);
    found.nvml_unavailable = why_not;
  }
  found.gpus = discover_procfs(host_root);
  found.source = "procfs";
  return found;
}

}  // namespace gpuguard::discovery

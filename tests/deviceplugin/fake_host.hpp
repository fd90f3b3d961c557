#pragma once
// A host tree as the plugin reads it under --host-root: the driver's procfs files (MIG capabilities too),
// device nodes (plain files: only their existence is checked), sysfs NUMA nodes and the toolkit config.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace gpuguard::test {

class FakeHost {
 public:
  explicit FakeHost(const std::string& name)
      : root_(std::filesystem::temp_directory_path() /
              ("gpuguard-host-" + name + std::string("-").append(std::to_string(::getpid())))) {
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ / "dev");
    write("proc/driver/nvidia/version",
          "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n");
  }
  ~FakeHost() { std::filesystem::remove_all(root_); }

  const std::filesystem::path& root() const { return root_; }

  void add_gpu(const std::string& pci, const std::string& uuid, unsigned minor, int numa_node, bool excluded = false) {
    write("proc/driver/nvidia/gpus/" + pci + "/information",
          "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t " + uuid +
              "\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t "
              "0xfffffffffffff\nBus Location: \t " +
              pci + "\nDevice Minor: \t " + std::to_string(minor) + "\nGPU Excluded:\t " + (excluded ? "Yes" : "No") +
              "\n");
    write("sys/bus/pci/devices/" + pci + "/numa_node", std::to_string(numa_node) + "\n");
    add_device(std::string("/dev/nvidia").append(std::to_string(minor)));
  }

  // A MIG instance as the driver's procfs shows it, with its two /dev/nvidia-caps nodes.
  void add_mig(unsigned gpu_minor, unsigned gi, unsigned ci, unsigned gi_cap_minor, unsigned ci_cap_minor) {
    const std::string dir =
        "proc/driver/nvidia/capabilities/gpu" + std::to_string(gpu_minor) + "/mig/gi" + std::to_string(gi);
    write(dir + "/access", "DeviceFileMinor: " + std::to_string(gi_cap_minor) + "\nDeviceFileMode: 292\n");
    write(dir + "/ci" + std::to_string(ci) + "/access",
          "DeviceFileMinor: " + std::to_string(ci_cap_minor) + "\nDeviceFileMode: 292\n");
    add_device("/dev/nvidia-caps/nvidia-cap" + std::to_string(gi_cap_minor));
    add_device("/dev/nvidia-caps/nvidia-cap" + std::to_string(ci_cap_minor));
  }

  void add_device(const std::string& path) { write(path.substr(1), ""); }
  void remove(const std::string& path) { std::filesystem::remove(root_ / path.substr(1)); }

  void write(const std::string& relative, const std::string& content) {
    const auto path = root_ / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << content;
  }

 private:
  std::filesystem::path root_;
};

}  // namespace gpuguard::test

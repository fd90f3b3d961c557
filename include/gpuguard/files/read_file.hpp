#pragma once
// Reading a file whole: mounted Secrets and ConfigMaps, the driver's procfs files, tokens and CAs.
#include <filesystem>
#include <optional>
#include <string>

namespace gpuguard::files {

// The whole file, following symlinks; nullopt when it cannot be read (missing, or swapped away mid-read).
std::optional<std::string> read_file(const std::filesystem::path& path);

}  // namespace gpuguard::files

#pragma once
// Writing a file that another program reads at any moment (a CDI spec, NFD's feature file): whole or not
// at all, never half.
#include <filesystem>
#include <string_view>

namespace gpuguard::files {

// Writes `content` to a temporary file beside `path`, then renames it over `path`, creating the directory
// first, and giving it `mode` where one is given (a program's 0755), else 0644. Throws std::runtime_error
// naming the path and the reason; no temporary file is left behind, but by a process killed while it
// writes: its temporary file, ".<name>.XXXXXX" beside `path`, stays.
void write_file_atomically(const std::filesystem::path& path, std::string_view content,
                           std::filesystem::perms mode = std::filesystem::perms::unknown);

}  // namespace gpuguard::files

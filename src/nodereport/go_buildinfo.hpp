#pragma once
// The version of NVIDIA's container toolkit a Go binary was built as, read from the build information Go
// writes into every binary it links (Go 1.18 and later, the ".go.buildinfo" section: runtime/debug's
// BuildInfo, `go version -m`), which stripping (-s -w) keeps. The toolkit's release build sets its version
// with -ldflags "-X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=<v>" (its Makefile),
// which Go records among the build settings; a binary built as a module dependency records the module's
// version instead. Either is the version of what runs, unlike the package database, which says what some
// package installed. Pure over HostFiles: read in bounded ranges, never whole.
#include <optional>
#include <string>

#include "gpuguard/nodereport/report.hpp"

namespace gpuguard::nodereport {

// "1.18.1", or nullopt when the file is not such a binary, names no version of the toolkit, or is over 512 MiB.
std::optional<std::string> toolkit_version_of_binary(const HostFiles& host, const std::string& path);

// The text of the build information's module and settings lines, or nullopt (for tests and the version above).
std::optional<std::string> go_build_info(const HostFiles& host, const std::string& path);

}  // namespace gpuguard::nodereport

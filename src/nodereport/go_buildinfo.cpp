// Go's build information in a binary (go_buildinfo.hpp). The format is Go's debug/buildinfo: a 32-byte
// header that begins "\xff Go buildinf:", then a pointer size byte and a flags byte; with flag 2 (Go 1.18
// and later) the Go version and the module information follow the header as two strings, each a varint
// length and its bytes. Earlier binaries point at the strings instead, which needs the binary's sections:
// they are not read (no toolkit release of 1.14 or later is built with a Go before 1.18).
#include "go_buildinfo.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace gpuguard::nodereport {
namespace {

constexpr std::string_view kMagic = "\xff Go buildinf:";
constexpr std::size_t kHeader = 32;
constexpr std::size_t kChunk = std::size_t{1} << 20;
constexpr std::uint64_t kFileMax = std::uint64_t{512} << 20;
constexpr std::size_t kInfoMax = std::size_t{1} << 20;  // module information longer than this is not read
constexpr std::string_view kToolkitModule = "github.com/NVIDIA/nvidia-container-toolkit";
constexpr std::string_view kVersionFlag = "github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=";

bool read_varint(std::string_view& bytes, std::uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && !bytes.empty(); shift += 7) {
    const auto b = static_cast<unsigned char>(bytes.front());
    bytes.remove_prefix(1);
    value |= static_cast<std::uint64_t>(b & 0x7fU) << shift;
    if ((b & 0x80U) == 0) return true;
  }
  return false;
}

// "1.18.1" from "1.18.1", "v1.18.1" or "v1.18.1-rc.1": digits and dots.
std::optional<std::string> plain_version(std::string_view text) {
  if (text.starts_with('v')) text.remove_prefix(1);
  std::size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) != 0 || text[end] == '.')) ++end;
  if (end == 0 || std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(end), '.') < 2)
    return std::nullopt;
  return std::string(text.substr(0, end));
}

}  // namespace

std::optional<std::string> go_build_info(const HostFiles& host, const std::string& path) {
  std::uint64_t offset = 0;
  std::string carried;  // the last bytes of the previous chunk, for a magic across the boundary
  while (offset < kFileMax) {
    const std::optional<std::string> chunk = host.read_range(path, offset, kChunk);
    if (!chunk || chunk->empty()) return std::nullopt;
    const std::string window = carried + *chunk;
    const std::size_t found = window.find(kMagic);
    if (found != std::string::npos) {
      const std::uint64_t at = offset - carried.size() + found;
      const std::optional<std::string> head = host.read_range(path, at, kHeader + 2 * (10 + kInfoMax));
      if (!head || head->size() < kHeader || (static_cast<unsigned char>((*head)[15]) & 2U) == 0) return std::nullopt;
      std::string_view rest = std::string_view(*head).substr(kHeader);
      std::uint64_t length = 0;
      if (!read_varint(rest, length) || length > rest.size()) return std::nullopt;
      rest.remove_prefix(length);  // the Go version
      if (!read_varint(rest, length) || length > rest.size()) return std::nullopt;
      return std::string(rest.substr(0, length));
    }
    if (chunk->size() < kChunk) return std::nullopt;
    carried = chunk->substr(chunk->size() - (kMagic.size() - 1));
    offset += chunk->size();
  }
  return std::nullopt;
}

std::optional<std::string> toolkit_version_of_binary(const HostFiles& host, const std::string& path) {
  const std::optional<std::string> info = go_build_info(host, path);
  if (!info) return std::nullopt;
  // The release build's -X setting, among the build settings ("build\t-ldflags=...").
  if (const std::size_t flag = info->find(kVersionFlag); flag != std::string::npos) {
    if (auto version = plain_version(std::string_view(*info).substr(flag + kVersionFlag.size()))) return version;
  }
  // Built as a module, or as a dependency of another: "mod\t<path>\t<version>\t..." or "dep\t...".
  std::string_view lines = *info;
  while (!lines.empty()) {
    const std::size_t newline = lines.find('\n');
    const std::string_view line = lines.substr(0, newline);
    lines = newline == std::string_view::npos ? std::string_view{} : lines.substr(newline + 1);
    for (const std::string_view kind : {"mod\t", "dep\t"}) {
      if (!line.starts_with(kind)) continue;
      const std::string_view fields = line.substr(kind.size());
      const std::size_t tab = fields.find('\t');
      if (tab == std::string_view::npos || fields.substr(0, tab) != kToolkitModule) continue;
      if (auto version = plain_version(fields.substr(tab + 1))) return version;
    }
  }
  return std::nullopt;
}

}  // namespace gpuguard::nodereport

#pragma once
// Host paths as a hostPath volume or a bind mount names them, read as the kernel resolves them: the
// webhook's hostPath doors and the node enforcer's mount checks compare them with the same rules.
#include <string>
#include <string_view>

namespace gpuguard::k8s {

// The path resolved lexically: no empty, "." or ".." components, no trailing slash; "/" when none is left.
// Symlinks are not followed (the host's files are not read).
std::string lexical_path(std::string_view path);

// Whether `path` is `dir` or lies under it (both resolved already).
bool is_or_under(std::string_view path, std::string_view dir);

}  // namespace gpuguard::k8s

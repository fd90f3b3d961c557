// Kubernetes object names (RFC 1123), checked character by character: no regex, no allocation.
#include "gpuguard/k8s/names.hpp"

#include <algorithm>

namespace gpuguard::k8s {

bool is_dns_label(std::string_view name) {
  if (name.empty() || name.size() > 63 || name.front() == '-' || name.back() == '-') return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

bool is_dns_subdomain(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  while (true) {
    const std::size_t dot = name.find('.');
    if (!is_dns_label(name.substr(0, dot))) return false;
    if (dot == std::string_view::npos) return true;
    name.remove_prefix(dot + 1);
  }
}

}  // namespace gpuguard::k8s

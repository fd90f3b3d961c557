// Kubernetes object names (RFC 1123), checked character by character: no regex, no allocation.
#include "gpuguard/k8s/names.hpp"

#include <algorithm>

namespace gpuguard::k8s {

std::vector<std::string> split_list(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n";
  std::vector<std::string> items;
  while (!text.empty()) {
    const std::size_t end = text.find_first_of(",\n");
    std::string_view item = text.substr(0, end);
    const std::size_t first = item.find_first_not_of(kSpace);
    item = first == std::string_view::npos ? std::string_view{}
                                           : item.substr(first, item.find_last_not_of(kSpace) - first + 1);
    if (!item.empty()) items.emplace_back(item);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
  }
  return items;
}

namespace {

// Lowercase letters, digits and '-', not starting or ending with '-': one part of a name, of any length.
bool is_label_part(std::string_view part) {
  if (part.empty() || part.front() == '-' || part.back() == '-') return false;
  return std::all_of(part.begin(), part.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

}  // namespace

bool is_dns_label(std::string_view name) { return name.size() <= 63 && is_label_part(name); }

// apimachinery's IsDNS1123Subdomain limits the whole name, not each part.
bool is_dns_subdomain(std::string_view name) {
  if (name.size() > 253) return false;
  while (true) {
    const std::size_t dot = name.find('.');
    if (!is_label_part(name.substr(0, dot))) return false;
    if (dot == std::string_view::npos) return true;
    name.remove_prefix(dot + 1);
  }
}

}  // namespace gpuguard::k8s

#pragma once
// Kubernetes object names as the API server checks them (RFC 1123): one place for the rule that the
// policy's entries, the arm hook's flags, the webhook's --instance and the device plugin's
// --infrastructure-namespaces are all held to, and for the lists of names they are written in.
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::k8s {

// An RFC 1123 label, as namespace names are: 1 to 63 lowercase letters, digits and '-', not starting or
// ending with '-'.
bool is_dns_label(std::string_view name);

// An RFC 1123 subdomain, as service account, Deployment and RuntimeClass names are: parts joined by '.',
// each as a label's characters but of any length (as apimachinery has it), at most 253 characters in all.
bool is_dns_subdomain(std::string_view name);

// A list of names as the policy's keys and the programs' list flags write them: comma- or newline-separated,
// each trimmed of spaces, tabs and line ends, empty ones dropped.
std::vector<std::string> split_list(std::string_view text);

}  // namespace gpuguard::k8s

#pragma once
// Kubernetes object names as the API server checks them (RFC 1123): one place for the rule that the
// policy's entries, the arm hook's flags and the webhook's --instance are all held to.
#include <string_view>

namespace gpuguard::k8s {

// An RFC 1123 label, as namespace names are: 1 to 63 lowercase letters, digits and '-', not starting or
// ending with '-'.
bool is_dns_label(std::string_view name);

// An RFC 1123 subdomain, as service account, Deployment and RuntimeClass names are: parts joined by '.',
// each as a label's characters but of any length (as apimachinery has it), at most 253 characters in all.
bool is_dns_subdomain(std::string_view name);

}  // namespace gpuguard::k8s

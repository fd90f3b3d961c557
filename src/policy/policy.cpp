#include "gpuguard/policy/policy.hpp"

#include <algorithm>
#include <stdexcept>

#include "gpuguard/k8s/names.hpp"

namespace gpuguard::policy {
namespace {

using k8s::is_dns_label;
using k8s::is_dns_subdomain;
using k8s::split_list;

struct InvalidValue : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string_view trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\r\n";
  const std::size_t first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

template <typename Enum, std::size_t N>
Enum one_of(std::string_view value, const std::pair<std::string_view, Enum> (&choices)[N]) {
  std::string allowed;
  for (const auto& [name, result] : choices) {
    if (value == name) return result;
    allowed += allowed.empty() ? "" : ", ";
    allowed += name;
  }
  throw InvalidValue("\"" + std::string(value) + "\" is not one of " + allowed);
}

bool is_resource_pattern(std::string_view s) {
  if (s.ends_with('*')) s.remove_suffix(1);
  if (s.empty() || s.find('*') != std::string_view::npos) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == '_' || c == '/';
  });
}

// A label value: at most 63 characters, alphanumeric at both ends, '-', '_' and '.' between; or empty.
bool is_label_value(std::string_view s) {
  if (s.empty()) return true;
  auto alphanumeric = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  if (s.size() > 63 || !alphanumeric(s.front()) || !alphanumeric(s.back())) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return alphanumeric(c) || c == '-' || c == '_' || c == '.'; });
}

// A Kubernetes annotation or label key: an optional DNS-subdomain prefix and '/', then a name, which has
// a non-empty label value's form.
bool is_annotation_key(std::string_view s) {
  const std::size_t slash = s.find('/');
  if (slash != std::string_view::npos) {
    if (!is_dns_subdomain(s.substr(0, slash))) return false;
    s.remove_prefix(slash + 1);
  }
  return !s.empty() && is_label_value(s);
}

// An exact name, or a prefix when the pattern ends in '*'.
bool matches_any(const std::vector<std::string>& patterns, std::string_view name) {
  for (const std::string& pattern : patterns) {
    if (!pattern.empty() && pattern.back() == '*') {
      if (name.starts_with(std::string_view(pattern).substr(0, pattern.size() - 1))) return true;
    } else if (name == pattern) {
      return true;
    }
  }
  return false;
}

Action action(std::string_view value) {
  static constexpr std::pair<std::string_view, Action> kActions[] = {
      {"allow", Action::allow}, {"warn", Action::warn}, {"deny", Action::deny}};
  return one_of(value, kActions);
}

// A list of names, each exact or a prefix ending in '*'; `what` names one in the error.
std::vector<std::string> patterns(std::string_view value, std::string_view what) {
  auto names = split_list(value);
  for (const auto& name : names) {
    if (!is_resource_pattern(name)) {
      throw InvalidValue("\"" + name + "\" is not " + std::string(what) + " or name prefix*");
    }
  }
  return names;
}

std::vector<std::string> namespaces(std::string_view value) {
  auto names = split_list(value);
  for (const auto& name : names) {
    if (!is_dns_label(name)) throw InvalidValue("\"" + name + "\" is not a namespace name");
  }
  return names;
}

bool is_service_account(std::string_view entry) {
  const std::size_t slash = entry.find('/');
  return slash != std::string_view::npos && is_dns_label(entry.substr(0, slash)) &&
         is_dns_subdomain(entry.substr(slash + 1));
}

std::vector<std::string> service_accounts(std::string_view value) {
  auto entries = split_list(value);
  for (const auto& entry : entries) {
    if (!is_service_account(entry)) throw InvalidValue("\"" + entry + "\" is not namespace/name");
  }
  return entries;
}

// namespace/name, each optionally with ":key=value", a label the pod must carry too. What precedes the
// ':' is taken exactly as the matching compares it: "ns/sa :app=x" or ":app=x" would name nobody. The name
// may be "*", any account of the namespace, only with a label: a chart's account carries its release's name
// (NVIDIA's: <release>-nvidia-device-plugin-service-account), its pods' label does not.
std::vector<std::string> labelled_service_accounts(std::string_view value) {
  auto entries = split_list(value);
  for (const auto& entry : entries) {
    const std::size_t colon = entry.find(':');
    const std::string_view pair = std::string_view(entry).substr(0, colon);
    const bool any_account = pair.ends_with("/*") && is_dns_label(pair.substr(0, pair.size() - 2));
    if (any_account && colon == std::string::npos) {
      throw InvalidValue("\"" + entry + "\": namespace/* names every account of the namespace, so it needs :key=value");
    }
    if (!any_account && !is_service_account(pair)) {
      throw InvalidValue("\"" + entry + "\" is not namespace/name, namespace/name:key=value or namespace/*:key=value");
    }
    if (colon == std::string::npos) continue;
    const std::string_view label = std::string_view(entry).substr(colon + 1);
    const std::size_t equals = label.find('=');
    if (equals == std::string_view::npos || !is_annotation_key(label.substr(0, equals)) ||
        !is_label_value(label.substr(equals + 1))) {
      throw InvalidValue("\"" + entry + "\": what follows ':' is not a label key=value");
    }
  }
  return entries;
}

void apply(Policy& policy, std::string_view key, std::string_view raw) {
  const std::string_view value = trim(raw);
  if (key == "mode") {
    static constexpr std::pair<std::string_view, Mode> kModes[] = {
        {"enforce", Mode::enforce}, {"strict", Mode::strict}, {"audit", Mode::audit}, {"off", Mode::off}};
    policy.mode = one_of(value, kModes);
  } else if (key == "visibleDevicesValue") {
    static constexpr std::pair<std::string_view, int> kValues[] = {{"none", 0}, {"void", 1}};
    one_of(value, kValues);
    policy.visible_devices_value = std::string(value);
  } else if (key == "gpuResources") {
    auto names = patterns(value, "a resource name");
    if (names.empty()) throw InvalidValue("must name at least one resource");
    policy.gpu_resources = std::move(names);
  } else if (key == "sharedGpuResources") {
    policy.shared_gpu_resources = patterns(value, "a resource name");
  } else if (key == "sharingEnvVars") {
    static constexpr std::pair<std::string_view, SharingEnv> kActions[] = {
        {"strip", SharingEnv::strip}, {"deny", SharingEnv::deny}, {"allow", SharingEnv::allow}};
    policy.sharing_env_vars = one_of(value, kActions);
  } else if (key == "gpuDeviceClasses") {
    policy.gpu_device_classes = patterns(value, "a device class name");
  } else if (key == "gpuAnnotations") {
    auto keys = split_list(value);
    for (const auto& annotation : keys) {
      if (!is_annotation_key(annotation)) throw InvalidValue("\"" + annotation + "\" is not an annotation key");
    }
    policy.gpu_annotations = std::move(keys);
  } else if (key == "exemptNamespaces") {
    policy.exempt_namespaces = namespaces(value);
  } else if (key == "exemptServiceAccounts") {
    policy.exempt_service_accounts = service_accounts(value);
  } else if (key == "nodeEnforcement") {
    static constexpr std::pair<std::string_view, NodeEnforcement> kModes[] = {
        {"enforce", NodeEnforcement::enforce}, {"audit", NodeEnforcement::audit}, {"off", NodeEnforcement::off}};
    policy.node_enforcement = one_of(value, kModes);
  } else if (key == "nodeEnforcementUnknown") {
    static constexpr std::pair<std::string_view, NodeEnforcementUnknown> kActions[] = {
        {"refuse", NodeEnforcementUnknown::refuse}, {"allow", NodeEnforcementUnknown::allow}};
    policy.node_enforcement_unknown = one_of(value, kActions);
  } else if (key == "nodeEnforcementExemptNamespaces") {
    policy.node_enforcement_exempt_namespaces = namespaces(value);
  } else if (key == "nodeEnforcementExemptServiceAccounts") {
    policy.node_enforcement_exempt_service_accounts = labelled_service_accounts(value);
  } else if (key == "nriTolerationAnnotation") {
    if (!value.empty() && !is_annotation_key(value)) {
      throw InvalidValue("\"" + std::string(value) + "\" is not an annotation key");
    }
    policy.nri_toleration_annotation = std::string(value);
  } else if (key == "privileged") {
    policy.privileged = action(value);
  } else if (key == "hostDeviceMounts") {
    policy.host_device_mounts = action(value);
  } else if (key == "cdiAnnotations") {
    policy.cdi_annotations = action(value);
  } else if (key == "nvidiaCdiAnnotations") {
    policy.nvidia_cdi_annotations = action(value);
  } else if (key == "featureEnvVars") {
    policy.feature_env_vars = action(value);
  } else if (key == "runtimeClassAction") {
    policy.runtime_class_action = action(value);
  } else if (key == "runtimeClasses") {
    auto names = split_list(value);
    for (const auto& name : names) {
      if (!is_dns_subdomain(name)) throw InvalidValue("\"" + name + "\" is not a RuntimeClass name");
    }
    policy.runtime_classes = std::move(names);
  } else if (key == "stripUserValueFromGpuContainers") {
    static constexpr std::pair<std::string_view, bool> kBooleans[] = {{"true", true}, {"false", false}};
    policy.strip_user_value_from_gpu_containers = one_of(value, kBooleans);
  }
}

constexpr std::string_view kKeys[] = {"mode",
                                      "visibleDevicesValue",
                                      "gpuResources",
                                      "gpuAnnotations",
                                      "gpuDeviceClasses",
                                      "exemptNamespaces",
                                      "exemptServiceAccounts",
                                      "privileged",
                                      "hostDeviceMounts",
                                      "cdiAnnotations",
                                      "nvidiaCdiAnnotations",
                                      "featureEnvVars",
                                      "runtimeClasses",
                                      "runtimeClassAction",
                                      "stripUserValueFromGpuContainers",
                                      "sharedGpuResources",
                                      "sharingEnvVars",
                                      "nodeEnforcement",
                                      "nodeEnforcementExemptNamespaces",
                                      "nodeEnforcementExemptServiceAccounts",
                                      "nodeEnforcementUnknown",
                                      "nriTolerationAnnotation"};

}  // namespace

std::string_view node_enforcement_unknown_name(NodeEnforcementUnknown action) {
  return action == NodeEnforcementUnknown::refuse ? "refuse" : "allow";
}

std::string_view node_enforcement_name(NodeEnforcement mode) {
  switch (mode) {
    case NodeEnforcement::enforce: return "enforce";
    case NodeEnforcement::audit: return "audit";
    case NodeEnforcement::off: break;
  }
  return "off";
}

std::string_view mode_name(Mode mode) {
  switch (mode) {
    case Mode::enforce: return "enforce";
    case Mode::strict: return "strict";
    case Mode::audit: return "audit";
    case Mode::off: break;
  }
  return "off";
}

bool Policy::is_gpu_resource(std::string_view resource_name) const { return matches_any(gpu_resources, resource_name); }

bool Policy::is_shared_gpu_resource(std::string_view resource_name) const {
  return matches_any(shared_gpu_resources, resource_name);
}

bool Policy::is_gpu_device_class(std::string_view device_class) const {
  return matches_any(gpu_device_classes, device_class);
}

namespace {

bool is_pair(std::string_view entry, std::string_view pod_namespace, std::string_view name) {
  const std::size_t slash = entry.find('/');
  return entry.substr(0, slash) == pod_namespace && entry.substr(slash + 1) == name;
}

// As is_pair, where a labelled entry's name may be "*" (any account; the parser lets it only with a label).
bool is_labelled_pair(std::string_view entry, std::string_view pod_namespace, std::string_view name) {
  const std::size_t slash = entry.find('/');
  return entry.substr(0, slash) == pod_namespace && (entry.substr(slash + 1) == name || entry.substr(slash + 1) == "*");
}

bool names_pair(const std::vector<std::string>& entries, std::string_view pod_namespace, std::string_view name) {
  return std::any_of(entries.begin(), entries.end(),
                     [&](const std::string& entry) { return is_pair(entry, pod_namespace, name); });
}

// Whether the pod carries the label a labelled entry requires ("namespace/name:key=value", its colon at
// `colon`).
bool carries_label(const std::string& entry, std::size_t colon, const std::map<std::string, std::string>& labels) {
  const std::size_t equals = entry.find('=', colon);
  const auto found = labels.find(entry.substr(colon + 1, equals - colon - 1));
  return found != labels.end() && found->second == std::string_view(entry).substr(equals + 1);
}

// The same, for entries that may require a label ("namespace/name:key=value"): without the pod's labels
// (nullptr) such an entry names nobody.
bool names_labelled_pair(const std::vector<std::string>& entries, std::string_view pod_namespace, std::string_view name,
                         const std::map<std::string, std::string>* labels) {
  return std::any_of(entries.begin(), entries.end(), [&](const std::string& entry) {
    const std::size_t colon = entry.find(':');
    if (colon == std::string::npos) return is_pair(entry, pod_namespace, name);
    if (!is_labelled_pair(std::string_view(entry).substr(0, colon), pod_namespace, name)) return false;
    return labels != nullptr && carries_label(entry, colon, *labels);
  });
}

// Whether an entry of `entries` could name a pod of the namespace with these labels, whatever its account:
// names_labelled_pair with the account left open.
bool names_namespace(const std::vector<std::string>& entries, std::string_view pod_namespace,
                     const std::map<std::string, std::string>& labels) {
  return std::any_of(entries.begin(), entries.end(), [&](const std::string& entry) {
    const std::size_t colon = entry.find(':');
    const std::string_view pair = std::string_view(entry).substr(0, colon);
    if (pair.substr(0, pair.find('/')) != pod_namespace) return false;
    return colon == std::string::npos || carries_label(entry, colon, labels);
  });
}

}  // namespace

bool Policy::is_exempt(std::string_view pod_namespace, std::string_view service_account) const {
  if (std::find(exempt_namespaces.begin(), exempt_namespaces.end(), pod_namespace) != exempt_namespaces.end()) {
    return true;
  }
  return names_pair(exempt_service_accounts, pod_namespace, service_account.empty() ? "default" : service_account);
}

bool Policy::is_node_enforcement_exempt(std::string_view pod_namespace, std::string_view service_account,
                                        const std::map<std::string, std::string>* pod_labels) const {
  for (const auto* namespaces : {&exempt_namespaces, &node_enforcement_exempt_namespaces}) {
    if (std::find(namespaces->begin(), namespaces->end(), pod_namespace) != namespaces->end()) return true;
  }
  if (service_account.empty()) return false;
  return names_pair(exempt_service_accounts, pod_namespace, service_account) ||
         names_labelled_pair(node_enforcement_exempt_service_accounts, pod_namespace, service_account, pod_labels);
}

bool Policy::names_service_accounts_for(std::string_view pod_namespace,
                                        const std::map<std::string, std::string>& pod_labels) const {
  return names_namespace(exempt_service_accounts, pod_namespace, pod_labels) ||
         names_namespace(node_enforcement_exempt_service_accounts, pod_namespace, pod_labels);
}

std::string Policy::unlisted_infrastructure(std::string_view pod_namespace,
                                            const std::map<std::string, std::string>& pod_labels) const {
  for (const std::string& entry : node_enforcement_exempt_service_accounts) {
    const std::size_t colon = entry.find(':');
    const std::size_t equals = entry.find('=', colon);
    if (colon == std::string::npos || equals == std::string::npos) continue;
    if (std::string_view(entry).substr(0, entry.find('/')) == pod_namespace) continue;
    const auto found = pod_labels.find(entry.substr(colon + 1, equals - colon - 1));
    if (found != pod_labels.end() && found->second == std::string_view(entry).substr(equals + 1)) return entry;
  }
  return "";
}

PolicyParse parse_policy(const std::map<std::string, std::string>& files) {
  PolicyParse result;
  Policy policy;
  for (const auto& [key, value] : files) {
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      result.unknown_keys.push_back(key);
      continue;
    }
    try {
      apply(policy, key, value);
    } catch (const InvalidValue& e) {
      result.error = "policy key " + key + ": " + e.what();
      return result;
    }
  }
  result.policy = std::move(policy);
  return result;
}

}  // namespace gpuguard::policy

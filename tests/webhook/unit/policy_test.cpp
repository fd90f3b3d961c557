#include <catch2/catch.hpp>

#include "gpuguard/policy/policy.hpp"

using namespace gpuguard::policy;

namespace {
PolicyParse parse(const std::map<std::string, std::string>& files) { return parse_policy(files); }
}  // namespace

TEST_CASE("policy: no files means the defaults") {
  const auto parsed = parse({});
  REQUIRE(parsed.policy);
  CHECK(parsed.policy->mode == Mode::enforce);
  CHECK(parsed.policy->visible_devices_value == "none");
  CHECK(parsed.policy->gpu_resources ==
        std::vector<std::string>{"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"});
  CHECK(parsed.policy->privileged == Action::warn);
  CHECK(parsed.policy->nvidia_cdi_annotations == Action::warn);
  CHECK(parsed.policy->feature_env_vars == Action::warn);
  CHECK(parsed.policy->strip_user_value_from_gpu_containers);
  CHECK(parsed.policy->exempt_namespaces.empty());
  CHECK(parsed.policy->exempt_service_accounts.empty());
}

TEST_CASE("policy: every key, values trimmed, lists split on commas and newlines") {
  const auto parsed = parse({{"mode", " audit\n"},
                             {"visibleDevicesValue", "void\n"},
                             {"gpuResources", "example.com/gpu,\nacme.io/accel-*\n\n"},
                             {"exemptNamespaces", "monitoring , gpu-operator"},
                             {"exemptServiceAccounts", "monitoring/dcgm-exporter\nkube-prometheus/node.exporter"},
                             {"privileged", "deny"},
                             {"nvidiaCdiAnnotations", "allow\n"},
                             {"featureEnvVars", " deny"},
                             {"stripUserValueFromGpuContainers", "false\n"}});
  INFO(parsed.error);
  REQUIRE(parsed.policy);
  const Policy& p = *parsed.policy;
  CHECK(p.mode == Mode::audit);
  CHECK(p.visible_devices_value == "void");
  CHECK(p.gpu_resources == std::vector<std::string>{"example.com/gpu", "acme.io/accel-*"});
  CHECK(p.exempt_namespaces == std::vector<std::string>{"monitoring", "gpu-operator"});
  CHECK(p.exempt_service_accounts ==
        std::vector<std::string>{"monitoring/dcgm-exporter", "kube-prometheus/node.exporter"});
  CHECK(p.privileged == Action::deny);
  CHECK(p.nvidia_cdi_annotations == Action::allow);
  CHECK(p.feature_env_vars == Action::deny);
  CHECK_FALSE(p.strip_user_value_from_gpu_containers);
  CHECK(p.is_gpu_resource("acme.io/accel-x2"));
  CHECK_FALSE(p.is_gpu_resource("nvidia.com/gpu"));
  CHECK(p.is_exempt("gpu-operator", "anything"));
  CHECK(p.is_exempt("monitoring", "dcgm-exporter"));
  CHECK(p.is_exempt("kube-prometheus", "node.exporter"));
  CHECK_FALSE(p.is_exempt("kube-prometheus", "default"));
  CHECK_FALSE(p.is_exempt("team-a", "dcgm-exporter"));
}

TEST_CASE("policy: each invalid value refuses the whole policy, naming the key") {
  struct Row {
    const char* key;
    const char* value;
  };
  const Row rows[] = {
      {"mode", "enforcing"},
      {"mode", ""},
      {"visibleDevicesValue", "all"},
      {"visibleDevicesValue", "none,void"},
      {"gpuResources", ""},
      {"gpuResources", "nvidia.com/*gpu"},
      {"gpuResources", "nvidia com/gpu"},
      {"exemptNamespaces", "Team-A"},
      {"exemptNamespaces", "a_b"},
      {"exemptServiceAccounts", "dcgm-exporter"},
      {"exemptServiceAccounts", "monitoring/"},
      {"exemptServiceAccounts", "/dcgm"},
      {"privileged", "block"},
      {"nvidiaCdiAnnotations", "management"},
      {"featureEnvVars", "remove"},
      {"featureEnvVars", ""},
      {"stripUserValueFromGpuContainers", "yes"},
      // What precedes a label's ':' is matched exactly, so these would name nobody.
      {"nodeEnforcementExemptServiceAccounts", ":app=x"},
      {"nodeEnforcementExemptServiceAccounts", "ns/sa :app=x"},
      {"nodeEnforcementExemptServiceAccounts", "ns/sa:app"},
  };
  for (const Row& row : rows) {
    INFO(row.key << " = \"" << row.value << "\"");
    std::map<std::string, std::string> files = {{"mode", "strict"}};
    files[row.key] = row.value;
    const auto parsed = parse(files);
    CHECK_FALSE(parsed.policy);
    CHECK_THAT(parsed.error, Catch::StartsWith(std::string("policy key ") + row.key + ":"));
  }
}

TEST_CASE("policy: unknown keys are reported and ignored") {
  const auto parsed = parse({{"mode", "off"}, {"colour", "blue"}, {"Mode", "strict"}});
  REQUIRE(parsed.policy);
  CHECK(parsed.policy->mode == Mode::off);
  CHECK(parsed.unknown_keys == std::vector<std::string>{"Mode", "colour"});
}

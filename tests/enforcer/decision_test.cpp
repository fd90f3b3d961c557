// gpuguard-node-enforcer's decision over tests/fixtures/enforcer/: each container, as NRI's protobuf
// carries it (the fixture's protojson parsed by protobuf's own JSON reader, written as the runtime writes
// it, then read in place by view_of), with the kubelet's answer and the node, gets the action, the new
// NVIDIA_VISIBLE_DEVICES, the list of what it would see beyond its allocation and the allocation's source
// the fixture says.
#include <catch2/catch.hpp>

#include <fstream>

#include <google/protobuf/util/json_util.h>

#include "fixture.hpp"
#include "gpuguard/nri/container_response.hpp"
#include "gpuguard/nri/container_view.hpp"
#include "nri/v1alpha1/api.pb.h"

using namespace gpuguard;
using nlohmann::json;

namespace {

const std::filesystem::path kFixtures = std::filesystem::path(GPUGUARD_SOURCE_DIR) / "tests/fixtures/enforcer";

template <typename Message>
Message from_json(const json& value) {
  Message message;
  const auto status = google::protobuf::util::JsonStringToMessage(value.dump(), &message);
  INFO(value.dump());
  REQUIRE(status.ok());
  return message;
}

std::string action_name(enforcement::Decision::Action action) {
  switch (action) {
    case enforcement::Decision::Action::allow: return "allow";
    case enforcement::Decision::Action::adjust: return "adjust";
    case enforcement::Decision::Action::refuse: break;
  }
  return "refuse";
}

std::string source_name(enforcement::Allocation::Source source) {
  switch (source) {
    case enforcement::Allocation::Source::pod_resources: return "pod_resources";
    case enforcement::Allocation::Source::pod_union: return "pod_union";
    case enforcement::Allocation::Source::plugin_annotation: return "plugin_annotation";
    case enforcement::Allocation::Source::unknown: break;
  }
  return "unknown";
}

}  // namespace

TEST_CASE("enforcer: every fixture container gets the decision its fixture says") {
  const auto fixtures = test::enforcer_fixtures(kFixtures);
  REQUIRE(fixtures.size() >= 30);
  for (const auto& f : fixtures) {
    INFO(f.name << ": " << f.raw["why"].get<std::string>());
    const auto parsed = policy::parse_policy(f.policy_files);
    REQUIRE(parsed.policy);
    const std::string pod = from_json<::nri::pkg::api::v1alpha1::PodSandbox>(f.raw["pod"]).SerializeAsString();
    const std::string container =
        from_json<::nri::pkg::api::v1alpha1::Container>(f.raw["container"]).SerializeAsString();
    std::set<std::string> label_keys;
    for (const auto& entry : parsed.policy->node_enforcement_exempt_service_accounts) {
      if (const auto colon = entry.find(':'); colon != std::string::npos) {
        label_keys.insert(entry.substr(colon + 1, entry.find('=') - colon - 1));
      }
    }
    std::optional<enforcement::ContainerView> read = gpuguard::nri::view_of(
        pod, container, f.node, label_keys, [&f](std::string_view path) { return f.resolve(path); });
    REQUIRE(read);
    enforcement::ContainerView view = *read;
    // The API server's pod of that name is known by its UID: another pod's account says nothing.
    const bool same_pod = f.raw.value("api_uid", view.pod_uid) == view.pod_uid;
    view.service_account = same_pod ? f.raw.value("service_account", "") : "";
    // As the enforcer sets it: on CRI-O, a mask is held to only by the mask check, where the node has it.
    view.masks_checked = f.raw.value("runtime", "containerd") != "cri-o" || f.raw.value("mask_hook", false);
    enforcement::Allocation allocation = enforcement::allocation_for(
        f.kubelet, view.container,
        enforcement::trusted_annotation(view, f.raw.value("runtime", "containerd") == "cri-o"), *parsed.policy);
    for (const auto& name : allocation.cdi_devices) {
      if (const auto nodes = f.cdi_nodes.find(name); nodes != f.cdi_nodes.end()) {
        allocation.device_paths.insert(nodes->second.begin(), nodes->second.end());
      }
    }
    const enforcement::Decision decision = enforcement::decide(view, allocation, f.node, *parsed.policy);
    const json& expect = f.raw["expect"];
    CHECK(action_name(decision.action) == expect["action"].get<std::string>());
    CHECK(std::string(enforcement::why_name(decision.why)) == expect["why"].get<std::string>());
    const auto visible = decision.set_env.find("NVIDIA_VISIBLE_DEVICES");
    if (expect.contains("visible_devices")) {
      CHECK((visible == decision.set_env.end() ? "(unchanged)" : visible->second) ==
            expect["visible_devices"].get<std::string>());
    } else {
      CHECK(visible == decision.set_env.end());
    }
    if (expect.contains("set_env")) {
      CHECK(decision.set_env == expect["set_env"].get<std::map<std::string, std::string>>());
    }
    CHECK(decision.masks == expect.value("masks", std::set<std::string>{}));
    if (expect.contains("beyond")) CHECK(decision.beyond == expect["beyond"].get<std::vector<std::string>>());
    if (expect.contains("message"))
      CHECK_THAT(decision.message, Catch::StartsWith(expect["message"].get<std::string>()));
    if (expect.contains("source")) CHECK(source_name(allocation.source) == expect["source"].get<std::string>());
    // A fixed point: the container as the runtime makes it after the adjustment is within its allocation,
    // and left as it is (a privileged one stays reported).
    if (decision.action == enforcement::Decision::Action::adjust) {
      const enforcement::Decision again = enforcement::decide(
          enforcement::with_masks(enforcement::with_env_set(view, decision.set_env), decision.masks), allocation,
          f.node, *parsed.policy);
      CHECK(action_name(again.action) == "allow");
      if (decision.why == enforcement::Decision::Why::enforced) {
        CHECK(std::string(enforcement::why_name(again.why)) == "within");
      }
    }
  }
}

TEST_CASE("enforcer: the adjustment removes NVIDIA_VISIBLE_DEVICES, then sets it") {
  const auto response = gpuguard::nri::adjustment({{"NVIDIA_VISIBLE_DEVICES", "void"}});
  REQUIRE(response->adjust().env_size() == 2);
  CHECK(response->adjust().env(0).key() == "-NVIDIA_VISIBLE_DEVICES");
  CHECK(response->adjust().env(1).key() == "NVIDIA_VISIBLE_DEVICES");
  CHECK(response->adjust().env(1).value() == "void");
}

TEST_CASE("enforcer: a mask is a removal of its destination, then an empty read-only tmpfs there") {
  const auto response = gpuguard::nri::adjustment({}, {"/host/root/run/gpuguard"});
  REQUIRE(response->adjust().mounts_size() == 2);
  CHECK(response->adjust().mounts(0).destination() == "-/host/root/run/gpuguard");
  const auto& mask = response->adjust().mounts(1);
  CHECK(mask.destination() == "/host/root/run/gpuguard");
  CHECK(mask.type() == "tmpfs");
  CHECK(std::vector<std::string>(mask.options().begin(), mask.options().end()) ==
        std::vector<std::string>{"ro", "nosuid", "nodev", "noexec", "size=4k", "mode=0555"});
  enforcement::Mount read{
      mask.destination(), mask.type(), mask.source(), {mask.options().begin(), mask.options().end()}, {}, {}};
  CHECK(enforcement::is_mask(read));
  read.options.erase(read.options.begin());
  CHECK_FALSE(enforcement::is_mask(read));  // a writable tmpfs is not what the enforcer writes
}

TEST_CASE("enforcer: the node policy keys are parsed and refused as the others") {
  auto parsed = policy::parse_policy({{"nodeEnforcement", "audit"},
                                      {"nodeEnforcementExemptNamespaces", "gpu-operator, kube-system"},
                                      {"nodeEnforcementExemptServiceAccounts", "monitoring/dcgm-exporter"},
                                      {"nriTolerationAnnotation", "tolerate.example.com/nri"}});
  REQUIRE(parsed.policy);
  CHECK(parsed.policy->node_enforcement == policy::NodeEnforcement::audit);
  CHECK(parsed.policy->is_node_enforcement_exempt("kube-system", ""));
  CHECK(parsed.policy->is_node_enforcement_exempt("monitoring", "dcgm-exporter"));
  CHECK_FALSE(parsed.policy->is_node_enforcement_exempt("monitoring", ""));
  CHECK(parsed.policy->names_service_accounts_for("monitoring", {}));
  CHECK_FALSE(parsed.policy->names_service_accounts_for("kube-system", {}));
  CHECK(parsed.policy->nri_toleration_annotation == "tolerate.example.com/nri");
  // An entry may require a label too: then the account alone, or unknown labels, exempt nothing.
  parsed = policy::parse_policy({{"nodeEnforcementExemptServiceAccounts", "gpuguard/mps:app.kubernetes.io/name=mps"}});
  REQUIRE(parsed.policy);
  const std::map<std::string, std::string> labelled = {{"app.kubernetes.io/name", "mps"}};
  const std::map<std::string, std::string> other = {{"app.kubernetes.io/name", "mps-look-alike"}};
  CHECK(parsed.policy->is_node_enforcement_exempt("gpuguard", "mps", &labelled));
  CHECK_FALSE(parsed.policy->is_node_enforcement_exempt("gpuguard", "mps", &other));
  CHECK_FALSE(parsed.policy->is_node_enforcement_exempt("gpuguard", "mps"));
  CHECK_FALSE(parsed.policy->is_node_enforcement_exempt("elsewhere", "mps", &labelled));
  // Its account is worth asking the API server for only where the pod carries the label.
  CHECK(parsed.policy->names_service_accounts_for("gpuguard", labelled));
  CHECK_FALSE(parsed.policy->names_service_accounts_for("gpuguard", other));
  CHECK_FALSE(parsed.policy->names_service_accounts_for("gpuguard", {}));
  CHECK_FALSE(parsed.policy->names_service_accounts_for("elsewhere", labelled));
  // A chart that names its account after its release: any account of the namespace, with the label.
  parsed = policy::parse_policy({{"nodeEnforcementExemptServiceAccounts", "nvidia/*:app.kubernetes.io/name=mps"}});
  REQUIRE(parsed.policy);
  CHECK(parsed.policy->is_node_enforcement_exempt("nvidia", "any-release-service-account", &labelled));
  CHECK(parsed.policy->names_service_accounts_for("nvidia", labelled));
  CHECK_FALSE(parsed.policy->names_service_accounts_for("nvidia", other));
  CHECK_FALSE(parsed.policy->is_node_enforcement_exempt("nvidia", "any-release-service-account", &other));
  CHECK_FALSE(parsed.policy->is_node_enforcement_exempt("nvidia", "any-release-service-account"));
  CHECK_FALSE(parsed.policy->is_node_enforcement_exempt("nvidia", "", &labelled));  // account unknown
  CHECK_FALSE(parsed.policy->is_node_enforcement_exempt("elsewhere", "any", &labelled));
  // Elsewhere, the entry's label is said: GPU infrastructure in a namespace the admin did not list.
  CHECK(parsed.policy->unlisted_infrastructure("elsewhere", labelled) == "nvidia/*:app.kubernetes.io/name=mps");
  CHECK(parsed.policy->unlisted_infrastructure("nvidia", labelled).empty());
  CHECK(parsed.policy->unlisted_infrastructure("elsewhere", other).empty());
  CHECK(parsed.policy->unlisted_infrastructure("elsewhere", {}).empty());
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"nodeEnforcement", "enforcing"},
                                                        {"nodeEnforcementExemptNamespaces", "Not_A_Name"},
                                                        {"nodeEnforcementExemptServiceAccounts", "nosa"},
                                                        {"nodeEnforcementExemptServiceAccounts", "a/b:no-equals"},
                                                        {"nodeEnforcementExemptServiceAccounts", "a/b:key=not a value"},
                                                        {"nodeEnforcementExemptServiceAccounts", "a/*"},
                                                        {"nodeEnforcementExemptServiceAccounts", "*/b:key=value"},
                                                        {"nodeEnforcementExemptServiceAccounts", "a/b*:key=value"},
                                                        {"nriTolerationAnnotation", "a b"}}) {
    INFO(key);
    parsed = policy::parse_policy({{key, value}});
    CHECK_FALSE(parsed.policy);
    CHECK_THAT(parsed.error, Catch::Contains(key));
  }
}

TEST_CASE("enforcer: a container larger than NRI can show at a registration is refused under enforce, whatever it is") {
  // At the bound it is judged as any other; one byte more, refused, even with nothing beyond its allocation,
  // and even privileged; reported under audit; left under off and by an exemption.
  enforcement::NodeView node;
  node.gpus = test::default_node();
  node.toolkit.mode = "auto";
  node.toolkit.version = enforcement::ToolkitVersion{1, 20, 1};
  enforcement::ContainerView view;
  view.pod_namespace = "team-a";
  view.pod_name = "big";
  view.container = "app";
  enforcement::Allocation allocation;
  allocation.source = enforcement::Allocation::Source::pod_resources;
  policy::Policy enforce;
  view.nri_bytes = enforcement::kNriContainerBytesMax;
  CHECK(enforcement::decide(view, allocation, node, enforce).why == enforcement::Decision::Why::within);
  view.nri_bytes = enforcement::kNriContainerBytesMax + 1;
  for (const bool privileged : {false, true}) {
    view.all_devices_allowed = privileged;
    const enforcement::Decision refused = enforcement::decide(view, allocation, node, enforce);
    CHECK(refused.action == enforcement::Decision::Action::refuse);
    CHECK(refused.why == enforcement::Decision::Why::oversized);
    CHECK_THAT(refused.message, Catch::StartsWith("gpuguard: container \"app\" of pod team-a/big is larger than") &&
                                    Catch::Contains("its NRI message is 640 KiB, over 640 KiB"));
  }
  policy::Policy audit;
  audit.node_enforcement = policy::NodeEnforcement::audit;
  const enforcement::Decision reported = enforcement::decide(view, allocation, node, audit);
  CHECK(reported.action == enforcement::Decision::Action::allow);
  CHECK(reported.why == enforcement::Decision::Why::oversized);
  policy::Policy off;
  off.node_enforcement = policy::NodeEnforcement::off;
  CHECK(enforcement::decide(view, allocation, node, off).why == enforcement::Decision::Why::off);
  const auto exempting = policy::parse_policy({{"nodeEnforcementExemptNamespaces", "team-a"}});
  REQUIRE(exempting.policy);
  CHECK(enforcement::decide(view, allocation, node, *exempting.policy).why == enforcement::Decision::Why::exempt);
}

TEST_CASE(
    "enforcer: a toolkit that names more swarm-resource variables than the enforcer reads leaves nothing judged") {
  // The toolkit reads every variable its swarm-resource names; one the enforcer did not read may be set to
  // all. So none is taken for unset: the container is what it cannot judge.
  enforcement::NodeView node;
  node.gpus = test::default_node();
  node.toolkit.mode = "legacy";
  node.toolkit.version = enforcement::ToolkitVersion{1, 20, 1};
  for (std::size_t i = 0; i < enforcement::kSwarmMax; ++i)
    node.toolkit.swarm_variables.push_back(
        std::string("R").append(std::to_string(i)));  // not "R" + …: GCC 12 -Wrestrict
  enforcement::ContainerView view;
  view.pod_namespace = "team-a";
  view.pod_name = "p";
  view.container = "app";
  enforcement::Allocation allocation;
  allocation.source = enforcement::Allocation::Source::pod_resources;
  CHECK(enforcement::decide(view, allocation, node, policy::Policy{}).why == enforcement::Decision::Why::within);
  node.toolkit.swarm_over = true;
  const enforcement::Decision refused = enforcement::decide(view, allocation, node, policy::Policy{});
  CHECK(refused.action == enforcement::Decision::Action::refuse);
  CHECK(refused.why == enforcement::Decision::Why::cannot_judge);
  CHECK_THAT(refused.message, Catch::Contains("swarm-resource names more variables than the 16 gpuguard reads"));
}

TEST_CASE("enforcer: a selection it cannot judge is refused, and under nodeEnforcementUnknown: allow still written") {
  // The toolkit's mode unknown (the container runtime's configuration unreadable): csv mode before 1.19 may be
  // what runs, which gives every device for any request but void, so a selection of some of the node's GPUs
  // cannot be judged. Refused by default; under allow, left to run with the allocation written over all.
  enforcement::NodeView node;
  node.gpus = test::default_node();
  REQUIRE(node.gpus.size() >= 2);
  enforcement::ContainerView view;
  view.pod_namespace = "team-a";
  view.pod_name = "p";
  view.container = "app";
  view.selections["NVIDIA_VISIBLE_DEVICES"] = {.entries = 1, .last = "all"};
  enforcement::Allocation allocation;
  allocation.source = enforcement::Allocation::Source::pod_resources;
  allocation.gpus = {node.gpus[0].uuid};
  const enforcement::Decision refused = enforcement::decide(view, allocation, node, policy::Policy{});
  CHECK(refused.action == enforcement::Decision::Action::refuse);
  CHECK(refused.why == enforcement::Decision::Why::cannot_judge);
  CHECK_THAT(refused.message, Catch::Contains("the node's toolkit mode cannot be read"));
  policy::Policy allow;
  allow.node_enforcement_unknown = policy::NodeEnforcementUnknown::allow;
  const enforcement::Decision allowed = enforcement::decide(view, allocation, node, allow);
  CHECK(allowed.why == enforcement::Decision::Why::cannot_judge);
  CHECK(allowed.action == enforcement::Decision::Action::adjust);
  REQUIRE(allowed.set_env.contains("NVIDIA_VISIBLE_DEVICES"));
  CHECK(allowed.set_env.at("NVIDIA_VISIBLE_DEVICES") == node.gpus[0].uuid);
}

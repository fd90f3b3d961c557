#pragma once
// The admission core's entry points: AdmissionReview request JSON in, AdmissionReview response out
// (review), or the same decision as a list of exposures (examine, for the cluster audit). Pure: no I/O,
// no clocks, no Boost; safe to call from any number of threads at once. DRA claims are looked up through
// the ClaimLookup the caller passes, or treated as unknown without one.
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/admission/claims.hpp"
#include "gpuguard/policy/policy.hpp"

namespace gpuguard::admission {

// The doors to the GPUs (and to the other devices the NVIDIA runtime adds) besides NVIDIA_VISIBLE_DEVICES
// that a policy key governs, each with an action. The names are the gpuguard_doors_total labels.
enum class Door {
  privileged,
  host_device_mounts,
  cdi_annotations,
  runtime_classes,
  nvidia_cdi_annotations,
  feature_env_vars,
};
inline constexpr std::array<std::string_view, 6> kDoors = {
    "privileged",      "host_device_mounts",     "cdi_annotations",
    "runtime_classes", "nvidia_cdi_annotations", "feature_env_vars"};
inline constexpr std::array<std::string_view, 3> kActions = {"allow", "warn", "deny"};
// Containers found at each door (kDoors), by the action the policy takes (kActions).
using DoorCounts = std::array<std::array<std::size_t, kActions.size()>, kDoors.size()>;

struct ReviewOutcome {
  // false: the body is not an AdmissionReview we can answer; `body` then holds the reason (HTTP 400).
  bool ok = false;
  std::string body;
  // For logs and metrics.
  std::string uid;
  std::string operation;
  bool allowed = true;
  std::string denial;  // why, when !allowed
  bool patched = false;
  std::size_t warnings = 0;
  // Containers changed, by reason: injected, replaced, deduplicated, stripped (kMutationReasons).
  std::array<std::size_t, 4> mutations{};
  DoorCounts doors{};
  // The arm hook's probe pod, answered with arm_probe_warning: the server closes the connection after it.
  bool arm_probe = false;
};

inline constexpr std::array<std::string_view, 4> kMutationReasons = {"injected", "replaced", "deduplicated",
                                                                     "stripped"};

// Reviews up to this size are decoded by a parser that each thread keeps; a larger one gets a parser of
// its own, freed with it.
inline constexpr std::size_t kReusableParserLimit = std::size_t{256} * 1024;

// The arm hook's probe pod (webhook/arming.hpp) carries this annotation. A webhook that knows which one it
// is (`instance`: its namespace and Deployment, as the chart passes them, and " replica POD" where it knows
// its pod's name) then adds arm_probe_warning, so that the hook can tell its own release's webhook
// answered, not another release's or mutator's, and which replica. The policy applies to such a pod as to
// any other: the warnings, and the connection closed after the answer, are all the annotation adds.
inline constexpr std::string_view kArmProbeAnnotation = "gpuguard.io/arm-probe";
std::string arm_probe_warning(std::string_view instance);
// Under policy mode off, which changes and says nothing, the probe pod also gets this warning before
// arm_probe_warning, in words only the webhook uses, so that the hook can show the API server calls it
// in that mode as in the others.
inline constexpr std::string_view kArmProbeModeOffWarning =
    "policy mode off: the arm probe pod is admitted as sent, as every pod is";

// Takes the body by value so that the server can move its buffer in; the buffer is padded in place for
// simdjson, so reserving a little spare capacity up front avoids a copy. `instance`: see kArmProbeAnnotation.
ReviewOutcome review(std::string body, const policy::Policy& policy, const ClaimLookup* claims = nullptr,
                     std::string_view instance = {});

// One way a container of the pod can see GPUs it did not ask for, and what the webhook does about it.
struct Exposure {
  std::string container;  // its name
  std::string list;       // the Pod spec field it is in: containers, initContainers, ephemeralContainers
  std::string door;       // what exposes it: "image default", "user value", "privileged", "host device mount", ...
  std::string detail;     // the value, the volume, the annotation, ...
  std::string webhook;    // "sets none", "denies the pod", "warns", "nothing (exempt namespace)", ...
};

// A container named by the Pod spec field it is in.
struct ContainerRef {
  std::string container, list;
};

struct Examination {
  bool ok = false;
  std::string error;  // when !ok: as review's 400 reason
  std::vector<Exposure> exposures;
  bool exempt = false;  // the policy exempts the pod's namespace or service account
  bool mirror = false;  // a static pod's mirror, which the webhook never sees
  // The containers that request no GPU: on a node whose runtime does not honour the injected value, each
  // of them sees GPUs whatever the webhook does.
  std::vector<ContainerRef> gpu_less;
};

// What `review` would decide for this AdmissionReview, as exposures: every container that can see GPUs
// it did not ask for, found as if the pod were neither exempt nor the mode off, with what the policy in
// force actually does about it.
Examination examine(std::string body, const policy::Policy& policy, const ClaimLookup* claims = nullptr);

}  // namespace gpuguard::admission

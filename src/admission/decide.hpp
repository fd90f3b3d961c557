#pragma once
#include <array>
#include <map>
#include <string>
#include <vector>

#include "gpuguard/admission/claims.hpp"
#include "gpuguard/admission/review.hpp"
#include "gpuguard/policy/policy.hpp"
#include "model.hpp"

namespace gpuguard::admission {

using policy::Policy;

// One JSON Patch operation on a container's env: its place is kept as data, and encode writes the path.
struct PatchOperation {
  enum class Op { add, replace, remove };
  enum class Target { env, env_end, env_entry };    // .../env, .../env/-, .../env/<entry>
  enum class Value { none, env_entry, env_array };  // env_array: a one-entry array, for a missing env
  Op op;
  const Container* container;
  Target target;
  std::size_t entry = 0;  // the env index, for Target::env_entry
  Value value = Value::none;
};

// Why a container was changed; one per changed container. Indexes ReviewOutcome::mutations, named by
// kMutationReasons in the same order.
enum class Mutation { injected, replaced, deduplicated, stripped };

// A way a container can see GPUs it did not ask for, as decide() found it; the audit reports these.
struct Finding {
  enum class Kind {
    image_default,          // no NVIDIA_VISIBLE_DEVICES: the image's own value applies
    user_value,             // set in the pod, to something else than the injected value, or more than once
    gpu_user_value,         // set in a GPU container, over the device plugin's choice
    env_from,               // a GPU container's envFrom could set it
    privileged,             // sees every device node
    host_device_mount,      // a hostPath volume of the host's GPU device nodes or device lists
    cdi_annotation,         // the pod names CDI devices directly
    runtime_class,          // a RuntimeClass the policy lists
    nvidia_cdi_annotation,  // a nvidia.cdi.k8s.io annotation names CDI devices for the NRI plugin to inject
    feature_env_var,        // NVIDIA_GDS and the like: the runtime adds their devices under `none`
    unresolved_claim,       // a DRA claim that could not be looked up: treated as no GPU
  };
  const Container* container;
  Kind kind;
  std::string detail;
};

struct Decision {
  bool allowed = true;
  std::string denial;  // the status message when !allowed (code 403)
  std::vector<PatchOperation> patch;
  std::vector<std::string> warnings;
  std::map<std::string, std::string> audit_annotations;
  std::vector<Mutation> mutations;
  std::vector<Finding> findings;
  // The containers that request no GPU, whose isolation rests on the value injected (for the audit, which
  // joins them with their node's GPUIsolation condition).
  std::vector<const Container*> gpu_less;
  DoorCounts doors{};  // ReviewOutcome::doors
};

// `claims` may be null: every DRA claim is then unresolved.
Decision decide(const Review& review, const Policy& policy, const ClaimLookup* claims);

// `container "app"`, `init container "setup"`, `ephemeral container "debug"`.
std::string named(const Container& c);

// Kubernetes shows warnings only up to 120 characters; longer ones are cut at a character boundary.
inline constexpr std::size_t kMaxWarningLength = 120;
std::string bounded_warning(std::string text);

}  // namespace gpuguard::admission

#pragma once
#include <map>
#include <string>
#include <vector>

#include "gpuguard/policy/policy.hpp"
#include "model.hpp"

namespace gpuguard::admission {

using policy::Policy;

struct PatchOperation {
  enum class Op { add, replace, remove };
  enum class Value { none, env_entry, env_array };  // env_array: a one-entry array, for a missing env
  Op op;
  std::string path;
  Value value = Value::none;
};

// Why a container was changed; one per changed container. Indexes ReviewOutcome::mutations, named by
// kMutationReasons in the same order.
enum class Mutation { injected, replaced, deduplicated, stripped };

struct Decision {
  bool allowed = true;
  std::string denial;  // the status message when !allowed (code 403)
  std::vector<PatchOperation> patch;
  std::vector<std::string> warnings;
  std::map<std::string, std::string> audit_annotations;
  std::vector<Mutation> mutations;
};

Decision decide(const Review& review, const Policy& policy);

// Kubernetes shows warnings only up to 120 characters; longer ones are cut at a character boundary.
inline constexpr std::size_t kMaxWarningLength = 120;
std::string bounded_warning(std::string text);

}  // namespace gpuguard::admission

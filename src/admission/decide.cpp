#include "decide.hpp"

#include <algorithm>
#include <optional>

namespace gpuguard::admission {
namespace {

std::string env_path(const Container& c) {
  std::string path = "/spec/";
  path += names_of(c.list).field;
  path += '/';
  path += std::to_string(c.index);
  path += "/env";
  return path;
}

std::string env_entry_path(const Container& c, std::size_t env_index) {
  return env_path(c) + '/' + std::to_string(env_index);
}

// `container "app"`, `init container "setup"`, ...
std::string named(const Container& c) {
  std::string text(names_of(c.list).human);
  text += " \"";
  text += c.name;
  text += '"';
  return text;
}

std::string describe(const Container& c, std::string_view what) { return bounded_warning(named(c) + std::string(what)); }

bool asks_for_gpu(const Container& c, const Policy& policy) {
  return std::any_of(c.resources.begin(), c.resources.end(),
                     [&](const ResourceAmount& r) { return r.nonzero && policy.is_gpu_resource(r.name); });
}

bool already_running(const Container& c, const Review& review) {
  return c.list == ContainerList::ephemeral &&
         std::find(review.old_ephemeral_names.begin(), review.old_ephemeral_names.end(), c.name) !=
             review.old_ephemeral_names.end();
}

bool is_exact(const VisibleDevicesEntry& entry, const Policy& policy) {
  return entry.has_value && entry.value == policy.visible_devices_value && !entry.has_value_from;
}

// Does the container set NVIDIA_VISIBLE_DEVICES itself, beyond the one exact entry gpuguard injects?
bool sets_visible_devices_itself(const Container& c, bool gpu, const Policy& policy) {
  if (c.visible_devices.empty()) return false;
  return gpu || c.visible_devices.size() > 1 || !is_exact(c.visible_devices.front(), policy);
}

// Removals go from the highest index down so that each path still names the entry it meant.
void remove_entries(const Container& c, std::vector<VisibleDevicesEntry>::const_iterator first,
                    std::string_view why, Decision& decision) {
  for (auto it = c.visible_devices.end(); it != first;) {
    --it;
    decision.patch.push_back({PatchOperation::Op::remove, env_entry_path(c, it->env_index)});
    decision.warnings.push_back(describe(c, why));
  }
}

// Appends what enforce does to a container that asks for no GPU; returns why it changed, if it did.
std::optional<Mutation> hide_gpus(const Container& c, const Policy& policy, Decision& decision) {
  using Op = PatchOperation::Op;
  using Value = PatchOperation::Value;
  if (!c.env_is_array) {
    // An add to ".../env/-" fails to apply when env is missing, and the apiserver then rejects the pod
    // whatever the failurePolicy: create the whole array instead.
    decision.patch.push_back({Op::add, env_path(c), Value::env_array});
    return Mutation::injected;
  }
  if (c.visible_devices.empty()) {
    decision.patch.push_back({Op::add, env_path(c) + "/-", Value::env_entry});
    return Mutation::injected;
  }
  const bool kept_is_exact = is_exact(c.visible_devices.front(), policy);
  if (!kept_is_exact) {
    decision.patch.push_back({Op::replace, env_entry_path(c, c.visible_devices.front().env_index), Value::env_entry});
    decision.warnings.push_back(
        describe(c, ": NVIDIA_VISIBLE_DEVICES set in the pod was replaced with \"" + policy.visible_devices_value + '"'));
  }
  remove_entries(c, c.visible_devices.begin() + 1, ": duplicate NVIDIA_VISIBLE_DEVICES entry removed", decision);
  if (!kept_is_exact) return Mutation::replaced;
  if (c.visible_devices.size() > 1) return Mutation::deduplicated;
  return std::nullopt;
}

// Audit mode: the patch is withheld and the warnings say what enforce would have done.
// `facts` are warnings about the pod as it is (privileged containers), true in any mode.
void turn_into_audit(const Policy& policy, Decision& decision,
                     const std::vector<std::pair<const Container*, Mutation>>& changed, std::vector<std::string> facts) {
  std::vector<std::string> warnings;
  std::string would_patch;
  for (const auto& [container, mutation] : changed) {
    const std::string action = mutation == Mutation::stripped
                                   ? " would lose its NVIDIA_VISIBLE_DEVICES"
                                   : " would get NVIDIA_VISIBLE_DEVICES=" + policy.visible_devices_value;
    warnings.push_back(bounded_warning("audit: " + named(*container) + action));
    would_patch += would_patch.empty() ? "" : ", ";
    would_patch += container->name;
  }
  warnings.insert(warnings.end(), std::make_move_iterator(facts.begin()), std::make_move_iterator(facts.end()));
  if (!would_patch.empty()) decision.audit_annotations["would-patch"] = would_patch;
  if (!decision.allowed) {
    decision.audit_annotations["would-deny"] = decision.denial;
    warnings.push_back(bounded_warning("audit: the pod would be denied: " + decision.denial));
  }
  decision.allowed = true;
  decision.denial.clear();
  decision.patch.clear();
  decision.mutations.clear();
  decision.warnings = std::move(warnings);
}

}  // namespace

std::string bounded_warning(std::string text) {
  if (text.size() <= kMaxWarningLength) return text;
  std::size_t cut = kMaxWarningLength - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // UTF-8 continuation
  text.resize(cut);
  text += "...";
  return text;
}

Decision decide(const Review& review, const Policy& policy) {
  Decision decision;
  if (policy.mode == Mode::off) {
    decision.untouched_because = "policy mode off";
    return decision;
  }
  if (!review.has_pod) {
    decision.untouched_because = "not a Pod CREATE or pods/ephemeralcontainers UPDATE";
    return decision;
  }
  if (review.pod.mirror) {
    decision.untouched_because = "mirror pod";
    return decision;
  }
  if (policy.is_exempt(review.namespace_, review.pod.service_account)) {
    decision.untouched_because = "exempt namespace or service account";
    return decision;
  }

  std::vector<std::pair<const Container*, Mutation>> changed;
  std::vector<std::string> privileged_warnings;
  auto deny = [&](std::string reason) {
    if (decision.allowed) decision.denial = std::move(reason);
    decision.allowed = false;
  };
  for (const Container& c : review.pod.containers) {
    if (already_running(c, review)) continue;  // the apiserver refuses any change to it
    const bool gpu = asks_for_gpu(c, policy);
    if (policy.mode == Mode::strict && sets_visible_devices_itself(c, gpu, policy)) {
      deny(named(c) + " sets NVIDIA_VISIBLE_DEVICES itself, which policy mode strict does not allow");
    }
    std::optional<Mutation> mutation;
    if (gpu) {
      if (policy.strip_user_value_from_gpu_containers && !c.visible_devices.empty()) {
        remove_entries(c, c.visible_devices.begin(),
                       ": NVIDIA_VISIBLE_DEVICES set in the pod was removed; the device plugin assigns GPUs",
                       decision);
        mutation = Mutation::stripped;
      }
    } else {
      mutation = hide_gpus(c, policy, decision);
      if (c.privileged && policy.privileged == PrivilegedAction::warn) {
        privileged_warnings.push_back(describe(c, " is privileged and sees every GPU whatever NVIDIA_VISIBLE_DEVICES says"));
      } else if (c.privileged && policy.privileged == PrivilegedAction::deny) {
        deny(named(c) + " is privileged without requesting a GPU, so it would see every GPU whatever "
                        "NVIDIA_VISIBLE_DEVICES says");
      }
    }
    if (mutation) {
      decision.mutations.push_back(*mutation);
      changed.emplace_back(&c, *mutation);
    }
  }

  if (policy.mode == Mode::audit) {
    turn_into_audit(policy, decision, changed, std::move(privileged_warnings));
    return decision;
  }
  if (!decision.allowed) {  // nothing was changed, so only the reason is said
    decision.patch.clear();
    decision.mutations.clear();
    decision.warnings.clear();
    return decision;
  }
  decision.warnings.insert(decision.warnings.end(), std::make_move_iterator(privileged_warnings.begin()),
                           std::make_move_iterator(privileged_warnings.end()));
  return decision;
}

}  // namespace gpuguard::admission

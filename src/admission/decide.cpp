#include "decide.hpp"

#include <algorithm>
#include <optional>

namespace gpuguard::admission {
namespace {

using policy::Mode;
using policy::PrivilegedAction;

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

std::string describe(const Container& c, std::string_view what) {
  return bounded_warning(named(c) + std::string(what));
}

bool asks_for_gpu(const Container& c, const Policy& policy) {
  return std::any_of(c.resources.begin(), c.resources.end(),
                     [&](const ResourceAmount& r) { return r.nonzero && policy.is_gpu_resource(r.name); });
}

// The annotation that names the container a fractional GPU goes to; without it, the first container.
constexpr std::string_view kFractionContainerAnnotation = "gpu-fraction-container-name";

// The container a fractional-GPU scheduler (KAI-Scheduler, Run:ai) delivers a GPU share to, when the pod
// carries one of the policy's gpuAnnotations: the one gpu-fraction-container-name names (init
// containers first, as KAI looks it up), else the first container. nullptr when there is none. Only a
// pod for another scheduler than the default one is such a pod: the default scheduler hands out no
// shares, so on its pods the annotations would only let a user keep a valueFrom of their own.
const Container* annotated_gpu_container(const Pod& pod, const Policy& policy) {
  if (pod.scheduler.empty() || pod.scheduler == "default-scheduler") return nullptr;
  const auto annotation = [&](std::string_view key) {
    return std::find_if(pod.annotations.begin(), pod.annotations.end(),
                        [&](const Annotation& a) { return a.key == key; });
  };
  const bool asks = std::any_of(policy.gpu_annotations.begin(), policy.gpu_annotations.end(),
                                [&](const std::string& key) { return annotation(key) != pod.annotations.end(); });
  if (!asks) return nullptr;
  const auto named = annotation(kFractionContainerAnnotation);
  for (ContainerList list : {ContainerList::init, ContainerList::regular}) {
    for (const Container& c : pod.containers) {
      if (c.list != list) continue;
      if (named != pod.annotations.end() ? c.name == named->value : list == ContainerList::regular && c.index == 0)
        return &c;
    }
  }
  return nullptr;
}

// In a container the annotations mark, a valueFrom is how the scheduler delivers its GPU share: kept.
bool delivered_by_scheduler(const VisibleDevicesEntry& entry, bool annotated) {
  return annotated && entry.has_value_from;
}

// An envFrom source whose prefix is a proper prefix of the name can define NVIDIA_VISIBLE_DEVICES
// (a key equal to the rest of the name); "APP_" or the whole name cannot.
const EnvFromSource* env_from_that_could_set_visible_devices(const Container& c) {
  const auto it = std::find_if(c.env_from.begin(), c.env_from.end(), [](const EnvFromSource& source) {
    return source.prefix.size() < kVisibleDevices.size() && kVisibleDevices.starts_with(source.prefix);
  });
  return it == c.env_from.end() ? nullptr : &*it;
}

bool already_running(const Container& c, const Review& review) {
  return c.list == ContainerList::ephemeral &&
         std::find(review.old_ephemeral_names.begin(), review.old_ephemeral_names.end(), c.name) !=
             review.old_ephemeral_names.end();
}

bool is_exact(const VisibleDevicesEntry& entry, const Policy& policy) {
  return entry.has_value && entry.value == policy.visible_devices_value && !entry.has_value_from;
}

// Does the container set NVIDIA_VISIBLE_DEVICES itself, beyond the one exact entry gpuguard injects and
// the valueFrom a fractional-GPU scheduler delivers?
bool sets_visible_devices_itself(const Container& c, bool gpu, bool annotated, const Policy& policy) {
  if (c.visible_devices.empty()) return false;
  if (gpu) {
    return std::any_of(c.visible_devices.begin(), c.visible_devices.end(),
                       [&](const VisibleDevicesEntry& entry) { return !delivered_by_scheduler(entry, annotated); });
  }
  return c.visible_devices.size() > 1 || !is_exact(c.visible_devices.front(), policy);
}

// Removes the entries from `first` on that `keep` does not keep. Removals go from the highest index down
// so that each path still names the entry it meant. Returns whether any was removed.
template <typename Keep>
bool remove_entries(const Container& c, std::vector<VisibleDevicesEntry>::const_iterator first, std::string_view why,
                    Decision& decision, Keep keep) {
  bool removed = false;
  for (auto it = c.visible_devices.end(); it != first;) {
    --it;
    if (keep(*it)) continue;
    decision.patch.push_back({PatchOperation::Op::remove, env_entry_path(c, it->env_index)});
    decision.warnings.push_back(describe(c, why));
    removed = true;
  }
  return removed;
}

bool remove_entries(const Container& c, std::vector<VisibleDevicesEntry>::const_iterator first, std::string_view why,
                    Decision& decision) {
  return remove_entries(c, first, why, decision, [](const VisibleDevicesEntry&) { return false; });
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
    decision.warnings.push_back(describe(
        c, ": NVIDIA_VISIBLE_DEVICES set in the pod was replaced with \"" + policy.visible_devices_value + '"'));
  }
  remove_entries(c, c.visible_devices.begin() + 1, ": duplicate NVIDIA_VISIBLE_DEVICES entry removed", decision);
  if (!kept_is_exact) return Mutation::replaced;
  if (c.visible_devices.size() > 1) return Mutation::deduplicated;
  return std::nullopt;
}

// Audit mode: the patch is withheld and the warnings say what enforce would have done.
// `facts` are warnings about the pod as it is (privileged containers, envFrom), true in any mode.
void turn_into_audit(const Policy& policy, Decision& decision,
                     const std::vector<std::pair<const Container*, Mutation>>& changed,
                     std::vector<std::string> facts) {
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
  // Allowed as it is: policy mode off, not a Pod CREATE or pods/ephemeralcontainers UPDATE, a mirror pod,
  // or an exempt namespace or service account.
  if (policy.mode == Mode::off || !review.has_pod || review.pod.mirror ||
      policy.is_exempt(review.namespace_, review.pod.service_account)) {
    return decision;
  }

  std::vector<std::pair<const Container*, Mutation>> changed;
  std::vector<std::string> facts;
  std::string env_from_containers;
  auto deny = [&](std::string reason) {
    if (decision.allowed) decision.denial = std::move(reason);
    decision.allowed = false;
  };
  const Container* annotated_gpu = annotated_gpu_container(review.pod, policy);
  for (const Container& c : review.pod.containers) {
    if (already_running(c, review)) continue;  // the apiserver refuses any change to it
    const bool annotated = &c == annotated_gpu;
    const bool gpu = annotated || asks_for_gpu(c, policy);
    if (policy.mode == Mode::strict && sets_visible_devices_itself(c, gpu, annotated, policy)) {
      deny(named(c) + " sets NVIDIA_VISIBLE_DEVICES itself, which policy mode strict does not allow");
    }
    std::optional<Mutation> mutation;
    if (gpu) {
      const auto delivered = [&](const VisibleDevicesEntry& entry) { return delivered_by_scheduler(entry, annotated); };
      if (policy.strip_user_value_from_gpu_containers &&
          remove_entries(c, c.visible_devices.begin(),
                         ": NVIDIA_VISIBLE_DEVICES set in the pod was removed; the device plugin assigns GPUs",
                         decision, delivered)) {
        mutation = Mutation::stripped;
      }
      // The container's own variables come after the device plugin's, so an envFrom that defines the
      // name overrides the allocation; an explicit entry that stays would override the envFrom.
      const bool keeps_explicit_entry =
          std::any_of(c.visible_devices.begin(), c.visible_devices.end(), [&](const VisibleDevicesEntry& entry) {
            return delivered(entry) || !policy.strip_user_value_from_gpu_containers;
          });
      if (const EnvFromSource* source = env_from_that_could_set_visible_devices(c); source && !keeps_explicit_entry) {
        const std::string what = std::string(source->kind) + " \"" + std::string(source->name) + "\"";
        if (policy.mode == Mode::strict) {
          deny(named(c) + " takes variables from " + what +
               " (envFrom), which could set NVIDIA_VISIBLE_DEVICES and widen its GPUs; policy mode strict does not "
               "allow that");
        }
        facts.push_back(describe(c, ": envFrom " + what + " could set NVIDIA_VISIBLE_DEVICES and widen its GPUs"));
        env_from_containers += env_from_containers.empty() ? "" : ", ";
        env_from_containers += c.name;
      }
    } else {
      mutation = hide_gpus(c, policy, decision);
    }
    if (c.privileged && policy.privileged == PrivilegedAction::warn) {
      facts.push_back(gpu ? describe(c, " is privileged and sees every GPU, not only those it requested")
                          : describe(c, " is privileged and sees every GPU whatever NVIDIA_VISIBLE_DEVICES says"));
    } else if (c.privileged && policy.privileged == PrivilegedAction::deny) {
      deny(gpu ? named(c) + " is privileged, so it would see every GPU on the node, not only those it requested"
               : named(c) +
                     " is privileged without requesting a GPU, so it would see every GPU whatever "
                     "NVIDIA_VISIBLE_DEVICES says");
    }
    if (mutation) {
      decision.mutations.push_back(*mutation);
      changed.emplace_back(&c, *mutation);
    }
  }
  if (!env_from_containers.empty())
    decision.audit_annotations["env-from-may-set-visible-devices"] = env_from_containers;

  if (policy.mode == Mode::audit) {
    turn_into_audit(policy, decision, changed, std::move(facts));
    return decision;
  }
  if (!decision.allowed) {  // nothing was changed, so only the reason is said
    decision.patch.clear();
    decision.mutations.clear();
    decision.warnings.clear();
    return decision;
  }
  decision.warnings.insert(decision.warnings.end(), std::make_move_iterator(facts.begin()),
                           std::make_move_iterator(facts.end()));
  return decision;
}

}  // namespace gpuguard::admission

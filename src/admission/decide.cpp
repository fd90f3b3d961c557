#include "decide.hpp"

#include <algorithm>

namespace gpuguard::admission {
namespace {

std::string_view json_list_name(ContainerList list) {
  switch (list) {
    case ContainerList::init: return "initContainers";
    case ContainerList::ephemeral: return "ephemeralContainers";
    case ContainerList::regular: break;
  }
  return "containers";
}

std::string_view human_list_name(ContainerList list) {
  switch (list) {
    case ContainerList::init: return "init container";
    case ContainerList::ephemeral: return "ephemeral container";
    case ContainerList::regular: break;
  }
  return "container";
}

std::string env_path(const Container& c) {
  std::string path = "/spec/";
  path += json_list_name(c.list);
  path += '/';
  path += std::to_string(c.index);
  path += "/env";
  return path;
}

std::string env_entry_path(const Container& c, std::size_t env_index) {
  return env_path(c) + '/' + std::to_string(env_index);
}

std::string describe(const Container& c, std::string_view what) {
  std::string text(human_list_name(c.list));
  text += " \"";
  text += c.name;
  text += "\"";
  text += what;
  return bounded_warning(std::move(text));
}

bool asks_for_gpu(const Container& c, const Policy& policy) {
  return std::any_of(c.resources.begin(), c.resources.end(),
                     [&](const ResourceAmount& r) { return r.nonzero && policy.is_gpu_resource(r.name); });
}

bool already_running(const Container& c, const Review& review) {
  return c.list == ContainerList::ephemeral &&
         std::find(review.old_ephemeral_names.begin(), review.old_ephemeral_names.end(), c.name) !=
             review.old_ephemeral_names.end();
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

// Returns whether the container was changed.
bool hide_gpus(const Container& c, const Policy& policy, Decision& decision) {
  using Op = PatchOperation::Op;
  using Value = PatchOperation::Value;
  if (!c.env_is_array) {
    // An add to ".../env/-" fails to apply when env is missing, and the apiserver then rejects the pod
    // whatever the failurePolicy: create the whole array instead.
    decision.patch.push_back({Op::add, env_path(c), Value::env_array});
    return true;
  }
  if (c.visible_devices.empty()) {
    decision.patch.push_back({Op::add, env_path(c) + "/-", Value::env_entry});
    return true;
  }
  const VisibleDevicesEntry& kept = c.visible_devices.front();
  const bool kept_is_exact =
      kept.has_value && kept.value == policy.visible_devices_value && !kept.has_value_from;
  if (!kept_is_exact) {
    decision.patch.push_back({Op::replace, env_entry_path(c, kept.env_index), Value::env_entry});
    decision.warnings.push_back(
        describe(c, ": NVIDIA_VISIBLE_DEVICES set in the pod was replaced with \"" + policy.visible_devices_value + '"'));
  }
  remove_entries(c, c.visible_devices.begin() + 1, ": duplicate NVIDIA_VISIBLE_DEVICES entry removed", decision);
  return !kept_is_exact || c.visible_devices.size() > 1;
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
  if (!review.has_pod) {
    decision.untouched_because = "not a Pod CREATE or pods/ephemeralcontainers UPDATE";
    return decision;
  }
  if (review.pod.mirror) {
    decision.untouched_because = "mirror pod";
    return decision;
  }
  for (const Container& c : review.pod.containers) {
    if (already_running(c, review)) continue;  // the apiserver refuses any change to it
    bool changed = false;
    if (asks_for_gpu(c, policy)) {
      if (policy.strip_user_value_from_gpu_containers && !c.visible_devices.empty()) {
        remove_entries(c, c.visible_devices.begin(),
                       ": NVIDIA_VISIBLE_DEVICES set in the pod was removed; the device plugin assigns GPUs",
                       decision);
        changed = true;
      }
    } else {
      changed = hide_gpus(c, policy, decision);
      if (c.privileged) {
        decision.warnings.push_back(describe(c, " is privileged and sees every GPU whatever NVIDIA_VISIBLE_DEVICES says"));
      }
    }
    if (changed) ++decision.containers_mutated;
  }
  return decision;
}

}  // namespace gpuguard::admission

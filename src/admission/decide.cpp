#include "decide.hpp"

#include <algorithm>
#include <optional>

#include "gpuguard/k8s/host_path.hpp"

namespace gpuguard::admission {
namespace {

using policy::Action;
using policy::Mode;
using policy::SharingEnv;

std::string describe(const Container& c, std::string_view what) {
  return bounded_warning(named(c) + std::string(what));
}

bool asks_for_gpu(const Container& c, const Policy& policy) {
  return std::any_of(c.resources.begin(), c.resources.end(),
                     [&](const ResourceAmount& r) { return r.nonzero && policy.is_gpu_resource(r.name); });
}

// The first share of a GPU the container holds (sharedGpuResources), or nullptr.
const ResourceAmount* shared_gpu_of(const Container& c, const Policy& policy) {
  const auto share = std::find_if(c.resources.begin(), c.resources.end(), [&](const ResourceAmount& r) {
    return r.nonzero && policy.is_shared_gpu_resource(r.name);
  });
  return share == c.resources.end() ? nullptr : &*share;
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

// Does a hostPath volume of this path give a container the host's GPU device nodes, or the lists the
// NVIDIA toolkit reads devices from? The paths themselves, what lies under them, and the directories
// above them, whose mount contains them. And /dev/null: a toolkit that accepts device lists as volume
// mounts reads the host's /dev/null mounted at /var/run/nvidia-container-devices/<id> as a request for
// that device, `all` included (its internal/config/image requestsFromMounts). And the MPS daemons' pipe
// and shm directories: gpuguard's under /run/gpuguard (its chart keeps the MPS root there), NVIDIA's under
// /run/nvidia: through them a container reaches a shared GPU's MPS server.
bool reaches_gpu_devices(std::string_view host_path) {
  const std::string path = k8s::lexical_path(host_path);
  if (path == "/dev" || path == "/dev/null" || path.starts_with("/dev/nvidia") || k8s::is_or_under(path, "/dev/dri"))
    return true;
  for (std::string_view dir : {"/var/run/nvidia-container-devices", "/run/nvidia-container-devices", "/run/nvidia",
                               "/run/gpuguard", "/var/run/gpuguard"}) {
    if (k8s::is_or_under(path, dir)) return true;
  }
  return path == "/" || path == "/var" || path == "/var/run" || path == "/run";
}

constexpr std::string_view kCdiAnnotationPrefix = "cdi.k8s.io/";

// The annotations the NVIDIA Container Toolkit's NRI plugin (cmd/nvidia-ctk-installer/container/runtime/nri)
// reads CDI device names from; it has the container runtime inject those devices, whatever the env says.
constexpr std::string_view kNvidiaCdiDomain = "nvidia.cdi.k8s.io";
constexpr std::string_view kNvidiaCdiPodKey = "nvidia.cdi.k8s.io/pod";
constexpr std::string_view kNvidiaCdiContainerScope = "/container.";

// The annotation that names the container's CDI devices for the NRI plugin, as containerd's NRI library
// (GetEffectiveAnnotation) picks it: "nvidia.cdi.k8s.io/container.<name>", else "nvidia.cdi.k8s.io/pod",
// else "nvidia.cdi.k8s.io". nullptr when there is none.
const Annotation* nvidia_cdi_annotation(const Pod& pod, const Container& c) {
  const auto find = [&](auto matches) -> const Annotation* {
    const auto it = std::find_if(pod.annotations.begin(), pod.annotations.end(), matches);
    return it == pod.annotations.end() ? nullptr : &*it;
  };
  const Annotation* found = find([&](const Annotation& a) {
    return a.key.starts_with(kNvidiaCdiDomain) &&
           a.key.substr(kNvidiaCdiDomain.size()).starts_with(kNvidiaCdiContainerScope) &&
           a.key.substr(kNvidiaCdiDomain.size() + kNvidiaCdiContainerScope.size()) == c.name;
  });
  if (found == nullptr) found = find([](const Annotation& a) { return a.key == kNvidiaCdiPodKey; });
  if (found == nullptr) found = find([](const Annotation& a) { return a.key == kNvidiaCdiDomain; });
  return found;
}

// The annotation with which the runtime's NRI validator lets the pod start while a required plugin
// (gpuguard-node-enforcer, under fail-closed) is missing. NRI reads it from the pod, under the key itself,
// "<key>/pod" or "<key>/container.<name>", whatever its value (an unparsable one is refused there, not
// here). Nothing when the node enforcer is off or leaves the pod alone anyway.
const Annotation* nri_toleration(const Review& review, const Policy& policy) {
  const std::string_view key = policy.nri_toleration_annotation;
  if (key.empty() || policy.node_enforcement == policy::NodeEnforcement::off ||
      policy.is_node_enforcement_exempt(review.namespace_, review.pod.service_account.empty()
                                                               ? std::string_view("default")
                                                               : review.pod.service_account)) {
    return nullptr;
  }
  const auto it = std::find_if(review.pod.annotations.begin(), review.pod.annotations.end(), [&](const Annotation& a) {
    if (!a.key.starts_with(key)) return false;
    const std::string_view rest = a.key.substr(key.size());
    return rest.empty() || rest == "/pod" || rest.starts_with("/container.");
  });
  return it == review.pod.annotations.end() ? nullptr : &*it;
}

std::string nri_toleration_denial(const Annotation& annotation) {
  return "the annotation " + std::string(annotation.key) +
         " would let the pod's containers start without gpuguard-node-enforcer where the node requires it; "
         "only pods the node enforcer exempts (the policy's exempt and nodeEnforcementExempt keys) may carry it";
}

// Does this entry make the NVIDIA runtime add the variable's devices? The feature gates take exactly
// "enabled", as the toolkit compares it. IMEX channels take a list of channel numbers; the toolkit ignores
// empty, none and void (and "all" since 1.18, but earlier versions pass it on), so anything else counts. A
// valueFrom cannot be read here, so it counts too.
bool enables_devices(const FeatureEntry& entry) {
  if (entry.has_value_from) return true;
  if (entry.name != kImexChannels) return entry.value == "enabled";
  return !entry.value.empty() && entry.value != "none" && entry.value != "void";
}

// Does the container get a GPU through DRA: a claim (or the one request of it that it names) asking for a
// device of a GPU device class? A claim that cannot be looked up counts as no GPU, and is reported in
// `unresolved` ("name: why"), so that a container never sees GPUs through an unknown claim's door.
bool claims_gpu(const Container& c, const Review& review, const Policy& policy, const ClaimLookup* claims,
                std::vector<std::string>& unresolved) {
  bool gpu = false;
  for (const ClaimUse& use : c.claims) {
    const auto pod_claim = std::find_if(review.pod.resource_claims.begin(), review.pod.resource_claims.end(),
                                        [&](const PodClaim& p) { return p.name == use.name; });
    if (pod_claim == review.pod.resource_claims.end()) continue;  // the apiserver refuses such a pod
    const bool from_template = pod_claim->claim.empty();
    const std::string_view object = from_template ? pod_claim->claim_template : pod_claim->claim;
    ClaimLookupResult found;
    if (claims != nullptr) {
      found =
          from_template ? claims->claim_template(review.namespace_, object) : claims->claim(review.namespace_, object);
    }
    if (found.status != ClaimLookupResult::Status::found) {
      std::string why = std::string(from_template ? "ResourceClaimTemplate \"" : "ResourceClaim \"")
                            .append(object)
                            .append(found.status == ClaimLookupResult::Status::unknown ? "\" is not known"
                                                                                       : "\" cannot be looked up yet");
      unresolved.push_back(std::move(why));
      continue;
    }
    for (const ClaimRequest& request : found.requests) {
      if (!use.request.empty() && request.name != use.request) continue;
      gpu =
          gpu || std::any_of(request.device_classes.begin(), request.device_classes.end(),
                             [&](const std::string& device_class) { return policy.is_gpu_device_class(device_class); });
    }
  }
  return gpu;
}

// Appends `name` to a comma-separated audit annotation, once.
void annotate(Decision& decision, const std::string& key, std::string_view name) {
  std::string& value = decision.audit_annotations[key];
  std::string_view rest = value;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(", ");
    if (rest.substr(0, comma) == name) return;
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 2);
  }
  if (!value.empty()) value += ", ";
  value += name;
}

bool already_running(const Container& c, const Review& review) {
  return c.list == ContainerList::ephemeral &&
         std::find(review.old_ephemeral_names.begin(), review.old_ephemeral_names.end(), c.name) !=
             review.old_ephemeral_names.end();
}

// A GPU-less container's entry kept as it is: the policy's value, or void, which hides strictly more than
// none (the toolkit sets nothing up for it, where none still mounts the driver's libraries) and which
// NVIDIA's own components set on purpose (the DRA driver's kubelet plugin).
bool is_exact(const VisibleDevicesEntry& entry, const Policy& policy) {
  return entry.has_value && !entry.has_value_from &&
         (entry.value == policy.visible_devices_value || entry.value == "void");
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
    decision.patch.push_back({PatchOperation::Op::remove, &c, PatchOperation::Target::env_entry, it->env_index});
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
  using Target = PatchOperation::Target;
  using Value = PatchOperation::Value;
  if (!c.env_is_array) {
    // An add to ".../env/-" fails to apply when env is missing, and the apiserver then rejects the pod
    // whatever the failurePolicy: create the whole array instead.
    decision.patch.push_back({Op::add, &c, Target::env, 0, Value::env_array});
    return Mutation::injected;
  }
  if (c.visible_devices.empty()) {
    decision.patch.push_back({Op::add, &c, Target::env_end, 0, Value::env_entry});
    return Mutation::injected;
  }
  const bool kept_is_exact = is_exact(c.visible_devices.front(), policy);
  if (!kept_is_exact) {
    decision.patch.push_back(
        {Op::replace, &c, Target::env_entry, c.visible_devices.front().env_index, Value::env_entry});
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
                                   ? " would lose the GPU variables it sets itself"
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

// One decision being made: the decision, the warnings that are facts about the pod (true in any mode), the
// containers changed, and the two ways a door acts.
struct Pass {
  Pass(const Review& r, const Policy& p) : review(r), policy(p) {
    // At most one patch operation, mutation, finding and GPU-less entry per container in the common case:
    // one allocation each.
    const std::size_t containers = review.pod.containers.size();
    decision.patch.reserve(containers);
    decision.mutations.reserve(containers);
    decision.findings.reserve(containers);
    decision.gpu_less.reserve(containers);
    changed.reserve(containers);
    cdi_annotation = std::find_if(review.pod.annotations.begin(), review.pod.annotations.end(),
                                  [](const Annotation& a) { return a.key.starts_with(kCdiAnnotationPrefix); });
    listed_runtime_class =
        !review.pod.runtime_class.empty() && std::find(policy.runtime_classes.begin(), policy.runtime_classes.end(),
                                                       review.pod.runtime_class) != policy.runtime_classes.end();
  }

  void deny(std::string reason) {
    if (decision.allowed) decision.denial = std::move(reason);
    decision.allowed = false;
  }

  // A door a policy key governs: warn says so (and annotates the audit log), deny refuses the pod.
  void door(Door which, Action action, const Container& c, Finding::Kind kind, std::string detail,
            const std::string& warning, const std::string& denial, const std::string& annotation,
            std::string_view annotated_name) {
    ++decision.doors[static_cast<std::size_t>(which)][static_cast<std::size_t>(action)];
    decision.findings.push_back({&c, kind, std::move(detail)});
    if (action == Action::warn) {
      facts.push_back(bounded_warning(warning));
      annotate(decision, annotation, annotated_name);
    } else if (action == Action::deny) {
      deny(denial);
    }
  }

  // Audit turns refusals and patches into warnings; a refusal drops the patch; otherwise the facts follow
  // the patch's own warnings.
  Decision finish() {
    if (policy.mode == Mode::audit) {
      turn_into_audit(policy, decision, changed, std::move(facts));
      return std::move(decision);
    }
    if (!decision.allowed) {  // nothing was changed, so only the reason is said
      decision.patch.clear();
      decision.mutations.clear();
      decision.warnings.clear();
      return std::move(decision);
    }
    decision.warnings.insert(decision.warnings.end(), std::make_move_iterator(facts.begin()),
                             std::make_move_iterator(facts.end()));
    return std::move(decision);
  }

  const Review& review;
  const Policy& policy;
  Decision decision;
  std::vector<std::pair<const Container*, Mutation>> changed;
  std::vector<std::string> facts;
  std::vector<Annotation>::const_iterator cdi_annotation;
  bool listed_runtime_class = false;
};

// What the webhook exempts, the node enforcer exempts too: a pod that gets here may not opt out of it.
void nri_toleration_door(Pass& pass) {
  if (const Annotation* toleration = nri_toleration(pass.review, pass.policy); toleration != nullptr) {
    pass.deny(nri_toleration_denial(*toleration));
  }
}

// gpuguard's device plugin's allocation key belongs on containers, where the kubelet puts it from Allocate;
// on a pod it is a forgery (the node enforcer never trusts it there), refused outright.
constexpr std::string_view kAllocationAnnotation = "gpuguard.io/allocated-gpus";

void allocation_annotation_door(Pass& pass) {
  if (std::any_of(pass.review.pod.annotations.begin(), pass.review.pod.annotations.end(),
                  [](const Annotation& a) { return a.key == kAllocationAnnotation; })) {
    pass.deny("the annotation " + std::string(kAllocationAnnotation) +
              " is gpuguard's device plugin's, which the kubelet puts on containers; a pod may not carry it");
  }
}

void strict_door(Pass& pass, const Container& c, bool gpu, bool annotated) {
  if (pass.policy.mode == Mode::strict && sets_visible_devices_itself(c, gpu, annotated, pass.policy)) {
    pass.deny(named(c) + " sets NVIDIA_VISIBLE_DEVICES itself, which policy mode strict does not allow");
  }
}

// A GPU container loses the NVIDIA_VISIBLE_DEVICES it sets itself: the device plugin sets it.
std::optional<Mutation> gpu_container_env(Pass& pass, const Container& c, bool annotated) {
  std::optional<Mutation> mutation;
  const auto delivered = [&](const VisibleDevicesEntry& entry) { return delivered_by_scheduler(entry, annotated); };
  if (pass.policy.strip_user_value_from_gpu_containers &&
      remove_entries(c, c.visible_devices.begin(),
                     ": NVIDIA_VISIBLE_DEVICES set in the pod was removed; the device plugin assigns GPUs",
                     pass.decision, delivered)) {
    mutation = Mutation::stripped;
  }
  if (std::any_of(c.visible_devices.begin(), c.visible_devices.end(),
                  [&](const VisibleDevicesEntry& entry) { return !delivered(entry); })) {
    pass.decision.findings.push_back({&c, Finding::Kind::gpu_user_value, {}});
  }
  return mutation;
}

// A share of a GPU is what the device plugin's variables say (the MPS pipe, the limits, the one GPU): the
// pod's own come after them in the container's environment, and would win.
void sharing_env_door(Pass& pass, const Container& c, std::optional<Mutation>& mutation) {
  const ResourceAmount* share = shared_gpu_of(c, pass.policy);
  if (share == nullptr || c.sharing_variables.empty()) return;
  if (pass.policy.sharing_env_vars == SharingEnv::deny) {
    pass.deny(named(c) + " holds " + std::string(share->name) + ", a share of a GPU, and sets " +
              std::string(c.sharing_variables.front().name) +
              " itself, which would override the share's; policy sharingEnvVars deny does not allow that");
  } else if (pass.policy.sharing_env_vars == SharingEnv::strip) {
    // This container's removals so far are of NVIDIA_VISIBLE_DEVICES, last index first.
    const auto first_operation = std::find_if(pass.decision.patch.begin(), pass.decision.patch.end(),
                                              [&](const PatchOperation& op) { return op.container == &c; });
    const std::ptrdiff_t first = first_operation - pass.decision.patch.begin();
    for (auto entry = c.sharing_variables.rbegin(); entry != c.sharing_variables.rend(); ++entry) {
      pass.decision.patch.push_back(
          {PatchOperation::Op::remove, &c, PatchOperation::Target::env_entry, entry->env_index});
      pass.decision.warnings.push_back(describe(
          c, ": " + std::string(entry->name) + " set in the pod was removed; a GPU share's are the device plugin's"));
    }
    mutation = Mutation::stripped;
    // This container's removals, of NVIDIA_VISIBLE_DEVICES and of these, last index first: each removal
    // then still names the entry it was meant for.
    std::sort(pass.decision.patch.begin() + first, pass.decision.patch.end(),
              [](const PatchOperation& a, const PatchOperation& b) { return a.entry > b.entry; });
  }
}

// The container's own variables come after the device plugin's, so an envFrom that defines the name
// overrides the allocation; an explicit entry that stays would override the envFrom.
void env_from_door(Pass& pass, const Container& c, bool annotated) {
  const bool keeps_explicit_entry =
      std::any_of(c.visible_devices.begin(), c.visible_devices.end(), [&](const VisibleDevicesEntry& entry) {
        return delivered_by_scheduler(entry, annotated) || !pass.policy.strip_user_value_from_gpu_containers;
      });
  const EnvFromSource* source = env_from_that_could_set_visible_devices(c);
  if (source == nullptr || keeps_explicit_entry) return;
  const std::string what = std::string(source->kind) + " \"" + std::string(source->name) + "\"";
  if (pass.policy.mode == Mode::strict) {
    pass.deny(named(c) + " takes variables from " + what +
              " (envFrom), which could set NVIDIA_VISIBLE_DEVICES and widen its GPUs; policy mode strict does not "
              "allow that");
  }
  pass.facts.push_back(describe(c, ": envFrom " + what + " could set NVIDIA_VISIBLE_DEVICES and widen its GPUs"));
  annotate(pass.decision, "env-from-may-set-visible-devices", c.name);
  pass.decision.findings.push_back({&c, Finding::Kind::env_from, what});
}

// A container that asks for no GPU ends with exactly one NVIDIA_VISIBLE_DEVICES at the policy's value.
std::optional<Mutation> gpu_less_env(Pass& pass, const Container& c, const std::vector<std::string>& unresolved) {
  pass.decision.gpu_less.push_back(&c);
  const std::optional<Mutation> mutation = hide_gpus(c, pass.policy, pass.decision);
  if (mutation == Mutation::injected) pass.decision.findings.push_back({&c, Finding::Kind::image_default, {}});
  // The runtime takes the last of duplicate entries, so any entry other than the exact one exposes GPUs.
  const auto exposing = std::find_if(c.visible_devices.begin(), c.visible_devices.end(),
                                     [&](const VisibleDevicesEntry& entry) { return !is_exact(entry, pass.policy); });
  if (exposing != c.visible_devices.end()) {
    std::string value = exposing->has_value_from ? "valueFrom" : std::string(exposing->value);
    if (c.visible_devices.size() > 1) value += " (set " + std::to_string(c.visible_devices.size()) + " times)";
    pass.decision.findings.push_back({&c, Finding::Kind::user_value, std::move(value)});
  }
  for (const std::string& why : unresolved) {
    pass.facts.push_back(describe(c, ": " + why + ", so it is treated as requesting no GPU"));
    annotate(pass.decision, "unresolved-claims", c.name);
    pass.decision.findings.push_back({&c, Finding::Kind::unresolved_claim, why});
  }
  return mutation;
}

void host_device_mounts_door(Pass& pass, const Container& c) {
  for (const std::string_view mount : c.volume_mounts) {
    const auto volume = std::find_if(pass.review.pod.host_paths.begin(), pass.review.pod.host_paths.end(),
                                     [&](const HostPathVolume& v) { return v.name == mount; });
    if (volume == pass.review.pod.host_paths.end() || !reaches_gpu_devices(volume->path)) continue;
    const std::string what =
        "the host's " + std::string(volume->path) + " (hostPath volume \"" + std::string(volume->name) + "\")";
    pass.door(Door::host_device_mounts, pass.policy.host_device_mounts, c, Finding::Kind::host_device_mount, what,
              named(c) + " mounts " + what + " without requesting a GPU",
              named(c) + " mounts " + what + ", which reaches GPU devices, without requesting a GPU",
              "host-device-mounts", c.name);
  }
}

void cdi_annotations_door(Pass& pass, const Container& c) {
  if (pass.cdi_annotation == pass.review.pod.annotations.end()) return;
  const std::string key(pass.cdi_annotation->key);
  pass.door(Door::cdi_annotations, pass.policy.cdi_annotations, c, Finding::Kind::cdi_annotation, key,
            "the annotation " + key + " names CDI devices, and " + named(c) + " requests no GPU",
            "the annotation " + key + " names CDI devices directly, and " + named(c) + " requests no GPU",
            "cdi-annotations", key);
}

void nvidia_cdi_annotations_door(Pass& pass, const Container& c) {
  const Annotation* nri = nvidia_cdi_annotation(pass.review.pod, c);
  if (nri == nullptr || nri->value.empty()) return;
  const std::string key(nri->key);
  pass.door(Door::nvidia_cdi_annotations, pass.policy.nvidia_cdi_annotations, c, Finding::Kind::nvidia_cdi_annotation,
            key, "the annotation " + key + " names CDI devices for " + named(c) + ", which requests no GPU",
            "the annotation " + key + " names CDI devices for the NVIDIA NRI plugin to inject into " + named(c) +
                ", which requests no GPU",
            "nvidia-cdi-annotations", c.name);
}

// Under void the runtime sets nothing up for the container, so these variables take no effect: void from
// the policy, or the container's own, which the webhook keeps (its first entry, the one that stays).
void feature_env_vars_door(Pass& pass, const Container& c) {
  if (pass.policy.visible_devices_value == "void") return;
  if (!c.visible_devices.empty() && is_exact(c.visible_devices.front(), pass.policy) &&
      c.visible_devices.front().value == "void") {
    return;
  }
  for (auto it = c.feature_variables.begin(); it != c.feature_variables.end(); ++it) {
    // The last entry of a name is the one the runtime sees.
    const bool last = std::none_of(it + 1, c.feature_variables.end(),
                                   [&](const FeatureEntry& later) { return later.name == it->name; });
    if (!last || !enables_devices(*it)) continue;
    // Built by appending: GCC 12 at -O2 warns falsely (-Wrestrict) on this chain of operator+ once inlined.
    std::string what(it->name);
    if (it->has_value_from) {
      what.append(" through valueFrom");
    } else {
      what.append("=").append(it->value);
    }
    pass.door(Door::feature_env_vars, pass.policy.feature_env_vars, c, Finding::Kind::feature_env_var, what,
              named(c) + " requests no GPU but sets " + what + ", with which the NVIDIA runtime adds devices",
              named(c) + " requests no GPU but sets " + what +
                  ", with which the NVIDIA runtime adds devices besides GPUs to it",
              "feature-env-vars", c.name);
  }
}

void runtime_class_door(Pass& pass, const Container& c) {
  if (!pass.listed_runtime_class) return;
  const std::string runtime_class(pass.review.pod.runtime_class);
  pass.door(Door::runtime_classes, pass.policy.runtime_class_action, c, Finding::Kind::runtime_class, runtime_class,
            "runtimeClassName \"" + runtime_class + "\" is in the policy's runtimeClasses, and " + named(c) +
                " requests no GPU",
            "runtimeClassName \"" + runtime_class + "\" is in the policy's runtimeClasses, and " + named(c) +
                " requests no GPU",
            "runtime-class", runtime_class);
}

void privileged_door(Pass& pass, const Container& c, bool gpu) {
  if (!c.privileged) return;
  pass.door(Door::privileged, pass.policy.privileged, c, Finding::Kind::privileged, {},
            gpu ? named(c) + " is privileged and sees every GPU, not only those it requested"
                : named(c) + " is privileged and sees every GPU whatever NVIDIA_VISIBLE_DEVICES says",
            gpu ? named(c) + " is privileged, so it would see every GPU on the node, not only those it requested"
                : named(c) +
                      " is privileged without requesting a GPU, so it would see every GPU whatever "
                      "NVIDIA_VISIBLE_DEVICES says",
            "privileged", c.name);
}

}  // namespace

std::string named(const Container& c) {
  std::string text(names_of(c.list).human);
  text += " \"";
  text += c.name;
  text += '"';
  return text;
}

std::string bounded_warning(std::string text) {
  if (text.size() <= kMaxWarningLength) return text;
  std::size_t cut = kMaxWarningLength - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // UTF-8 continuation
  text.resize(cut);
  text += "...";
  return text;
}

Decision decide(const Review& review, const Policy& policy, const ClaimLookup* claims) {
  // Allowed as it is: policy mode off, not a Pod CREATE or pods/ephemeralcontainers UPDATE, a mirror pod,
  // or an exempt namespace or service account.
  if (policy.mode == Mode::off || !review.has_pod || review.pod.mirror ||
      policy.is_exempt(review.namespace_, review.pod.service_account)) {
    return {};
  }
  Pass pass(review, policy);
  nri_toleration_door(pass);
  allocation_annotation_door(pass);
  const Container* annotated_gpu = annotated_gpu_container(review.pod, policy);
  // The runtime-class door is the pod's: a GPU pod must name NVIDIA's class wherever NVIDIA's runtime is not
  // the node's default (the GPU Operator's CDI defaults), and its GPU-less sidecars get none all the same.
  if (pass.listed_runtime_class) {
    pass.listed_runtime_class =
        std::none_of(review.pod.containers.begin(), review.pod.containers.end(), [&](const Container& c) {
          std::vector<std::string> unresolved;
          return &c == annotated_gpu || asks_for_gpu(c, policy) || claims_gpu(c, review, policy, claims, unresolved);
        });
  }
  for (const Container& c : review.pod.containers) {
    if (already_running(c, review)) continue;  // the apiserver refuses any change to it
    const bool annotated = &c == annotated_gpu;
    std::vector<std::string> unresolved;
    const bool gpu = annotated || asks_for_gpu(c, policy) || claims_gpu(c, review, policy, claims, unresolved);
    strict_door(pass, c, gpu, annotated);
    std::optional<Mutation> mutation;
    if (gpu) {
      mutation = gpu_container_env(pass, c, annotated);
      sharing_env_door(pass, c, mutation);
      env_from_door(pass, c, annotated);
    } else {
      mutation = gpu_less_env(pass, c, unresolved);
      host_device_mounts_door(pass, c);
      cdi_annotations_door(pass, c);
      nvidia_cdi_annotations_door(pass, c);
      feature_env_vars_door(pass, c);
      runtime_class_door(pass, c);
    }
    privileged_door(pass, c, gpu);
    if (mutation) {
      pass.decision.mutations.push_back(*mutation);
      pass.changed.emplace_back(&c, *mutation);
    }
  }
  return pass.finish();
}

}  // namespace gpuguard::admission

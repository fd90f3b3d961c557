#pragma once
// Arming: the install turns the objects that refuse pods on only once the webhook can answer. The chart
// installs the webhook configuration at failurePolicy Ignore and the backstop's binding at Warn and
// Audit; `gpuguard-webhook arm` (a post-install hook) waits until a replica of the webhook is available,
// then patches them to Fail and Deny. This is its decision, pure: the objects as the API serves them in,
// what to do out, so that a first install whose image cannot be pulled refuses no pod anywhere.
#include <compare>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::webhook::arming {

// A Deployment's name as the arm hook (--deployment) and the webhook (--instance NAMESPACE/DEPLOYMENT) take
// the webhook's, and a pod's as the webhook takes its own (--replica): an RFC 1123 subdomain of at most 63
// characters, as the chart's names are and as the API server generates a Deployment's pods' names.
bool is_deployment_name(std::string_view name);

// Whether a Deployment (its JSON) has a replica available to answer; `waiting` says what is missing.
// `rolled_out`: also every replica of its current template (no rollout under way, its controller has seen
// the newest spec), so that replicas told apart (below) are not waited for while an older version's, which
// name no pod, are still ready; a replica that cannot be scheduled does not hold it.
struct Availability {
  bool available = false;
  std::string waiting;  // "0 of 3 replicas available", "the Deployment is not there yet", ...
};
Availability deployment_availability(std::string_view deployment_json, bool rolled_out = false);

// An object's metadata.uid (its JSON), or "" where it has none: the hook's Warning Event names the
// Deployment by it, since `kubectl describe` shows only the events of the object with that UID.
std::string metadata_uid(std::string_view object_json);

// Whether a DaemonSet (its JSON) has a ready pod of its current template on every node it should run on, as
// `kubectl rollout status` judges one: its controller has seen its generation, and every scheduled pod is
// updated and ready. The uninstall hook (`gpuguard-webhook await-rollout`) waits on it for the node cleanup,
// whose pods are ready once their node has forgotten gpuguard; `waiting` says what is missing.
Availability daemonset_rollout(std::string_view daemonset_json);

// The label selector of a DaemonSet's pods (`spec.selector.matchLabels`, as `k=v,k=v`), to list them; empty when
// it has none that this can say (matchExpressions only, or not a DaemonSet's JSON).
std::string daemonset_pod_selector(std::string_view daemonset_json);

// One page of a PodList: where each pod that is not Ready runs (its node's name, or `pod <name>, on no node`),
// and the list's `continue` token (empty on the last page); `error` when it is not a PodList's JSON. So that
// the uninstall hook, when the cleanup is not done in time, names the nodes that are not clean.
struct PodsNotReady {
  std::vector<std::string> where;
  std::string next;
  std::string error;
};
PodsNotReady pods_not_ready(std::string_view pod_list_json);

// What to send to arm one object: a JSON Patch (RFC 6902) for application/json-patch+json, nothing when it
// is armed already, or the reason it cannot be armed (not JSON, no webhook of that name).
struct Step {
  std::optional<std::string> patch;  // absent: armed already (or `error`)
  std::string error;
};
// failurePolicy Fail on the webhook named `webhook` of a MutatingWebhookConfiguration; the patch tests
// the webhook's name at its index first, so a configuration changed meanwhile is not patched blindly.
Step webhook_step(std::string_view configuration_json, std::string_view webhook);
// validationActions [Deny] on a ValidatingAdmissionPolicyBinding.
Step binding_step(std::string_view binding_json);

// The probe: before arming, a pod is created as a server-side dry run (nothing is stored) in a namespace
// the webhook covers. A ready replica shows only that the kubelet reaches it; the API server may not (a
// NetworkPolicy its calls do not match, cilium/cilium#14724, a caBundle that does not match). Until armed,
// failurePolicy is Ignore, so a call that fails admits the pod as sent. The pod asks for no GPU and sets
// NVIDIA_VISIBLE_DEVICES=all, as a CUDA image does, so that the webhook answers it in words only it uses:
// the value replaced with the webhook's warning saying so (policy mode enforce), its audit warning (mode
// audit), its refusal of a pod that sets the variable itself (mode strict), or its warning that it admits
// the pod as sent (mode off, admission::kArmProbeModeOffWarning). Another mutator that sets
// or overwrites the variable (a policy engine's default, a merge by name) says none of them, so it does
// not pass for the webhook. The pod carries admission::kArmProbeAnnotation, and the webhook adds a warning
// naming itself (its namespace and Deployment): another gpuguard release's webhook says the same words
// but another name, so it does not pass for this release's either.
// The pod, as JSON: Pod Security restricted, tiny requests and limits (so that a quota admits it), named
// `generate_name` plus a suffix the API server picks, naming `image` (never pulled: nothing runs).
std::string probe_pod_json(std::string_view generate_name, std::string_view image);
struct ProbeResult {
  bool reached = false;
  std::string why;      // what showed it, or why it is not shown
  std::string replica;  // reached: the pod name the answering replica said (--replica), empty when none
};
// The API server's answer to that create: its status (0: none came), body, Warning headers and error;
// `instance`: the webhook to be shown, NAMESPACE/DEPLOYMENT (its --instance).
ProbeResult probe_result(unsigned status, std::string_view body, const std::vector<std::string>& warnings,
                         std::string_view error, std::string_view instance);

// Replicas told apart. The API server keeps its connection to a webhook, so ten answers may all come from one
// replica while another, which its calls cannot reach, answers nothing until a call lands there under
// failurePolicy Fail. A webhook given --replica names its pod too ("NAMESPACE/DEPLOYMENT replica POD"), and
// closes the connection after answering a probe pod, so that the API server's next call may land on
// another replica. The hook then arms only once every ready endpoint of the webhook's Service has answered.
std::string replica_identity(std::string_view instance, std::string_view replica);
// The ready endpoints of a Service, from its EndpointSliceList (discovery.k8s.io/v1): each named by its
// pod (targetRef), or "address A" where it names none (no replica says that, so it is never heard);
// sorted, once each (a dual-stack Service lists a pod in two slices). Not ready: `ready` false (absent is
// ready, as the API defines it). `error`: the list is not one.
struct ReadyReplicas {
  std::vector<std::string> names;
  std::string error;
};
ReadyReplicas ready_replicas(std::string_view endpoint_slices_json);

// The API servers the EndpointSlice `kubernetes` (the one the API servers write for the Service of that name)
// names: each ready endpoint's first address, with the slice's port named https (or its only port), as host
// and port; sorted, once each, at most kMostApiServers (a slice naming more is an error: no control plane
// runs that many). A slice of another address family than `verified_host` (the address the certificates are
// checked against; a name: either family), or of FQDNs, is an error, as is a ready endpoint without an
// address or a slice without the port. `error`: why none are given.
inline constexpr std::size_t kMostApiServers = 16;
struct ApiServerAddress {
  std::string host, port;
  auto operator<=>(const ApiServerAddress&) const = default;
};
struct ApiServers {
  std::vector<ApiServerAddress> addresses;
  std::string error;
};
ApiServers api_servers(std::string_view endpoint_slice_json, std::string_view verified_host);

}  // namespace gpuguard::webhook::arming

// The hot path. simdjson's DOM parser turns the review into its tape with the best SIMD kernel the CPU has
// (libsimdjson picks it at run time), checking every byte and unescaping every string on the way; the
// decoder then reads only the fields the decision needs. Everything else, most of a Pod, is stepped over
// in one move, because the tape records where each object and array ends.
#include "decode.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <utility>

#include "gpuguard/k8s/quantity.hpp"

namespace gpuguard::admission {
namespace {

using simdjson::error_code;
using Element = std::optional<dom::element>;  // empty: the field is absent

// A JSON path for error messages, in two parts so that the hot path never concatenates strings.
struct Path {
  Path(const char* whole) : prefix(whole) {}
  Path(std::string_view whole) : prefix(whole) {}
  Path(std::string_view p, std::string_view s) : prefix(p), suffix(s) {}
  std::string_view prefix, suffix;
};

[[noreturn]] void fail(const Path& path, std::string_view problem) {
  std::string message(path.prefix);
  message += path.suffix;
  message += ": ";
  message += problem;
  throw DecodeError(message);
}

[[noreturn]] void fail(const Path& path, error_code error, std::string_view expected) {
  if (error == simdjson::INCORRECT_TYPE) fail(path, std::string("must be ") + std::string(expected));
  fail(path, std::string("malformed JSON (") + simdjson::error_message(error) + ")");
}

dom::object object_of(dom::element value, const Path& path) {
  dom::object object;
  if (const error_code error = value.get_object().get(object)) fail(path, error, "an object");
  return object;
}

dom::array array_of(dom::element value, const Path& path) {
  dom::array array;
  if (const error_code error = value.get_array().get(array)) fail(path, error, "an array");
  return array;
}

std::string_view string_of(dom::element value, const Path& path) {
  std::string_view text;
  if (const error_code error = value.get_string().get(text)) fail(path, error, "a string");
  return text;
}

// Kubernetes omits empty maps, lists and strings, and a hand-written object may spell them null.
bool present(const Element& value) { return value && !value->is_null(); }

std::string_view optional_string(const Element& value, const Path& path) {
  return present(value) ? string_of(*value, path) : std::string_view{};
}

// A field name known at compile time, so that matching a key against it is a length check and an inlined
// comparison of a few bytes.
template <std::size_t N>
struct Name {
  constexpr Name(const char (&text)[N]) { std::copy_n(text, N, chars); }
  constexpr std::string_view view() const { return {chars, N - 1}; }
  char chars[N];
};

// The fields of an object named in `Names`, each the last of its name: duplicate keys are read as Go's and
// nlohmann's decoders read them, which the apiserver never sends but a patch must still match.
template <Name... Names>
[[gnu::always_inline]] inline std::array<Element, sizeof...(Names)> fields_of(dom::element value, const Path& path) {
  constexpr std::array<std::string_view, sizeof...(Names)> kNames = {Names.view()...};
  std::array<Element, sizeof...(Names)> found;
  const dom::object object = object_of(value, path);
  for (auto field = object.begin(); field != object.end(); ++field) {
    const std::string_view key = field.key();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      static_cast<void>(((key == kNames[I] && (found[I] = field.value(), true)) || ...));
    }
    (std::make_index_sequence<sizeof...(Names)>{});
  }
  return found;
}

// Calls on_element(index, element) for each element of an array that may be null or absent.
template <typename OnElement>
void for_each_element(const Element& value, const Path& path, OnElement&& on_element) {
  if (!present(value)) return;
  std::size_t index = 0;
  for (const dom::element element : array_of(*value, path)) on_element(index++, element);
}

bool quantity_is_nonzero(dom::element value) {
  if (std::string_view text; value.get_string().get(text) == simdjson::SUCCESS) return !k8s::is_zero_quantity(text);
  if (double number = 0; value.get_double().get(number) == simdjson::SUCCESS) return number != 0;
  return true;  // not a quantity: see is_zero_quantity for why that counts as a request
}

// An env entry's name (its last "name", as everywhere) when the decision reads the entry:
// NVIDIA_VISIBLE_DEVICES, a feature variable or a variable of GPU sharing; empty otherwise. The one question asked of
// every variable of every container, so it reads the keys directly and builds nothing.
std::string_view watched_name(dom::element entry, std::string_view list) {
  std::string_view watched;
  const dom::object fields = object_of(entry, Path(list, ".env[]"));
  for (auto field = fields.begin(); field != fields.end(); ++field) {
    if (field.key() != "name") continue;
    const dom::element name = field.value();
    const std::string_view text = name.is_null() ? std::string_view{} : string_of(name, Path(list, ".env[].name"));
    // Most names start with neither N nor C: one comparison, not two prefix tests, turns them away.
    const char first = text.empty() ? '\0' : text.front();
    const bool is_watched = (first == 'N' && text.starts_with("NVIDIA_") &&
                             (text == kVisibleDevices || std::find(kFeatureVariables.begin(), kFeatureVariables.end(),
                                                                   text) != kFeatureVariables.end())) ||
                            (first == 'C' && text.starts_with("CUDA_") && is_sharing_variable(text));
    watched = is_watched ? text : std::string_view{};
  }
  return watched;
}

// An entry that watched_name found watched. Apart from it so that the test every entry takes stays small
// enough to be inlined into the loop over the entries.
void decode_watched_env_entry(std::size_t index, dom::element entry, std::string_view name, std::string_view list,
                              Container& container) {
  if (name.starts_with("CUDA_")) {
    container.sharing_variables.push_back({.env_index = index, .name = name});
    return;
  }
  const auto [value, value_from] = fields_of<"value", "valueFrom">(entry, Path(list, ".env[]"));
  if (name != kVisibleDevices) {
    container.feature_variables.push_back({.name = name,
                                           .value = optional_string(value, Path(list, ".env[].value")),
                                           .has_value_from = present(value_from)});
    return;
  }
  container.visible_devices.push_back({.env_index = index,
                                       .has_value = present(value),
                                       .value = optional_string(value, Path(list, ".env[].value")),
                                       .has_value_from = present(value_from)});
}

void decode_env_from(dom::element entry, std::string_view list, Container& container) {
  const auto [prefix, config_map, secret] =
      fields_of<"prefix", "configMapRef", "secretRef">(entry, Path(list, ".envFrom[]"));
  // A source names one of the two; validation, after admission, refuses one naming both: the secret is told.
  const bool from_secret = present(secret);
  const Element& ref = from_secret ? secret : config_map;
  if (!present(ref)) return;
  const auto [name] = fields_of<"name">(*ref, Path(list, ".envFrom[].configMapRef|secretRef"));
  container.env_from.push_back({.kind = from_secret ? "secret" : "configMap",
                                .name = optional_string(name, Path(list, ".envFrom[].configMapRef|secretRef.name")),
                                .prefix = optional_string(prefix, Path(list, ".envFrom[].prefix"))});
}

void decode_resource_amounts(const Element& amounts, bool limits, std::string_view list, Container& container) {
  if (!present(amounts)) return;
  for (const dom::key_value_pair entry : object_of(*amounts, Path(list, ".resources.limits|requests"))) {
    std::erase_if(container.resources,
                  [&](const ResourceAmount& r) { return r.limit == limits && r.name == entry.key; });
    container.resources.push_back({entry.key, quantity_is_nonzero(entry.value), limits});
  }
}

void decode_resources(dom::element resources, std::string_view list, Container& container) {
  const auto [limits, requests, claims] =
      fields_of<"limits", "requests", "claims">(resources, Path(list, ".resources"));
  container.resources.reserve(4);  // cpu and memory, limits and requests: the common case, one allocation
  decode_resource_amounts(limits, true, list, container);
  decode_resource_amounts(requests, false, list, container);
  for_each_element(claims, Path(list, ".resources.claims"), [&](std::size_t, dom::element claim) {
    const auto [name, request] = fields_of<"name", "request">(claim, Path(list, ".resources.claims[]"));
    container.claims.push_back({optional_string(name, Path(list, ".resources.claims[].name")),
                                optional_string(request, Path(list, ".resources.claims[].request"))});
  });
}

bool decode_privileged(dom::element security_context, std::string_view list) {
  const auto [privileged] = fields_of<"privileged">(security_context, Path(list, ".securityContext"));
  if (!present(privileged)) return false;
  bool value = false;
  if (const error_code error = privileged->get_bool().get(value)) {
    fail(Path(list, ".securityContext.privileged"), error, "a boolean");
  }
  return value;
}

// Volume mounts matter only as mounts of the pod's hostPath volumes, so they are read only when it has some.
Container decode_container(ContainerList list, std::size_t index, dom::element value, bool read_mounts) {
  const std::string_view p = names_of(list).path;
  const auto [name, env, env_from, resources, volume_mounts, security_context] =
      fields_of<"name", "env", "envFrom", "resources", "volumeMounts", "securityContext">(value, p);
  Container container;
  container.list = list;
  container.index = index;
  container.name = optional_string(name, Path(p, ".name"));
  container.env_is_array = present(env);
  for_each_element(env, Path(p, ".env"), [&](std::size_t i, dom::element entry) {
    container.env_size = i + 1;
    if (const std::string_view watched = watched_name(entry, p); !watched.empty()) {
      decode_watched_env_entry(i, entry, watched, p, container);
    }
  });
  for_each_element(env_from, Path(p, ".envFrom"),
                   [&](std::size_t, dom::element entry) { decode_env_from(entry, p, container); });
  if (present(resources)) decode_resources(*resources, p, container);
  if (read_mounts) {
    for_each_element(volume_mounts, Path(p, ".volumeMounts"), [&](std::size_t, dom::element mount) {
      const auto [mount_name] = fields_of<"name">(mount, Path(p, ".volumeMounts[]"));
      if (mount_name) container.volume_mounts.push_back(optional_string(mount_name, Path(p, ".volumeMounts[].name")));
    });
  }
  container.privileged = present(security_context) && decode_privileged(*security_context, p);
  return container;
}

void decode_container_list(ContainerList list, const Element& value, Pod& pod) {
  const std::string_view path = names_of(list).path;
  for_each_element(value, path, [&](std::size_t index, dom::element element) {
    pod.containers.push_back(decode_container(list, index, element, !pod.host_paths.empty()));
  });
}

void decode_host_path_volumes(const Element& volumes, Pod& pod) {
  constexpr std::string_view kPath = "request.object.spec.volumes[]";
  for_each_element(volumes, "request.object.spec.volumes", [&](std::size_t, dom::element volume) {
    const auto [name, host_path] = fields_of<"name", "hostPath">(volume, kPath);
    if (!present(host_path)) return;
    const auto [path] = fields_of<"path">(*host_path, Path(kPath, ".hostPath"));
    pod.host_paths.push_back(
        {optional_string(name, Path(kPath, ".name")), optional_string(path, Path(kPath, ".hostPath.path"))});
  });
}

void decode_pod_claims(const Element& claims, Pod& pod) {
  constexpr std::string_view kPath = "request.object.spec.resourceClaims[]";
  for_each_element(claims, "request.object.spec.resourceClaims", [&](std::size_t, dom::element entry) {
    const auto [name, claim, claim_template] =
        fields_of<"name", "resourceClaimName", "resourceClaimTemplateName">(entry, kPath);
    pod.resource_claims.push_back({optional_string(name, Path(kPath, ".name")),
                                   optional_string(claim, Path(kPath, ".resourceClaimName")),
                                   optional_string(claim_template, Path(kPath, ".resourceClaimTemplateName"))});
  });
}

void decode_annotations(const Element& annotations, Pod& pod) {
  if (!present(annotations)) return;
  for (const dom::key_value_pair entry : object_of(*annotations, "request.object.metadata.annotations")) {
    pod.mirror = pod.mirror || entry.key == kMirrorPodAnnotation;
    std::erase_if(pod.annotations, [&](const Annotation& a) { return a.key == entry.key; });
    pod.annotations.push_back({entry.key, string_of(entry.value, "request.object.metadata.annotations{}")});
  }
}

// On the ephemeralcontainers subresource only ephemeral containers can change, so the others are not read.
Pod decode_pod(dom::element object, bool only_ephemeral) {
  const auto [metadata, spec] = fields_of<"metadata", "spec">(object, "request.object");
  Pod pod;
  if (metadata) {
    const auto [annotations] = fields_of<"annotations">(*metadata, "request.object.metadata");
    decode_annotations(annotations, pod);
  }
  if (!spec) return pod;
  const auto [init_containers, containers, ephemeral_containers, service_account, scheduler, volumes, runtime_class,
              resource_claims] =
      fields_of<"initContainers", "containers", "ephemeralContainers", "serviceAccountName", "schedulerName", "volumes",
                "runtimeClassName", "resourceClaims">(*spec, "request.object.spec");
  decode_host_path_volumes(volumes, pod);
  pod.containers.reserve(8);  // most pods have fewer, and growing 1, 2, 4, 8 costs four allocations
  if (!only_ephemeral) {
    decode_container_list(ContainerList::init, init_containers, pod);
    decode_container_list(ContainerList::regular, containers, pod);
    decode_pod_claims(resource_claims, pod);
  }
  decode_container_list(ContainerList::ephemeral, ephemeral_containers, pod);
  pod.service_account = optional_string(service_account, "request.object.spec.serviceAccountName");
  pod.scheduler = optional_string(scheduler, "request.object.spec.schedulerName");
  pod.runtime_class = optional_string(runtime_class, "request.object.spec.runtimeClassName");
  return pod;
}

std::vector<std::string_view> decode_ephemeral_names(dom::element old_object) {
  std::vector<std::string_view> names;
  const auto [spec] = fields_of<"spec">(old_object, "request.oldObject");
  if (!present(spec)) return names;
  const auto [containers] = fields_of<"ephemeralContainers">(*spec, "request.oldObject.spec");
  for_each_element(containers, "request.oldObject.spec.ephemeralContainers", [&](std::size_t, dom::element c) {
    const auto [name] = fields_of<"name">(c, "request.oldObject.spec.ephemeralContainers[]");
    if (name) names.push_back(optional_string(name, "request.oldObject.spec.ephemeralContainers[].name"));
  });
  return names;
}

}  // namespace

bool is_mutable_pod_request(const Review& review) {
  if (!review.kind_group.empty() || review.kind != "Pod") return false;
  if (review.operation == "CREATE") return review.sub_resource.empty();
  return review.operation == "UPDATE" && review.sub_resource == "ephemeralcontainers";
}

Review decode_review(dom::parser& parser, simdjson::padded_string_view json) {
  dom::element root;
  if (const error_code error = parser.parse(json.data(), json.size(), false).get(root)) fail("body", error, "JSON");
  if (!root.is_object()) fail("body", "must be a JSON object");
  const auto [api_version, kind, request] = fields_of<"apiVersion", "kind", "request">(root, "body");
  Review review;
  review.api_version = optional_string(api_version, "apiVersion");
  if (optional_string(kind, "kind") != "AdmissionReview") fail("kind", "must be AdmissionReview");
  if (review.api_version != "admission.k8s.io/v1" && review.api_version != "admission.k8s.io/v1beta1") {
    fail("apiVersion", "must be admission.k8s.io/v1 or admission.k8s.io/v1beta1");
  }
  if (!request) fail("request", "missing");

  const auto [uid, operation, sub_resource, namespace_, request_kind, object, old_object] =
      fields_of<"uid", "operation", "subResource", "namespace", "kind", "object", "oldObject">(*request, "request");
  review.uid = optional_string(uid, "request.uid");
  review.operation = optional_string(operation, "request.operation");
  review.sub_resource = optional_string(sub_resource, "request.subResource");
  review.namespace_ = optional_string(namespace_, "request.namespace");
  if (present(request_kind)) {
    const auto [group, resource_kind] = fields_of<"group", "kind">(*request_kind, "request.kind");
    review.kind_group = optional_string(group, "request.kind.group");
    review.kind = optional_string(resource_kind, "request.kind.kind");
  }
  if (review.uid.empty()) fail("request.uid", "missing");
  if (review.operation.empty()) fail("request.operation", "missing");
  if (!is_mutable_pod_request(review)) return review;  // its object is never read

  if (!present(object)) fail("request.object", "missing for a Pod " + std::string(review.operation));
  const bool ephemeral_update = review.operation == "UPDATE";
  review.pod = decode_pod(*object, ephemeral_update);
  if (ephemeral_update && present(old_object)) review.old_ephemeral_names = decode_ephemeral_names(*old_object);
  review.has_pod = true;
  return review;
}

}  // namespace gpuguard::admission

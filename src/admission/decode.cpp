// The hot path: simdjson On-Demand walks the review once and touches only the fields the decision needs;
// everything else (most of a Pod) is skipped over without being materialised.
#include "decode.hpp"

#include <optional>
#include <string>
#include <tuple>

#include "gpuguard/k8s/quantity.hpp"

namespace gpuguard::admission {
namespace {

namespace od = simdjson::ondemand;
using simdjson::error_code;

// A JSON path for error messages, in two parts so that the hot path never concatenates strings.
struct Path {
  Path(const char* whole) : prefix(whole) {}
  Path(std::string_view whole) : prefix(whole) {}
  Path(std::string_view p, std::string_view s) : prefix(p), suffix(s) {}
  std::string_view prefix, suffix;
};

[[noreturn]] void fail(Path path, std::string_view problem) {
  std::string message(path.prefix);
  message += path.suffix;
  message += ": ";
  message += problem;
  throw DecodeError(message);
}

[[noreturn]] void fail(Path path, error_code error, std::string_view expected) {
  if (error == simdjson::INCORRECT_TYPE) fail(path, std::string("must be ") + std::string(expected));
  fail(path, std::string("malformed JSON (") + simdjson::error_message(error) + ")");
}

template <typename T, typename Result>
T need(Result&& result, Path path, std::string_view expected) {
  T out{};
  if (error_code error = std::forward<Result>(result).get(out)) fail(path, error, expected);
  return out;
}

od::json_type type_of(od::value& value, Path path) { return need<od::json_type>(value.type(), path, "a JSON value"); }

std::string_view string_field(od::value& value, Path path) {
  return need<std::string_view>(value.get_string(), path, "a string");
}

// A string that may be null or absent: empty then.
std::string_view optional_string(od::value& value, Path path) {
  if (need<od::json_type>(value.type(), path, "a JSON value") == od::json_type::null) return {};
  return string_field(value, path);
}

// Iterates an object's fields, calling on_field(key, value) for each. The key is the raw JSON text:
// comparing it with a field name costs no copy, and the apiserver (Go's encoding/json) never escapes the
// letters of the field names we look for. Maps whose keys are data use for_each_entry instead.
template <typename OnField>
void for_each_field(od::object object, Path path, OnField&& on_field) {
  for (auto field_result : object) {
    od::field field = need<od::field>(std::move(field_result), path, "an object");
    on_field(field.key(), field.value());
  }
}

template <typename OnField>
void for_each_field(od::value& value, Path path, OnField&& on_field) {
  for_each_field(need<od::object>(value.get_object(), path, "an object"), path, on_field);
}

// Like for_each_field, for maps whose keys are data (resource names, annotations): keys are unescaped.
template <typename OnEntry>
void for_each_entry(od::value& value, Path path, OnEntry&& on_entry) {
  for (auto field_result : need<od::object>(value.get_object(), path, "an object")) {
    od::field field = need<od::field>(std::move(field_result), path, "an object");
    on_entry(need<std::string_view>(field.unescaped_key(), path, "an object"), field.value());
  }
}

// Kubernetes omits empty maps and lists, and a hand-written object may spell them null.
bool is_null(od::value& value, Path path) { return type_of(value, path) == od::json_type::null; }

template <typename OnElement>
void for_each_element(od::value& value, Path path, OnElement&& on_element) {
  od::array array = need<od::array>(value.get_array(), path, "an array");
  std::size_t index = 0;
  for (auto element_result : array) {
    // simdjson's result type is trivially copyable, but its get() takes it only as an rvalue.
    od::value element =
        need<od::value>(std::move(element_result), path, "an array");  // NOLINT(performance-move-const-arg)
    on_element(index++, element);
  }
}

bool quantity_is_nonzero(od::value& value, Path path) {
  switch (type_of(value, path)) {
    case od::json_type::string: return !k8s::is_zero_quantity(string_field(value, path));
    case od::json_type::number: {
      double number = 0;
      return value.get_double().get(number) != simdjson::SUCCESS || number != 0;
    }
    default: return true;  // not a quantity: see is_zero_quantity for why that counts as a request
  }
}

void decode_env_entry(std::size_t index, od::value& entry, std::string_view list, Container& container) {
  std::string_view name;
  VisibleDevicesEntry facts;
  facts.env_index = index;
  for_each_field(entry, Path(list, ".env[]"), [&](od::raw_json_string key, od::value value) {
    if (key == "name") {
      name = string_field(value, Path(list, ".env[].name"));
    } else if (key == "value") {
      facts.has_value = false;
      if (is_null(value, Path(list, ".env[].value"))) return;
      facts.has_value = true;
      facts.value = string_field(value, Path(list, ".env[].value"));
    } else if (key == "valueFrom") {
      facts.has_value_from = !is_null(value, Path(list, ".env[].valueFrom"));
    }
  });
  if (name == kVisibleDevices) container.visible_devices.push_back(facts);
}

void decode_env_from(std::size_t, od::value& entry, std::string_view list, Container& container) {
  EnvFromSource source;
  for_each_field(entry, Path(list, ".envFrom[]"), [&](od::raw_json_string key, od::value value) {
    const bool config_map = key == "configMapRef";
    if (key == "prefix") {
      source.prefix = {};
      if (!is_null(value, Path(list, ".envFrom[].prefix")))
        source.prefix = string_field(value, Path(list, ".envFrom[].prefix"));
    } else if (config_map || key == "secretRef") {
      if (is_null(value, Path(list, ".envFrom[].configMapRef|secretRef"))) return;
      source.kind = config_map ? "configMap" : "secret";
      source.name = {};
      for_each_field(value, Path(list, ".envFrom[].configMapRef|secretRef"),
                     [&](od::raw_json_string ref_key, od::value ref) {
                       if (ref_key == "name")
                         source.name = string_field(ref, Path(list, ".envFrom[].configMapRef|secretRef.name"));
                     });
    }
  });
  if (!source.kind.empty()) container.env_from.push_back(source);
}

void decode_resources(od::value& resources, std::string_view list, Container& container) {
  const Path path(list, ".resources"), amounts_path(list, ".resources.limits|requests");
  container.resources.clear();
  if (is_null(resources, path)) return;
  container.claims.clear();
  for_each_field(resources, path, [&](od::raw_json_string key, od::value amounts) {
    if (key == "claims") {
      const Path claims_path(list, ".resources.claims");
      container.claims.clear();
      if (is_null(amounts, claims_path)) return;
      for_each_element(amounts, claims_path, [&](std::size_t, od::value& claim) {
        ClaimUse use;
        for_each_field(claim, Path(list, ".resources.claims[]"), [&](od::raw_json_string claim_key, od::value v) {
          if (claim_key == "name") use.name = string_field(v, Path(list, ".resources.claims[].name"));
          if (claim_key == "request") use.request = optional_string(v, Path(list, ".resources.claims[].request"));
        });
        container.claims.push_back(use);
      });
      return;
    }
    const bool limits = key == "limits";
    if (!limits && key != "requests") return;
    std::erase_if(container.resources, [&](const ResourceAmount& r) { return r.limit == limits; });
    if (is_null(amounts, amounts_path)) return;
    container.resources.reserve(4);  // cpu and memory, limits and requests: the common case, one allocation
    for_each_entry(amounts, amounts_path, [&](std::string_view resource, od::value quantity) {
      std::erase_if(container.resources,
                    [&](const ResourceAmount& r) { return r.limit == limits && r.name == resource; });
      container.resources.push_back({resource, quantity_is_nonzero(quantity, amounts_path), limits});
    });
  });
}

Container decode_container(ContainerList list, std::size_t index, od::value& value) {
  const std::string_view p = names_of(list).path;
  Container container;
  container.list = list;
  container.index = index;
  for_each_field(value, p, [&](od::raw_json_string key, od::value field) {
    if (key == "name") {
      container.name = string_field(field, Path(p, ".name"));
    } else if (key == "env") {
      container.env_is_array = false;
      container.env_size = 0;
      container.visible_devices.clear();
      if (is_null(field, Path(p, ".env"))) return;
      container.env_is_array = true;
      for_each_element(field, Path(p, ".env"), [&](std::size_t i, od::value& entry) {
        container.env_size = i + 1;
        decode_env_entry(i, entry, p, container);
      });
    } else if (key == "envFrom") {
      container.env_from.clear();
      if (is_null(field, Path(p, ".envFrom"))) return;
      for_each_element(field, Path(p, ".envFrom"),
                       [&](std::size_t i, od::value& entry) { decode_env_from(i, entry, p, container); });
    } else if (key == "resources") {
      decode_resources(field, p, container);
    } else if (key == "volumeMounts") {
      container.volume_mounts.clear();
      if (is_null(field, Path(p, ".volumeMounts"))) return;
      for_each_element(field, Path(p, ".volumeMounts"), [&](std::size_t, od::value& mount) {
        for_each_field(mount, Path(p, ".volumeMounts[]"), [&](od::raw_json_string mount_key, od::value v) {
          if (mount_key == "name") container.volume_mounts.push_back(string_field(v, Path(p, ".volumeMounts[].name")));
        });
      });
    } else if (key == "securityContext") {
      const Path security(p, ".securityContext"), privileged(p, ".securityContext.privileged");
      container.privileged = false;
      if (is_null(field, security)) return;
      for_each_field(field, security, [&](od::raw_json_string sc_key, od::value sc_value) {
        if (sc_key != "privileged") return;
        container.privileged = false;
        if (is_null(sc_value, privileged)) return;
        container.privileged = need<bool>(sc_value.get_bool(), privileged, "a boolean");
      });
    }
  });
  return container;
}

void decode_container_list(ContainerList list, od::value& value, Pod& pod) {
  const std::string_view p = names_of(list).path;
  std::erase_if(pod.containers, [&](const Container& c) { return c.list == list; });
  if (is_null(value, p)) return;
  pod.containers.reserve(8);  // most pods have fewer, and growing 1, 2, 4, 8 costs four allocations
  for_each_element(value, p, [&](std::size_t index, od::value& element) {
    pod.containers.push_back(decode_container(list, index, element));
  });
}

void decode_host_path_volumes(od::value& volumes, Pod& pod) {
  constexpr std::string_view kPath = "request.object.spec.volumes[]";
  pod.host_paths.clear();
  if (is_null(volumes, "request.object.spec.volumes")) return;
  for_each_element(volumes, "request.object.spec.volumes", [&](std::size_t, od::value& volume) {
    HostPathVolume host;
    bool is_host_path = false;
    for_each_field(volume, kPath, [&](od::raw_json_string key, od::value v) {
      if (key == "name") {
        host.name = string_field(v, Path(kPath, ".name"));
      } else if (key == "hostPath") {
        is_host_path = false;
        if (is_null(v, Path(kPath, ".hostPath"))) return;
        is_host_path = true;
        for_each_field(v, Path(kPath, ".hostPath"), [&](od::raw_json_string host_key, od::value p) {
          if (host_key == "path") host.path = string_field(p, Path(kPath, ".hostPath.path"));
        });
      }
    });
    if (is_host_path) pod.host_paths.push_back(host);
  });
}

void decode_pod_claims(od::value& claims, Pod& pod) {
  constexpr std::string_view kPath = "request.object.spec.resourceClaims[]";
  pod.resource_claims.clear();
  if (is_null(claims, "request.object.spec.resourceClaims")) return;
  for_each_element(claims, "request.object.spec.resourceClaims", [&](std::size_t, od::value& entry) {
    PodClaim claim;
    for_each_field(entry, kPath, [&](od::raw_json_string key, od::value v) {
      if (key == "name") claim.name = string_field(v, Path(kPath, ".name"));
      if (key == "resourceClaimName") claim.claim = optional_string(v, Path(kPath, ".resourceClaimName"));
      if (key == "resourceClaimTemplateName") {
        claim.claim_template = optional_string(v, Path(kPath, ".resourceClaimTemplateName"));
      }
    });
    pod.resource_claims.push_back(claim);
  });
}

Pod decode_pod(od::value& object, bool only_ephemeral) {
  Pod pod;
  for_each_field(object, "request.object", [&](od::raw_json_string key, od::value field) {
    if (key == "metadata") {
      pod.mirror = false;
      pod.annotations.clear();
      for_each_field(field, "request.object.metadata", [&](od::raw_json_string meta_key, od::value meta) {
        if (meta_key != "annotations") return;
        pod.mirror = false;
        pod.annotations.clear();
        if (is_null(meta, "request.object.metadata.annotations")) return;
        for_each_entry(meta, "request.object.metadata.annotations", [&](std::string_view annotation, od::value value) {
          pod.mirror = pod.mirror || annotation == kMirrorPodAnnotation;
          std::erase_if(pod.annotations, [&](const Annotation& a) { return a.key == annotation; });
          pod.annotations.push_back({annotation, string_field(value, "request.object.metadata.annotations{}")});
        });
      });
    } else if (key == "spec") {
      pod.containers.clear();
      pod.service_account = {};
      pod.scheduler = {};
      pod.runtime_class = {};
      pod.resource_claims.clear();
      pod.host_paths.clear();
      for_each_field(field, "request.object.spec", [&](od::raw_json_string spec_key, od::value list) {
        if (spec_key == "ephemeralContainers") {
          decode_container_list(ContainerList::ephemeral, list, pod);
        } else if (spec_key == "serviceAccountName") {
          pod.service_account = optional_string(list, "request.object.spec.serviceAccountName");
        } else if (spec_key == "schedulerName") {
          pod.scheduler = optional_string(list, "request.object.spec.schedulerName");
        } else if (spec_key == "runtimeClassName") {
          pod.runtime_class = optional_string(list, "request.object.spec.runtimeClassName");
        } else if (spec_key == "volumes") {
          decode_host_path_volumes(list, pod);
        } else if (only_ephemeral) {
          return;  // containers and initContainers are immutable on this subresource
        } else if (spec_key == "initContainers") {
          decode_container_list(ContainerList::init, list, pod);
        } else if (spec_key == "containers") {
          decode_container_list(ContainerList::regular, list, pod);
        } else if (spec_key == "resourceClaims") {
          decode_pod_claims(list, pod);
        }
      });
    }
  });
  return pod;
}

std::vector<std::string_view> decode_ephemeral_names(od::value& old_object) {
  std::vector<std::string_view> names;
  if (is_null(old_object, "request.oldObject")) return names;
  for_each_field(old_object, "request.oldObject", [&](od::raw_json_string key, od::value spec) {
    if (key != "spec") return;
    names.clear();
    for_each_field(spec, "request.oldObject.spec", [&](od::raw_json_string spec_key, od::value list) {
      if (spec_key != "ephemeralContainers") return;
      names.clear();
      if (is_null(list, "request.oldObject.spec.ephemeralContainers")) return;
      for_each_element(list, "request.oldObject.spec.ephemeralContainers", [&](std::size_t, od::value& c) {
        for_each_field(c, "request.oldObject.spec.ephemeralContainers[]", [&](od::raw_json_string k, od::value v) {
          if (k == "name") names.push_back(string_field(v, "request.oldObject.spec.ephemeralContainers[].name"));
        });
      });
    });
  });
  return names;
}

// The request fields that decide whether `object` is decoded.
using RequestKey = std::tuple<std::string, std::string, std::string, std::string>;
RequestKey key_of(const Review& r) { return {r.kind_group, r.kind, r.operation, r.sub_resource}; }

// What the first pass decoded of `object` and `oldObject`, and under which request fields. The apiserver
// writes kind, subResource and operation before object, so the first pass usually decodes the Pod itself
// and the second pass is never needed.
struct EarlyDecode {
  std::optional<RequestKey> object_for;
  bool old_seen = false;
  std::optional<RequestKey> old_for;
};

// Duplicate keys are decoded as nlohmann and Go decode them for everything gpuguard reads: the last wins.
// The apiserver never sends any, but a patch must still match the document it came from.
void decode_request(od::value& request, Review& review, EarlyDecode& early) {
  early = {};
  review.uid.clear();
  review.operation.clear();
  review.sub_resource.clear();
  review.namespace_.clear();
  review.kind_group.clear();
  review.kind.clear();
  for_each_field(request, "request", [&](od::raw_json_string key, od::value value) {
    if (key == "uid") {
      review.uid = string_field(value, "request.uid");
    } else if (key == "operation") {
      review.operation = string_field(value, "request.operation");
    } else if (key == "subResource") {
      review.sub_resource = string_field(value, "request.subResource");
    } else if (key == "namespace") {
      review.namespace_ = string_field(value, "request.namespace");
    } else if (key == "kind") {
      review.kind_group.clear();
      review.kind.clear();
      for_each_field(value, "request.kind", [&](od::raw_json_string gvk_key, od::value part) {
        if (gvk_key == "group") review.kind_group = string_field(part, "request.kind.group");
        if (gvk_key == "kind") review.kind = string_field(part, "request.kind.kind");
      });
    } else if (key == "object") {
      early.object_for.reset();
      if (!is_mutable_pod_request(review) || is_null(value, "request.object")) return;  // skipped
      review.pod = decode_pod(value, review.operation == "UPDATE");
      early.object_for = key_of(review);
    } else if (key == "oldObject") {
      early.old_seen = true;
      early.old_for.reset();
      if (!is_mutable_pod_request(review) || review.operation != "UPDATE") return;
      review.old_ephemeral_names = decode_ephemeral_names(value);
      early.old_for = key_of(review);
    }
  });
}

}  // namespace

bool is_mutable_pod_request(const Review& review) {
  if (!review.kind_group.empty() || review.kind != "Pod") return false;
  if (review.operation == "CREATE") return review.sub_resource.empty();
  return review.operation == "UPDATE" && review.sub_resource == "ephemeralcontainers";
}

Review decode_review(od::parser& parser, simdjson::padded_string_view json) {
  Review review;
  od::document doc = need<od::document>(parser.iterate(json), "body", "JSON");
  std::string kind;
  bool has_request = false;
  EarlyDecode early;
  for_each_field(need<od::object>(doc.get_object(), "body", "a JSON object"), "body",
                 [&](od::raw_json_string key, od::value value) {
                   if (key == "apiVersion") {
                     review.api_version = string_field(value, "apiVersion");
                   } else if (key == "kind") {
                     kind = string_field(value, "kind");
                   } else if (key == "request") {
                     has_request = true;
                     decode_request(value, review, early);
                   }
                 });
  if (kind != "AdmissionReview") fail("kind", "must be AdmissionReview");
  if (review.api_version != "admission.k8s.io/v1" && review.api_version != "admission.k8s.io/v1beta1") {
    fail("apiVersion", "must be admission.k8s.io/v1 or admission.k8s.io/v1beta1");
  }
  if (!has_request) fail("request", "missing");
  if (review.uid.empty()) fail("request.uid", "missing");
  if (review.operation.empty()) fail("request.operation", "missing");
  if (!is_mutable_pod_request(review)) return review;
  const bool ephemeral_update = review.operation == "UPDATE";
  const RequestKey final_key = key_of(review);
  if (early.object_for == final_key && (!ephemeral_update || !early.old_seen || early.old_for == final_key)) {
    review.has_pod = true;
    return review;
  }

  // Second pass, for the orders the first could not settle: object before the fields that say what it is.
  review.old_ephemeral_names.clear();
  doc.rewind();
  bool has_object = false;
  for_each_field(need<od::object>(doc.get_object(), "body", "a JSON object"), "body",
                 [&](od::raw_json_string key, od::value request) {
                   if (key != "request") return;
                   has_object = false;
                   review.old_ephemeral_names.clear();
                   for_each_field(request, "request", [&](od::raw_json_string request_key, od::value value) {
                     if (request_key == "object") {
                       has_object = !is_null(value, "request.object");
                       if (has_object) review.pod = decode_pod(value, ephemeral_update);
                     } else if (request_key == "oldObject" && ephemeral_update) {
                       review.old_ephemeral_names = decode_ephemeral_names(value);
                     }
                   });
                 });
  if (!has_object) fail("request.object", "missing for a Pod " + std::string(review.operation));
  review.has_pod = true;
  return review;
}

}  // namespace gpuguard::admission

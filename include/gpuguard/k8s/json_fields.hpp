#pragma once
// Reading Kubernetes objects that may lack any field or hold the wrong type: absent, never an exception
// (nlohmann's value() with a pointer throws on such shapes). The extender's and the arm hook's readers.
#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace gpuguard::k8s {

// An object's member, or null where it is not an object or has none.
inline const nlohmann::json* member(const nlohmann::json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto found = object.find(key);
  return found == object.end() ? nullptr : &*found;
}

// The string at a path of keys, or empty.
inline std::string_view string_at(const nlohmann::json& object, std::initializer_list<std::string_view> path) {
  const nlohmann::json* at = &object;
  for (std::string_view key : path) {
    at = member(*at, key);
    if (at == nullptr) return {};
  }
  return at->is_string() ? std::string_view(at->get_ref<const std::string&>()) : std::string_view{};
}

}  // namespace gpuguard::k8s

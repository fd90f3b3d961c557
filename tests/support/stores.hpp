#pragma once
// Feeding a kube::Store as kube::Informers does, from test objects: each as JSON text with the padding
// the Store contract promises after it.
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpuguard/kube/store.hpp"

namespace gpuguard::test {

// A complete list of these objects.
inline void list(kube::Store& store, const std::vector<nlohmann::json>& objects) {
  store.list_begin();
  for (const nlohmann::json& object : objects) store.list_item(kube::PaddedText(object.dump()).view());
  store.list_end(true);
}

inline void event(kube::Store& store, std::string_view type, const nlohmann::json& object) {
  store.apply(type, kube::PaddedText(object.dump()).view());
}

}  // namespace gpuguard::test

#pragma once
// Feeding a kube::Store as kube::Informers does, from test objects: each as JSON text with the padding
// the Store contract promises after it.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpuguard/kube/store.hpp"

namespace gpuguard::test {

// The text of `object`, followed in memory by kube::kJsonPadding spaces that are not part of the view.
class PaddedJson {
 public:
  explicit PaddedJson(const nlohmann::json& object) : text_(object.dump()), size_(text_.size()) {
    text_.append(kube::kJsonPadding, ' ');
  }
  explicit PaddedJson(std::string_view text) : text_(text), size_(text.size()) {
    text_.append(kube::kJsonPadding, ' ');
  }
  std::string_view view() const { return std::string_view(text_).substr(0, size_); }

 private:
  std::string text_;
  std::size_t size_;
};

// A complete list of these objects.
inline void list(kube::Store& store, const std::vector<nlohmann::json>& objects) {
  store.list_begin();
  for (const nlohmann::json& object : objects) store.list_item(PaddedJson(object).view());
  store.list_end(true);
}

inline void event(kube::Store& store, std::string_view type, const nlohmann::json& object) {
  store.apply(type, PaddedJson(object).view());
}

}  // namespace gpuguard::test

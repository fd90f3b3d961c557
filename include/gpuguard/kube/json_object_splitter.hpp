#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace gpuguard::kube {

// Splits a stream of concatenated JSON objects (a watch response) into whole objects, whatever the
// chunking and whether or not newlines separate them.
class JsonObjectSplitter {
 public:
  // Calls `on_object` for each complete top-level object; returns false on bytes that cannot start one.
  bool feed(std::string_view bytes, const std::function<void(std::string_view object)>& on_object);
  std::size_t buffered() const { return pending_.size(); }

 private:
  std::string pending_;
  std::size_t scanned_ = 0;
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

}  // namespace gpuguard::kube

#include "gpuguard/kube/json_object_splitter.hpp"

namespace gpuguard::kube {

bool JsonObjectSplitter::feed(std::string_view bytes, const std::function<void(std::string_view)>& on_object) {
  // No Kubernetes object comes near this (etcd stores at most 1.5 MiB); more is a broken stream.
  constexpr std::size_t kLargestObject = 64 << 20;
  if (pending_.size() + bytes.size() > kLargestObject) return false;
  pending_.append(bytes);
  std::size_t start = 0;
  for (std::size_t i = scanned_; i < pending_.size(); ++i) {
    const char c = pending_[i];
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      continue;
    }
    if (depth_ == 0) {
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
        start = i + 1;
        continue;
      }
      if (c != '{') return false;
      start = i;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ < 0) return false;
      if (depth_ == 0) {
        if (c != '}') return false;  // "{ ... ]": not an object, and nothing after it can be trusted
        on_object(std::string_view(pending_).substr(start, i + 1 - start));
        start = i + 1;
      }
    }
  }
  pending_.erase(0, start);
  scanned_ = pending_.size();
  return true;
}

}  // namespace gpuguard::kube

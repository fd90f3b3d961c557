#pragma once
// Where a list-and-watch puts what it receives: the cache's side of kube::Informers. Objects arrive one
// at a time as JSON text, never as a collection or a DOM, so that a cache of 150,000 pods holds its own
// compact records and nothing else (docs/benchmarks.md, "Caches at cluster scale").
#include <cstddef>
#include <string>
#include <string_view>

namespace gpuguard::kube {

// Every object's text is followed in memory by at least this many readable bytes, so that a store can
// parse it where it lies with simdjson On-Demand (whose SIMDJSON_PADDING this equals) instead of copying.
inline constexpr std::size_t kJsonPadding = 64;

// Text that keeps that promise, for whoever feeds a Store from text of its own (tests, fuzzers,
// benchmarks): view() is the text alone, and kJsonPadding spaces follow it in memory.
class PaddedText {
 public:
  explicit PaddedText(std::string_view text) : text_(text), size_(text.size()) { text_.append(kJsonPadding, ' '); }
  std::string_view view() const { return std::string_view(text_).substr(0, size_); }

 private:
  std::string text_;
  std::size_t size_;
};

class Store {
 public:
  virtual ~Store() = default;

  // A (re-)list: list_begin, then every item of every page as its page arrives, then list_end. A complete
  // list replaces what the store held; an incomplete one (a page failed) is dropped and the old set stays.
  // A store builds the new set aside and swaps it in, so that a re-list never holds two full DOMs.
  virtual void list_begin() = 0;
  virtual void list_item(std::string_view object) = 0;
  virtual void list_end(bool complete) = 0;

  // A watch event: type is ADDED, MODIFIED or DELETED.
  virtual void apply(std::string_view type, std::string_view object) = 0;
};

}  // namespace gpuguard::kube

#pragma once
// JSON lines on stderr: {"time":..., "level":..., "msg":..., ...fields}. Never pass secrets as fields.
// A field is a key and a view of its value, so building one costs no allocation; the line is only
// serialised when its level is enabled. Where even the values cost something to compute, ask enabled()
// first.
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace gpuguard::log {

enum class Level { debug, info, warn, error };

template <typename T>
concept WholeNumber = std::integral<T> && !std::same_as<T, bool>;

// A field's value: text, a whole number, a number, a boolean, null, or a list of strings. Text and lists
// are viewed, not copied: a Value lives only as long as the call it is passed to.
class Value {
 public:
  Value(std::string_view text) : value_(text) {}
  Value(const char* text) : value_(std::string_view(text)) {}
  Value(const std::string& text) : value_(std::string_view(text)) {}
  Value(bool flag) : value_(flag) {}
  template <WholeNumber T>
  Value(T number)
      : value_(std::in_range<std::int64_t>(number) ? Variant(static_cast<std::int64_t>(number))
                                                   : Variant(static_cast<std::uint64_t>(number))) {}
  Value(double number) : value_(number) {}
  Value(std::nullptr_t) : value_(nullptr) {}
  Value(const std::vector<std::string>& list) : value_(&list) {}
  template <typename T>
  Value(const std::optional<T>& maybe) : Value(maybe ? Value(*maybe) : Value(nullptr)) {}

  using Variant = std::variant<std::string_view, std::int64_t, std::uint64_t, double, bool, std::nullptr_t,
                               const std::vector<std::string>*>;
  const Variant& get() const { return value_; }

 private:
  Variant value_;
};

struct Field {
  std::string_view key;
  Value value;
};
using Fields = std::initializer_list<Field>;

std::optional<Level> parse_level(std::string_view name);
void set_level(Level level);
bool enabled(Level level);
// Writes the line when `level` is enabled.
void write(Level level, std::string_view message, Fields fields = {});

inline void debug(std::string_view m, Fields f = {}) { write(Level::debug, m, f); }
inline void info(std::string_view m, Fields f = {}) { write(Level::info, m, f); }
inline void warn(std::string_view m, Fields f = {}) { write(Level::warn, m, f); }
inline void error(std::string_view m, Fields f = {}) { write(Level::error, m, f); }

}  // namespace gpuguard::log

#include "gpuguard/k8s/quantity.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

namespace gpuguard::k8s {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

constexpr std::int64_t kCountLimit = std::int64_t{1} << 62;

// The multiplier of a resource.Quantity suffix, as a power of 1024 and a power of ten: binary SI,
// decimal SI, or a decimal exponent. False when `s` is none of those.
bool suffix_scale(std::string_view s, int& binary_power, int& decimal_power) {
  static constexpr std::array<std::pair<std::string_view, int>, 6> kBinary = {
      {{"Ki", 1}, {"Mi", 2}, {"Gi", 3}, {"Ti", 4}, {"Pi", 5}, {"Ei", 6}}};
  static constexpr std::array<std::pair<std::string_view, int>, 10> kDecimal = {
      {{"", 0}, {"n", -9}, {"u", -6}, {"m", -3}, {"k", 3}, {"M", 6}, {"G", 9}, {"T", 12}, {"P", 15}, {"E", 18}}};
  binary_power = 0;
  decimal_power = 0;
  for (const auto& [suffix, power] : kBinary) {
    if (s == suffix) {
      binary_power = power;
      return true;
    }
  }
  for (const auto& [suffix, power] : kDecimal) {
    if (s == suffix) {
      decimal_power = power;
      return true;
    }
  }
  if (s.empty() || (s[0] != 'e' && s[0] != 'E')) return false;
  s.remove_prefix(1);
  const bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) s.remove_prefix(1);
  if (s.empty()) return false;
  int power = 0;
  for (char c : s) {
    if (!is_digit(c)) return false;
    power = std::min(power * 10 + (c - '0'), 100);  // beyond a few dozen the value is out of range (or zero) anyway
  }
  decimal_power = negative ? -power : power;
  return true;
}

// A well-formed quantity taken apart, its value not yet computed.
struct QuantityParts {
  bool negative = false;
  std::string_view mantissa;  // digits with at most one '.'
  int binary_power = 0;       // x 1024^binary_power
  int decimal_power = 0;      // x 10^decimal_power
};

std::optional<QuantityParts> parse_quantity(std::string_view q) {
  QuantityParts parts;
  std::size_t i = 0;
  if (i < q.size() && (q[i] == '+' || q[i] == '-')) parts.negative = q[i++] == '-';
  const std::size_t start = i;
  bool any_digit = false;
  bool seen_dot = false;
  for (; i < q.size(); ++i) {
    if (is_digit(q[i])) {
      any_digit = true;
    } else if (q[i] == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
  }
  if (!any_digit || !suffix_scale(q.substr(i), parts.binary_power, parts.decimal_power)) return std::nullopt;
  parts.mantissa = q.substr(start, i - start);
  return parts;
}

bool is_zero_mantissa(std::string_view mantissa) { return mantissa.find_first_not_of("0.") == std::string_view::npos; }

}  // namespace

std::optional<std::int64_t> quantity_count(std::string_view q) {
  const std::optional<QuantityParts> parts = parse_quantity(q);
  if (!parts) return std::nullopt;
  if (is_zero_mantissa(parts->mantissa)) return 0;
  if (parts->negative) return std::nullopt;
  std::string digits;  // every digit, the decimal point removed
  int point = -1;      // how many digits stand before the point
  for (char c : parts->mantissa) {
    if (c == '.') {
      point = static_cast<int>(digits.size());
    } else {
      digits.push_back(c);
    }
  }
  if (point < 0) point = static_cast<int>(digits.size());
  const std::size_t first = digits.find_first_not_of('0');
  point += parts->decimal_power - static_cast<int>(first);
  digits.erase(0, first);
  // Now value = 0.<digits> x 10^point x 1024^binary_power. Split into a whole part and a fraction.
  if (point > 19) return kCountLimit;
  __int128 whole = 0;
  for (int d = 0; d < point; ++d) whole = whole * 10 + (d < static_cast<int>(digits.size()) ? digits[d] - '0' : 0);
  // The fraction to 18 places, and whether anything non-zero lies beyond them.
  std::int64_t fraction = 0;
  bool beyond = false;
  for (int d = 0; d < 18; ++d) {
    const int index = point + d;
    const int digit = index >= 0 && index < static_cast<int>(digits.size()) ? digits[index] - '0' : 0;
    fraction = fraction * 10 + digit;
  }
  for (int index = std::max(point + 18, 0); index < static_cast<int>(digits.size()); ++index) {
    beyond = beyond || digits[index] != '0';
  }
  const __int128 multiplier = __int128{1} << (10 * parts->binary_power);
  constexpr __int128 kFractionUnit = 1'000'000'000'000'000'000;  // 10^18
  const __int128 scaled_fraction = fraction * multiplier;
  __int128 value = whole * multiplier + scaled_fraction / kFractionUnit;
  if (scaled_fraction % kFractionUnit != 0 || beyond) ++value;
  return static_cast<std::int64_t>(std::min<__int128>(value, kCountLimit));
}

bool is_zero_quantity(std::string_view q) {
  const std::optional<QuantityParts> parts = parse_quantity(q);
  return parts && is_zero_mantissa(parts->mantissa);
}

}  // namespace gpuguard::k8s

#include "gpuguard/admission/quantity.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

namespace gpuguard::admission {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The suffixes of resource.Quantity: binary SI, decimal SI, or a decimal exponent.
bool is_valid_suffix(std::string_view s) {
  static constexpr std::array<std::string_view, 16> kSuffixes = {
      "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"};
  for (std::string_view known : kSuffixes) {
    if (s == known) return true;
  }
  if (s.empty() || (s[0] != 'e' && s[0] != 'E')) return false;
  s.remove_prefix(1);
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) s.remove_prefix(1);
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_digit(c)) return false;
  }
  return true;
}

constexpr std::int64_t kCountLimit = std::int64_t{1} << 62;

// Multiplier of a suffix as a power of 1024 and a power of ten; false when it is not one.
bool suffix_scale(std::string_view s, int& binary_power, int& decimal_power) {
  static constexpr std::array<std::string_view, 6> kBinary = {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  static constexpr std::array<std::pair<std::string_view, int>, 9> kDecimal = {
      {{"", 0}, {"n", -9}, {"u", -6}, {"m", -3}, {"k", 3}, {"M", 6}, {"G", 9}, {"T", 12}, {"P", 15}}};
  binary_power = 0;
  decimal_power = 0;
  for (std::size_t i = 0; i < kBinary.size(); ++i) {
    if (s == kBinary[i]) {
      binary_power = static_cast<int>(i) + 1;
      return true;
    }
  }
  for (const auto& [suffix, power] : kDecimal) {
    if (s == suffix) {
      decimal_power = power;
      return true;
    }
  }
  if (s == "E") {
    decimal_power = 18;
    return true;
  }
  if (!is_valid_suffix(s)) return false;
  // e<digits>: beyond a few dozen the value is out of range (or zero) anyway.
  const bool negative = s.size() > 1 && s[1] == '-';
  const std::string_view digits = s.substr(s.size() > 1 && (s[1] == '+' || s[1] == '-') ? 2 : 1);
  int power = 0;
  for (char c : digits) power = std::min(power * 10 + (c - '0'), 100);
  decimal_power = negative ? -power : power;
  return true;
}

}  // namespace

std::optional<std::int64_t> quantity_count(std::string_view q) {
  std::size_t i = 0;
  if (i < q.size() && q[i] == '+') ++i;
  std::string digits;  // every digit, the decimal point removed
  int point = -1;      // how many digits stand before the point
  for (; i < q.size(); ++i) {
    if (is_digit(q[i])) {
      digits.push_back(q[i]);
    } else if (q[i] == '.' && point < 0) {
      point = static_cast<int>(digits.size());
    } else {
      break;
    }
  }
  int binary_power = 0, decimal_power = 0;
  if (digits.empty() || !suffix_scale(q.substr(i), binary_power, decimal_power)) return std::nullopt;
  if (point < 0) point = static_cast<int>(digits.size());
  const std::size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return 0;
  point += decimal_power - static_cast<int>(first);
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
  const __int128 multiplier = __int128{1} << (10 * binary_power);
  constexpr __int128 kFractionUnit = 1'000'000'000'000'000'000;  // 10^18
  const __int128 scaled_fraction = fraction * multiplier;
  __int128 value = whole * multiplier + scaled_fraction / kFractionUnit;
  if (scaled_fraction % kFractionUnit != 0 || beyond) ++value;
  return static_cast<std::int64_t>(std::min<__int128>(value, kCountLimit));
}

bool is_zero_quantity(std::string_view q) {
  std::size_t i = 0;
  if (i < q.size() && (q[i] == '+' || q[i] == '-')) ++i;
  bool any_digit = false;
  bool nonzero_digit = false;
  bool seen_dot = false;
  for (; i < q.size(); ++i) {
    if (is_digit(q[i])) {
      any_digit = true;
      nonzero_digit = nonzero_digit || q[i] != '0';
    } else if (q[i] == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
  }
  if (!any_digit || !is_valid_suffix(q.substr(i))) return false;
  return !nonzero_digit;
}

}  // namespace gpuguard::admission

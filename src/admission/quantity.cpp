#include "gpuguard/admission/quantity.hpp"

#include <array>

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

}  // namespace

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

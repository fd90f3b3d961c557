#include "gpuguard/admission/base64.hpp"

#include <array>
#include <cstdint>

namespace gpuguard::admission {
namespace {
constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<std::int8_t, 256> make_decode_table() {
  std::array<std::int8_t, 256> table{};
  for (auto& v : table) v = -1;
  for (std::size_t i = 0; i < kAlphabet.size(); ++i)
    table[static_cast<unsigned char>(kAlphabet[i])] = static_cast<std::int8_t>(i);
  return table;
}
constexpr auto kDecode = make_decode_table();
}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  base64_encode(bytes, out);
  return out;
}

void base64_encode(std::string_view bytes, std::string& out) {
  const std::size_t start = out.size();
  out.resize(start + (bytes.size() + 2) / 3 * 4, '=');
  char* o = out.data() + start;
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const std::uint32_t n = (std::uint32_t(std::uint8_t(bytes[i])) << 16) |
                            (std::uint32_t(std::uint8_t(bytes[i + 1])) << 8) | std::uint8_t(bytes[i + 2]);
    *o++ = kAlphabet[(n >> 18) & 63];
    *o++ = kAlphabet[(n >> 12) & 63];
    *o++ = kAlphabet[(n >> 6) & 63];
    *o++ = kAlphabet[n & 63];
  }
  const std::size_t rest = bytes.size() - i;
  if (rest > 0) {  // the '=' padding is already in place
    std::uint32_t n = std::uint32_t(std::uint8_t(bytes[i])) << 16;
    if (rest == 2) n |= std::uint32_t(std::uint8_t(bytes[i + 1])) << 8;
    *o++ = kAlphabet[(n >> 18) & 63];
    *o++ = kAlphabet[(n >> 12) & 63];
    if (rest == 2) *o = kAlphabet[(n >> 6) & 63];
  }
}

std::optional<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    // '=' is only valid as the last one or two characters of the text; elsewhere the table rejects it.
    int padding = 0;
    if (i + 4 == text.size() && text[i + 3] == '=') padding = text[i + 2] == '=' ? 2 : 1;
    std::uint32_t n = 0;
    for (int j = 0; j < 4 - padding; ++j) {
      const std::int8_t v = kDecode[static_cast<unsigned char>(text[i + j])];
      if (v < 0) return std::nullopt;
      n = (n << 6) | std::uint32_t(v);
    }
    n <<= 6 * padding;
    out += char((n >> 16) & 0xff);
    if (padding < 2) out += char((n >> 8) & 0xff);
    if (padding < 1) out += char(n & 0xff);
  }
  return out;
}

}  // namespace gpuguard::admission

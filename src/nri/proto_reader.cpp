// protobuf's wire format read in place (include/gpuguard/nri/proto_reader.hpp).
#include "gpuguard/nri/proto_reader.hpp"

namespace gpuguard::nri {
namespace {

constexpr int kVarintMaxBytes = 10;
constexpr std::uint32_t kFieldMax = (1U << 29) - 1;

}  // namespace

bool ProtoReader::read_varint(std::uint64_t& value) {
  value = 0;
  for (int i = 0; i < kVarintMaxBytes; ++i) {
    if (rest_.empty()) return false;
    const auto byte = static_cast<unsigned char>(rest_.front());
    rest_.remove_prefix(1);
    value |= static_cast<std::uint64_t>(byte & 0x7fU) << (7 * i);
    if ((byte & 0x80U) == 0) return true;
  }
  return false;  // longer than any 64-bit number
}

bool ProtoReader::next() {
  if (rest_.empty()) return false;
  std::uint64_t key = 0;
  if (!read_varint(key)) return fail();
  const std::uint64_t field = key >> 3;
  if (field == 0 || field > kFieldMax) return fail();
  field_ = static_cast<std::uint32_t>(field);
  number_ = 0;
  bytes_ = {};
  const auto fixed = [&](std::size_t width) {
    if (rest_.size() < width) return false;
    for (std::size_t i = 0; i < width; ++i) {
      number_ |= static_cast<std::uint64_t>(static_cast<unsigned char>(rest_[i])) << (8 * i);
    }
    rest_.remove_prefix(width);
    return true;
  };
  switch (key & 7U) {
    case 0:
      type_ = WireType::varint;
      if (!read_varint(number_)) return fail();
      return true;
    case 1: type_ = WireType::fixed64; return fixed(8) || fail();
    case 2: {
      type_ = WireType::length_delimited;
      std::uint64_t length = 0;
      if (!read_varint(length) || length > rest_.size()) return fail();
      bytes_ = rest_.substr(0, static_cast<std::size_t>(length));
      rest_.remove_prefix(static_cast<std::size_t>(length));
      return true;
    }
    case 5: type_ = WireType::fixed32; return fixed(4) || fail();
    default:
      // Groups (3, 4), long deprecated and never written by NRI, and the unused 6 and 7.
      return fail();
  }
}

}  // namespace gpuguard::nri

#pragma once
// protobuf's wire format written by hand, for tests that make NRI's messages without protobuf's library (the
// fuzzers link none): each field's key, then a varint or a length and the bytes, as protobuf.dev's encoding
// guide says. Nothing here is read back by it: include/gpuguard/nri/proto_reader.hpp does that.
#include <cstdint>
#include <string>
#include <string_view>

namespace gpuguard::test {

class ProtoWriter {
 public:
  ProtoWriter& varint(std::uint32_t field, std::uint64_t value) {
    put(static_cast<std::uint64_t>(field) << 3);
    put(value);
    return *this;
  }
  ProtoWriter& bytes(std::uint32_t field, std::string_view value) {
    put(static_cast<std::uint64_t>(field) << 3 | 2);
    put(value.size());
    out_.append(value);
    return *this;
  }
  ProtoWriter& message(std::uint32_t field, const ProtoWriter& inner) { return bytes(field, inner.out_); }
  const std::string& str() const { return out_; }

 private:
  void put(std::uint64_t value) {
    do {
      const auto low = static_cast<unsigned char>(value & 0x7fU);
      value >>= 7;
      out_.push_back(static_cast<char>(low | (value != 0 ? 0x80U : 0U)));
    } while (value != 0);
  }
  std::string out_;
};

}  // namespace gpuguard::test

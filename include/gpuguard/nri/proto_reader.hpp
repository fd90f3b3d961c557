#pragma once
// protobuf's wire format read in place (protobuf.dev/programming-guides/encoding), without materializing
// a message: the fields of one message in the order they were written, each a varint, a fixed-width
// number or a view of its bytes inside the buffer. The node enforcer reads NRI's requests with it, which
// can be as large as ttrpc's 4 MiB: protobuf's generated classes would hold each string, map entry and
// repeated field apart, several times the request's own size, and copy the ttrpc envelope's payload
// before that (docs/benchmarks.md, the enforcer's memory). Nothing is allocated; a malformed message stops
// the reader and says so, never reads past its buffer.
#include <cstdint>
#include <string_view>

namespace gpuguard::nri {

class ProtoReader {
 public:
  enum class WireType : std::uint8_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

  explicit ProtoReader(std::string_view message) : rest_(message) {}

  // Moves to the next field; false at the end of the message or when it is malformed (then malformed()).
  bool next();

  std::uint32_t field() const { return field_; }
  WireType type() const { return type_; }
  // The field's value: varint() for varint and fixed fields, bytes() for length-delimited ones (a string,
  // bytes, an embedded message or a packed repeated field). The other accessor gives 0 or empty.
  std::uint64_t varint() const { return number_; }
  std::string_view bytes() const { return bytes_; }

  bool malformed() const { return malformed_; }

 private:
  bool read_varint(std::uint64_t& value);
  bool fail() {
    malformed_ = true;
    rest_ = {};
    return false;
  }

  std::string_view rest_;
  std::uint32_t field_ = 0;
  WireType type_ = WireType::varint;
  std::uint64_t number_ = 0;
  std::string_view bytes_;
  bool malformed_ = false;
};

}  // namespace gpuguard::nri

// ttrpc's and NRI's messages read in place (include/gpuguard/nri/messages.hpp).
#include "gpuguard/nri/messages.hpp"

#include "gpuguard/nri/proto_reader.hpp"

namespace gpuguard::nri {

std::optional<RequestEnvelope> read_request(std::string_view bytes) {
  RequestEnvelope envelope;
  ProtoReader reader(bytes);
  while (reader.next()) {
    if (reader.type() != ProtoReader::WireType::length_delimited) continue;
    if (reader.field() == field::kRequestService) envelope.service = reader.bytes();
    if (reader.field() == field::kRequestMethod) envelope.method = reader.bytes();
    if (reader.field() == field::kRequestPayload) envelope.payload = reader.bytes();
  }
  if (reader.malformed()) return std::nullopt;
  return envelope;
}

bool for_each_field(std::string_view message, std::uint32_t number,
                    const std::function<void(std::string_view)>& visit) {
  ProtoReader reader(message);
  while (reader.next()) {
    if (reader.field() == number && reader.type() == ProtoReader::WireType::length_delimited) visit(reader.bytes());
  }
  return !reader.malformed();
}

std::string_view string_field(std::string_view message, std::uint32_t number) {
  std::string_view value;
  ProtoReader reader(message);
  while (reader.next()) {
    if (reader.field() == number && reader.type() == ProtoReader::WireType::length_delimited) value = reader.bytes();
  }
  return value;
}

std::optional<std::uint64_t> varint_field(std::string_view message, std::uint32_t number) {
  std::optional<std::uint64_t> value;
  ProtoReader reader(message);
  while (reader.next()) {
    if (reader.field() == number && reader.type() == ProtoReader::WireType::varint) value = reader.varint();
  }
  return value;
}

bool well_formed(std::string_view message) {
  ProtoReader reader(message);
  while (reader.next()) {
  }
  return !reader.malformed();
}

}  // namespace gpuguard::nri

// NRI's multiplexer frames and ttrpc's messages (include/gpuguard/nri/wire.hpp).
#include "gpuguard/nri/wire.hpp"

#include <algorithm>

namespace gpuguard::nri {
namespace {

void put_u32(std::string& out, std::uint32_t value) {
  out.push_back(static_cast<char>((value >> 24) & 0xff));
  out.push_back(static_cast<char>((value >> 16) & 0xff));
  out.push_back(static_cast<char>((value >> 8) & 0xff));
  out.push_back(static_cast<char>(value & 0xff));
}

std::uint32_t get_u32(std::string_view bytes, std::size_t at) {
  const auto byte = [&](std::size_t i) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at + i]));
  };
  return (byte(0) << 24) | (byte(1) << 16) | (byte(2) << 8) | byte(3);
}

// What a decoder has used is dropped once it is over half its buffer, so the buffer stays within twice
// the largest unit plus what one read adds.
void compact(std::string& buffer, std::size_t& offset) {
  if (offset == buffer.size()) {
    buffer.clear();
    offset = 0;
  } else if (offset > buffer.size() / 2) {
    buffer.erase(0, offset);
    offset = 0;
  }
}

}  // namespace

std::string encode_frames(std::uint32_t conn, std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + (payload.size() / kSendFramePayloadMax + 1) * kMuxHeaderSize);
  while (!payload.empty()) {
    const std::size_t size = std::min(payload.size(), kSendFramePayloadMax);
    put_u32(out, conn);
    put_u32(out, static_cast<std::uint32_t>(size));
    out.append(payload.substr(0, size));
    payload.remove_prefix(size);
  }
  return out;
}

std::string encode_message(std::uint32_t stream, MessageType type, std::uint8_t flags, std::string_view payload) {
  std::string out;
  out.reserve(kTtrpcHeaderSize + payload.size());
  put_u32(out, static_cast<std::uint32_t>(payload.size()));
  put_u32(out, stream);
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  out.append(payload);
  return out;
}

void BufferedDecoder::feed(std::string_view bytes) {
  if (!error_.empty()) return;
  compact(buffer_, offset_);
  buffer_.append(bytes);
}

std::optional<Frame> FrameDecoder::next() {
  while (error_.empty() && buffered() >= kMuxHeaderSize) {
    const std::string_view bytes = rest();
    const std::uint32_t conn = get_u32(bytes, 0);
    const std::uint32_t size = get_u32(bytes, 4);
    if (conn == 0) {
      error_ = "multiplexer frame on connection 0, which is reserved";
    } else if (size > kMuxFrameMax) {
      error_ =
          "multiplexer frame of " + std::to_string(size) + " bytes, over the limit of " + std::to_string(kMuxFrameMax);
    } else if (bytes.size() < kMuxHeaderSize + size) {
      expect(kMuxHeaderSize + size);
      return std::nullopt;
    } else {
      consume(kMuxHeaderSize + size);
      if (size == 0) continue;
      return Frame{conn, std::string(bytes.substr(kMuxHeaderSize, size))};
    }
  }
  return std::nullopt;
}

std::optional<Message> MessageDecoder::next() {
  if (!error_.empty() || buffered() < kTtrpcHeaderSize) return std::nullopt;
  const std::string_view bytes = rest();
  const std::uint32_t size = get_u32(bytes, 0);
  const auto type = static_cast<std::uint8_t>(bytes[8]);
  if (size > kTtrpcMessageMax) {
    error_ =
        "ttrpc message of " + std::to_string(size) + " bytes, over the limit of " + std::to_string(kTtrpcMessageMax);
    return std::nullopt;
  }
  if (type < 1 || type > 3) {
    error_ = "ttrpc message of unknown type " + std::to_string(type);
    return std::nullopt;
  }
  if (bytes.size() < kTtrpcHeaderSize + size) {
    expect(kTtrpcHeaderSize + size);
    return std::nullopt;
  }
  Message message{get_u32(bytes, 4), static_cast<MessageType>(type), static_cast<std::uint8_t>(bytes[9]),
                  std::string(bytes.substr(kTtrpcHeaderSize, size))};
  consume(kTtrpcHeaderSize + size);
  return message;
}

}  // namespace gpuguard::nri

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

void Demultiplexer::feed(std::string_view bytes, const Sink& sink) {
  while (error_.empty() && !bytes.empty()) {
    if (payload_left_ > 0) {
      const std::size_t piece = std::min(payload_left_, bytes.size());
      sink(conn_, bytes.substr(0, piece));
      payload_left_ -= piece;
      bytes.remove_prefix(piece);
      continue;
    }
    const std::size_t take = std::min(kMuxHeaderSize - header_have_, bytes.size());
    std::copy_n(bytes.data(), take, header_.data() + header_have_);
    header_have_ += take;
    bytes.remove_prefix(take);
    if (header_have_ < kMuxHeaderSize) return;
    header_have_ = 0;
    const std::string_view header(reinterpret_cast<const char*>(header_.data()), header_.size());
    conn_ = get_u32(header, 0);
    const std::uint32_t size = get_u32(header, 4);
    if (conn_ == 0) {
      error_ = "multiplexer frame on connection 0, which is reserved";
    } else if (size > kMuxFrameMax) {
      error_ =
          "multiplexer frame of " + std::to_string(size) + " bytes, over the limit of " + std::to_string(kMuxFrameMax);
    }
    payload_left_ = error_.empty() ? size : 0;
  }
}

void MessageDecoder::feed(std::string_view bytes) {
  while (error_.empty() && !bytes.empty()) {
    if (in_payload_) {
      const std::size_t piece = std::min(payload_size_ - current_.payload.size(), bytes.size());
      current_.payload.append(bytes.substr(0, piece));
      bytes.remove_prefix(piece);
    } else {
      const std::size_t take = std::min(kTtrpcHeaderSize - header_have_, bytes.size());
      std::copy_n(bytes.data(), take, header_.data() + header_have_);
      header_have_ += take;
      bytes.remove_prefix(take);
      if (header_have_ < kTtrpcHeaderSize) return;
      header_have_ = 0;
      const std::string_view header(reinterpret_cast<const char*>(header_.data()), header_.size());
      const std::uint32_t size = get_u32(header, 0);
      const std::uint8_t type = header_[8];
      if (size > kTtrpcMessageMax) {
        error_ = "ttrpc message of " + std::to_string(size) + " bytes, over the limit of " +
                 std::to_string(kTtrpcMessageMax);
        return;
      }
      if (type < 1 || type > 3) {
        error_ = "ttrpc message of unknown type " + std::to_string(type);
        return;
      }
      current_ = Message{get_u32(header, 4), static_cast<MessageType>(type), header_[9], {}};
      current_.payload.reserve(size);
      payload_size_ = size;
      in_payload_ = true;
    }
    if (current_.payload.size() == payload_size_) {
      ready_.push_back(std::move(current_));
      current_ = Message{};
      in_payload_ = false;
    }
  }
}

std::optional<Message> MessageDecoder::next() {
  // Whole messages that came before an error are given all the same: they were read in full.
  if (ready_.empty()) return std::nullopt;
  Message message = std::move(ready_.front());
  ready_.pop_front();
  return message;
}

std::size_t MessageDecoder::buffered() const {
  std::size_t held = header_have_ + current_.payload.size();
  for (const Message& message : ready_) held += message.payload.size();
  return held;
}

}  // namespace gpuguard::nri

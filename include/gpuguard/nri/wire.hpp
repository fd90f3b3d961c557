#pragma once
// The bytes on NRI's socket, without I/O: NRI's multiplexer (containerd/nri pkg/net/multiplex), which
// carries several logical connections over one unix socket, and ttrpc's message framing
// (containerd/ttrpc PROTOCOL.md) on each of them. Decoders take bytes as they come and give whole frames
// and messages; every length is checked against the protocol's limits before anything is held for it, so
// no sequence of bytes makes them hold more than one largest message.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gpuguard::nri {

// The multiplexer: each frame is u32 connection id, u32 payload length (big-endian), then the payload.
inline constexpr std::uint32_t kPluginServiceConn = 1;   // the runtime calls the plugin's service here
inline constexpr std::uint32_t kRuntimeServiceConn = 2;  // the plugin calls the runtime's service here
inline constexpr std::size_t kMuxHeaderSize = 8;
// ttrpc: each message is u32 payload length, u32 stream id, u8 type, u8 flags (big-endian), then the payload.
inline constexpr std::size_t kTtrpcHeaderSize = 10;
inline constexpr std::size_t kTtrpcMessageMax = std::size_t{4} << 20;  // ttrpc's messageLengthMax
// The largest frame the Go sender writes: one whole ttrpc message with its header.
inline constexpr std::size_t kMuxFrameMax = kTtrpcHeaderSize + kTtrpcMessageMax;
// The largest frame gpuguard sends. The Go side reads each connection through a 4096-byte buffer, and a
// longer frame that arrives when it expects a message's header fails its read and ends the connection.
inline constexpr std::size_t kSendFramePayloadMax = 4096;

enum class MessageType : std::uint8_t { request = 1, response = 2, data = 3 };

struct Frame {
  std::uint32_t conn = 0;
  std::string payload;
};

struct Message {
  std::uint32_t stream = 0;
  MessageType type = MessageType::request;
  std::uint8_t flags = 0;
  std::string payload;
};

// `payload` on connection `conn` as consecutive frames of at most kSendFramePayloadMax bytes each.
std::string encode_frames(std::uint32_t conn, std::string_view payload);
// One ttrpc message: its header, then `payload` (at most kTtrpcMessageMax bytes).
std::string encode_message(std::uint32_t stream, MessageType type, std::uint8_t flags, std::string_view payload);

// The bytes a decoder holds until a whole frame or message is there, and the error that stopped it.
class BufferedDecoder {
 public:
  void feed(std::string_view bytes);
  const std::string& error() const { return error_; }
  std::size_t buffered() const { return buffer_.size() - offset_; }

 protected:
  std::string_view rest() const { return {buffer_.data() + offset_, buffered()}; }
  // Room for `size` more bytes from the current position at once, never more.
  void expect(std::size_t size) { buffer_.reserve(offset_ + size); }
  void consume(std::size_t size) { offset_ += size; }
  std::string error_;

 private:
  std::string buffer_;
  std::size_t offset_ = 0;
};

// Frames out of the socket's bytes. A frame that claims more than kMuxFrameMax, or connection 0, is an
// error (error() says which), after which nothing more is decoded: the connection is to be dropped.
class FrameDecoder : public BufferedDecoder {
 public:
  // The next whole frame (empty frames are skipped), or nullopt when more bytes are needed or on error.
  std::optional<Frame> next();
};

// Messages out of one logical connection's byte stream (frames may split or join messages). A message
// longer than kTtrpcMessageMax, or of an unknown type, is an error, as for FrameDecoder.
class MessageDecoder : public BufferedDecoder {
 public:
  std::optional<Message> next();
};

}  // namespace gpuguard::nri

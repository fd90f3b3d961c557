#pragma once
// The bytes on NRI's socket, without I/O: NRI's multiplexer (containerd/nri pkg/net/multiplex), which
// carries several logical connections over one unix socket, and ttrpc's message framing
// (containerd/ttrpc PROTOCOL.md) on each of them. The decoders take bytes as they come and give each
// connection's bytes and then whole messages; every length is checked against the protocol's limits before
// anything is held for it, so no sequence of bytes makes them hold more than one largest message.
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
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

// Each logical connection's bytes out of the socket's, as they come: a frame's payload is handed on in
// the pieces it arrives in, never held whole, so the demultiplexer itself holds at most one frame header.
// A frame that claims more than kMuxFrameMax, or connection 0, is an error (error() says which), after
// which nothing more is handed on: the connection is to be dropped. Empty frames are skipped.
class Demultiplexer {
 public:
  using Sink = std::function<void(std::uint32_t conn, std::string_view bytes)>;
  void feed(std::string_view bytes, const Sink& sink);
  const std::string& error() const { return error_; }

 private:
  std::array<unsigned char, kMuxHeaderSize> header_{};
  std::size_t header_have_ = 0;
  std::uint32_t conn_ = 0;
  std::size_t payload_left_ = 0;
  std::string error_;
};

// Messages out of one logical connection's byte stream (frames may split or join messages). Each message's
// payload goes straight into a string of its own, allocated once at its declared size, which next() hands
// over: one copy of a request is held, never two. A message longer than kTtrpcMessageMax, or of an unknown
// type, is an error, as for the Demultiplexer.
class MessageDecoder {
 public:
  void feed(std::string_view bytes);
  // The next whole message, or nullopt when more bytes are needed. After an error, the whole messages that
  // came before it, then nothing.
  std::optional<Message> next();
  const std::string& error() const { return error_; }
  // Bytes held: whole messages not yet taken, and the one in progress.
  std::size_t buffered() const;

 private:
  std::array<unsigned char, kTtrpcHeaderSize> header_{};
  std::size_t header_have_ = 0;
  bool in_payload_ = false;
  std::size_t payload_size_ = 0;
  Message current_;
  std::deque<Message> ready_;
  std::string error_;
};

}  // namespace gpuguard::nri

// NRI's multiplexer frames and ttrpc's messages, byte for byte (golden bytes written from PROTOCOL.md and
// containerd/nri's pkg/net/multiplex), and what the decoders do with frames split, joined, empty,
// oversized or on a connection they do not know.
#include <catch2/catch.hpp>

#include <string>

#include "gpuguard/nri/wire.hpp"

using namespace gpuguard::nri;
using namespace std::string_literals;

namespace {

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

}  // namespace

TEST_CASE("wire: a ttrpc request and its frame, byte for byte") {
  // Stream 1, a request, flags 0, payload "abc": u32 length 3, u32 stream 1, type 1, flags 0.
  const std::string message = encode_message(1, MessageType::request, 0, "abc");
  CHECK(message == bytes({0, 0, 0, 3, 0, 0, 0, 1, 1, 0}) + "abc");
  // On connection 2: u32 connection 2, u32 length 13, then the message.
  CHECK(encode_frames(kRuntimeServiceConn, message) == bytes({0, 0, 0, 2, 0, 0, 0, 13}) + message);
  // A response on stream 0x01020305, flags 0.
  CHECK(encode_message(0x01020305, MessageType::response, 0, "") == bytes({0, 0, 0, 0, 1, 2, 3, 5, 2, 0}));
}

TEST_CASE("wire: a message over 4096 bytes leaves as frames of at most 4096, and is read back whole") {
  const std::string payload(10000, 'x');
  const std::string framed = encode_frames(kPluginServiceConn, encode_message(7, MessageType::response, 0, payload));
  // 10,010 bytes of message: 4096 + 4096 + 1818, each behind its 8-byte header.
  CHECK(framed.size() == 10010 + 3 * kMuxHeaderSize);
  CHECK(framed.substr(0, 8) == bytes({0, 0, 0, 1, 0, 0, 0x10, 0}));
  CHECK(framed.substr(8 + 4096, 8) == bytes({0, 0, 0, 1, 0, 0, 0x10, 0}));
  CHECK(framed.substr(std::size_t{2} * (8 + 4096), 8) == bytes({0, 0, 0, 1, 0, 0, 0x07, 0x1a}));
  // Fed a byte at a time, as a slow socket might give it.
  Demultiplexer frames;
  MessageDecoder messages;
  std::size_t pieces = 0;
  for (char c : framed) {
    frames.feed(std::string(1, c), [&](std::uint32_t conn, std::string_view bytes) {
      CHECK(conn == kPluginServiceConn);
      messages.feed(bytes);
      ++pieces;
    });
  }
  CHECK(pieces == 10010);  // every payload byte handed on as it came, none held back
  const auto message = messages.next();
  REQUIRE(message);
  CHECK(message->stream == 7);
  CHECK(message->type == MessageType::response);
  CHECK(message->payload == payload);
  CHECK_FALSE(messages.next());
  CHECK(messages.buffered() == 0);
}

TEST_CASE("wire: frames joined in one read, frames from the Go side up to 4 MiB, and empty ones") {
  Demultiplexer frames;
  // What the Go sender does with a large message: a 4096-byte frame, then the rest in one frame.
  const std::string large(kTtrpcMessageMax, 'y');
  const std::string message = encode_message(3, MessageType::request, 0, large);
  std::string wire = bytes({0, 0, 0, 1, 0, 0, 0x10, 0}) + message.substr(0, 4096);
  const std::size_t rest = message.size() - 4096;
  wire += bytes({0, 0, 0, 1, static_cast<int>(rest >> 24), static_cast<int>((rest >> 16) & 0xff),
                 static_cast<int>((rest >> 8) & 0xff), static_cast<int>(rest & 0xff)}) +
          message.substr(4096);
  wire += bytes({0, 0, 0, 2, 0, 0, 0, 0});  // an empty frame: skipped
  wire += encode_frames(kRuntimeServiceConn, "z");
  MessageDecoder calls;
  std::string on_two;
  // As the plugin reads: 64 KiB at a time. The large message is held once, in its own string.
  for (std::size_t at = 0; at < wire.size(); at += 65536) {
    frames.feed(std::string_view(wire).substr(at, 65536), [&](std::uint32_t conn, std::string_view piece) {
      if (conn == kPluginServiceConn) calls.feed(piece);
      if (conn == kRuntimeServiceConn) on_two += piece;
    });
    CHECK(calls.buffered() <= kTtrpcMessageMax);
  }
  CHECK(frames.error().empty());
  CHECK(on_two == "z");
  const auto call = calls.next();
  REQUIRE(call);
  CHECK(call->payload.size() == kTtrpcMessageMax);
  CHECK(call->payload.capacity() == kTtrpcMessageMax);  // allocated once, at its declared size
}

TEST_CASE("wire: a frame or message over the limit, connection 0, or an unknown type stops the decoder") {
  Demultiplexer oversized;
  const std::size_t too_long = kMuxFrameMax + 1;
  std::size_t handed = 0;
  const auto count = [&](std::uint32_t, std::string_view piece) { handed += piece.size(); };
  oversized.feed(bytes({0, 0, 0, 1, static_cast<int>(too_long >> 24), static_cast<int>((too_long >> 16) & 0xff),
                        static_cast<int>((too_long >> 8) & 0xff), static_cast<int>(too_long & 0xff)}),
                 count);
  CHECK(oversized.error() == "multiplexer frame of 4194315 bytes, over the limit of 4194314");
  oversized.feed(std::string(100, 'x'), count);  // nothing more is taken
  CHECK(handed == 0);

  Demultiplexer reserved;
  reserved.feed(bytes({0, 0, 0, 0, 0, 0, 0, 1, 'x'}), count);
  CHECK(reserved.error() == "multiplexer frame on connection 0, which is reserved");
  CHECK(handed == 0);

  MessageDecoder long_message;
  long_message.feed(bytes({0, 0x40, 0, 1, 0, 0, 0, 1, 1, 0}));
  CHECK_FALSE(long_message.next());
  CHECK(long_message.error() == "ttrpc message of 4194305 bytes, over the limit of 4194304");
  CHECK(long_message.buffered() == 0);

  MessageDecoder unknown_type;
  unknown_type.feed(bytes({0, 0, 0, 0, 0, 0, 0, 1, 9, 0}));
  CHECK_FALSE(unknown_type.next());
  CHECK(unknown_type.error() == "ttrpc message of unknown type 9");
}

TEST_CASE("wire: a message that came whole before bytes that are not the protocol is still given, then nothing") {
  // Found by the fuzzer: the same bytes read at once or a few at a time must give the same messages.
  const std::string good = encode_message(1, MessageType::request, 0, "abc");
  const std::string bad = bytes({0, 0, 0, 0, 0, 0, 0, 3, 9, 0});  // a message of unknown type
  for (const std::size_t read : {std::size_t{1}, std::size_t{4}, good.size() + bad.size()}) {
    MessageDecoder decoder;
    std::vector<Message> got;
    const std::string all = good + bad;
    for (std::size_t at = 0; at < all.size(); at += read) {
      decoder.feed(std::string_view(all).substr(at, read));
      while (auto message = decoder.next()) got.push_back(std::move(*message));
    }
    INFO("reads of " << read);
    REQUIRE(got.size() == 1);
    CHECK(got[0].payload == "abc");
    CHECK(decoder.error() == "ttrpc message of unknown type 9");
  }
}

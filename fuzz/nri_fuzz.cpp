// libFuzzer target: bytes as the runtime's side of NRI's socket, and as a container the enforcer decides.
// The first byte picks the size of the reads the bytes arrive in; they go through the multiplexer's frame
// decoder, then each connection's ttrpc message decoder, as src/nri/plugin.cpp feeds them. Besides "no
// crash, no sanitizer finding", it asserts what the decoders promise: no frame on connection 0 or over
// the frame limit, no message over ttrpc's limit or of an unknown type, never more buffered than one
// largest frame and one read, the same frames whatever the reads' size, and every frame and message
// encoded again decodes to itself. The rest of the input, split at newlines, is a container's
// environment and device paths for the decision, which must refuse only what it names, adjust only to the
// allocation or void, and never act under audit.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/enforcer/decision.hpp"
#include "gpuguard/nri/wire.hpp"

using namespace gpuguard;

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "property violated: %s\n", what);
  std::abort();
}

std::vector<nri::Frame> decode_all(std::string_view bytes, std::size_t read_size) {
  nri::FrameDecoder frames;
  std::vector<nri::Frame> out;
  for (std::size_t at = 0; at < bytes.size(); at += read_size) {
    frames.feed(bytes.substr(at, read_size));
    if (frames.buffered() > nri::kMuxHeaderSize + nri::kMuxFrameMax + read_size)
      violated("frame decoder over its bound");
    while (auto frame = frames.next()) {
      if (frame->conn == 0) violated("a frame on connection 0");
      if (frame->payload.empty() || frame->payload.size() > nri::kMuxFrameMax)
        violated("a frame of an impossible size");
      out.push_back(std::move(*frame));
    }
    if (!frames.error().empty()) break;
  }
  return out;
}

void check_messages(const std::vector<nri::Frame>& frames) {
  nri::MessageDecoder calls, answers;
  for (const nri::Frame& frame : frames) {
    nri::MessageDecoder& decoder = frame.conn == nri::kPluginServiceConn ? calls : answers;
    decoder.feed(frame.payload);
    if (decoder.buffered() > nri::kTtrpcHeaderSize + nri::kTtrpcMessageMax + nri::kMuxFrameMax) {
      violated("message decoder over its bound");
    }
    while (auto message = decoder.next()) {
      if (message->payload.size() > nri::kTtrpcMessageMax) violated("a message over ttrpc's limit");
      const auto type = static_cast<int>(message->type);
      if (type < 1 || type > 3) violated("a message of an unknown type");
      // Encoded again, it decodes to itself.
      nri::MessageDecoder again;
      again.feed(nri::encode_message(message->stream, message->type, message->flags, message->payload));
      const auto same = again.next();
      if (!same || same->stream != message->stream || same->payload != message->payload ||
          same->flags != message->flags) {
        violated("a message that does not survive encoding");
      }
    }
  }
}

void check_decision(std::string_view text) {
  enforcer::ContainerView view;
  view.pod_namespace = "ns";
  view.pod_name = "pod";
  view.container = "c";
  std::size_t start = 0;
  bool devices = false;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string line(text.substr(start, end - start));
    if (line == "--") {
      devices = true;
    } else if (devices) {
      view.devices.push_back({line, "c", static_cast<std::int64_t>(line.size() % 3 == 0 ? 195 : 1),
                              static_cast<std::int64_t>(line.size() % 300)});
      view.mounts.push_back({line, line, "bind", {"rbind"}});
      view.cdi_devices.push_back(line);
    } else {
      view.env.push_back(line);
    }
    start = end + 1;
  }
  const std::vector<enforcer::NodeGpu> node = {{"GPU-a", 0, "0000:01:00.0", {{"MIG-m", {7, 8}}}},
                                               {"GPU-b", 1, "0000:02:00.0", {}}};
  enforcer::Allocation allocation;
  allocation.source = enforcer::Allocation::Source::pod_resources;
  allocation.gpus = {"GPU-b"};
  for (const auto mode : {policy::NodeEnforcement::enforce, policy::NodeEnforcement::audit}) {
    policy::Policy policy;
    policy.node_enforcement = mode;
    const enforcer::Decision decision = enforcer::decide(view, allocation, node, policy);
    if (decision.action != enforcer::Decision::Action::allow && decision.beyond.empty()) violated("acted on nothing");
    if (mode == policy::NodeEnforcement::audit && decision.action != enforcer::Decision::Action::allow) {
      violated("acted under audit");
    }
    if (decision.action == enforcer::Decision::Action::adjust && decision.visible_devices.value_or("") != "GPU-b") {
      violated("adjusted to something other than the allocation");
    }
    if (decision.action == enforcer::Decision::Action::refuse && decision.message.find("gpuguard: ") != 0) {
      violated("a refusal that does not say it is gpuguard's");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t read_size = 1 + data[0] % 97;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto chunked = decode_all(bytes, read_size);
  const auto whole = decode_all(bytes, bytes.size() == 0 ? 1 : bytes.size());
  if (chunked.size() != whole.size()) violated("frames depend on the size of the reads");
  for (std::size_t i = 0; i < chunked.size(); ++i) {
    if (chunked[i].conn != whole[i].conn || chunked[i].payload != whole[i].payload) {
      violated("frames depend on the size of the reads");
    }
    // Encoded again as gpuguard sends (in frames of at most 4096 bytes), the payload comes back whole.
    std::string back;
    for (const auto& frame : decode_all(nri::encode_frames(chunked[i].conn, chunked[i].payload), 4096)) {
      if (frame.payload.size() > nri::kSendFramePayloadMax) violated("a frame gpuguard sends over 4096 bytes");
      back += frame.payload;
    }
    if (back != chunked[i].payload) violated("a payload that does not survive framing");
  }
  check_messages(chunked);
  check_decision(bytes);
  return 0;
}

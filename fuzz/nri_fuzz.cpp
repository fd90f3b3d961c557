// libFuzzer target: bytes as the runtime's side of NRI's socket, and as the messages the enforcer reads in
// place. The first byte picks the size of the reads the bytes arrive in; they go through the
// demultiplexer, then each connection's ttrpc message decoder, as src/nri/plugin.cpp feeds them. Besides
// "no crash, no sanitizer finding", it asserts what the decoders promise: no frame on connection 0 or over
// the frame limit, no message over ttrpc's limit or of an unknown type, never more held than one largest
// message, the same bytes per connection whatever the reads' size, and every message encoded again decodes
// to itself. Each message's payload is then read as a ttrpc request, and its payload as an NRI
// CreateContainerRequest and ValidateContainerAdjustmentRequest: the view holds at most its bounds, and the
// decision on it names at most kBeyondKept lines, refuses with at most kMessageMax bytes, never acts
// under audit, and sets only the variables it may, to the allocation or void, which is then within. The
// same bytes as the kubelet's pod-resources answer, read as a stream: the same pods whatever the chunks. And
// as the mask check's inputs (check_mask_hook).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/enforcement/decision.hpp"
#include "gpuguard/enforcement/mask_hook.hpp"
#include "gpuguard/enforcer/pod_resources_reader.hpp"
#include "gpuguard/k8s/host_path.hpp"
#include "gpuguard/nri/container_view.hpp"
#include "gpuguard/nri/messages.hpp"
#include "gpuguard/nri/wire.hpp"

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "property violated: %s\n", what);
  std::abort();
}

// The same bytes as the mask check's inputs (mask_hook.hpp): as the runtime's state or a config.json, only
// the values asked for are kept, each within a path's size; as a mountinfo before pivot_root, every place
// it names is said as a path in the container, at most kBeyondKept of them; the verdict refuses each, or
// mounts it cannot check.
void check_mask_hook(std::string_view bytes) {
  namespace enforcement = gpuguard::enforcement;
  std::istringstream json{std::string(bytes)};
  std::string why;
  if (const auto values = enforcement::json_values(json, {"pid", "bundle", "root/path"}, why)) {
    if (values->size() != 3) violated("json_values kept other than the paths asked for");
    for (const std::string& value : *values) {
      if (value.size() > enforcement::kPathMax) violated("a JSON value kept past a path's size");
    }
  } else if (why.empty()) {
    violated("JSON refused without a reason");
  }
  const std::vector<enforcement::NodeView::RootPlace> places = {{"/run/gpuguard", "0:25", "/gpuguard"},
                                                                {"/run/nvidia/mps", "8:1", "/run/nvidia/mps"}};
  const std::string rootfs = "/r";
  const auto unmasked =
      enforcement::unmasked_roots(bytes, places, enforcement::MaskCheck{.rootfs = rootfs, .masks_read_only = false});
  if (unmasked.size() > enforcement::kBeyondKept) violated("more unmasked places than kept");
  for (const std::string& place : unmasked) {
    if (!place.starts_with('/')) violated("an unmasked place not said as a path in the container");
  }
  const std::string verdict = enforcement::mask_hook_verdict({places, false}, "", bytes, rootfs);
  // It refuses wherever a place is unmasked, and also where the mounts show no root or no mask to judge.
  if ((!unmasked.empty() && verdict.empty()) || (!verdict.empty() && !verdict.starts_with("gpuguard: "))) {
    violated("the verdict does not follow the unmasked places");
  }
  if (!verdict.empty() && unmasked.empty() && verdict.find("cannot be checked") == std::string::npos) {
    violated("a refusal naming no unmasked place that does not say the mounts cannot be checked");
  }
}

struct Decoded {
  std::map<std::uint32_t, std::string> streams;  // each connection's bytes
  std::vector<gpuguard::nri::Message> messages;  // connection 1's messages
};

Decoded decode_all(std::string_view bytes, std::size_t read_size) {
  gpuguard::nri::Demultiplexer frames;
  gpuguard::nri::MessageDecoder calls;
  Decoded out;
  for (std::size_t at = 0; at < bytes.size() && frames.error().empty(); at += read_size) {
    frames.feed(bytes.substr(at, read_size), [&](std::uint32_t conn, std::string_view piece) {
      if (conn == 0) violated("bytes on connection 0");
      if (piece.empty()) violated("an empty piece");
      out.streams[conn].append(piece);
      if (conn == gpuguard::nri::kPluginServiceConn) calls.feed(piece);
    });
    if (calls.buffered() > gpuguard::nri::kTtrpcMessageMax + read_size + gpuguard::nri::kTtrpcHeaderSize) {
      violated("message decoder over its bound");
    }
    while (auto message = calls.next()) {
      if (message->payload.size() > gpuguard::nri::kTtrpcMessageMax) violated("a message over ttrpc's limit");
      const auto type = static_cast<int>(message->type);
      if (type < 1 || type > 3) violated("a message of an unknown type");
      out.messages.push_back(std::move(*message));
    }
  }
  return out;
}

namespace enforcement = gpuguard::enforcement;

void check_view(const enforcement::ContainerView& view) {
  if (view.mounts.size() > enforcement::kMountsMax || view.devices.size() > enforcement::kListMax ||
      view.device_rules.size() > enforcement::kListMax || view.cdi_devices.size() > enforcement::kListMax ||
      view.cdi_annotation_names.size() > enforcement::kListMax || view.unread.size() > enforcement::kUnreadKept) {
    violated("a view over its list bound");
  }
  if (enforcement::view_bytes(view) > enforcement::view_bytes_max()) violated("a view over its byte bound");
  if (view.selections.size() > 2 + enforcement::kSwarmMax) violated("a view holding more variables than it reads");
  for (const auto& [name, selection] : view.selections) {
    if (selection.last.size() > enforcement::kValueMax) violated("a view holding a value over its bound");
  }
  for (const auto& mount : view.mounts) {
    if (mount.source.size() > enforcement::kPathMax || mount.destination.size() > enforcement::kPathMax) {
      violated("a view holding a path over PATH_MAX");
    }
  }
  for (const auto& device : view.devices) {
    if (device.path.size() > enforcement::kPathMax) violated("a view holding a path over PATH_MAX");
  }
  for (const auto& name : view.cdi_devices) {
    if (name.size() > enforcement::kNameMax) violated("a view holding a name over its bound");
  }
  for (const auto& [key, name] : view.cdi_annotation_names) {
    if (key.size() > enforcement::kNameMax || name.size() > enforcement::kNameMax) {
      violated("a view holding an annotation over its bound");
    }
  }
}

void check_decision(const gpuguard::enforcement::ContainerView& view, const gpuguard::enforcement::NodeView& node) {
  gpuguard::enforcement::Allocation allocation;
  allocation.source = gpuguard::enforcement::Allocation::Source::pod_resources;
  allocation.gpus = {"GPU-b"};
  for (const auto mode : {gpuguard::policy::NodeEnforcement::enforce, gpuguard::policy::NodeEnforcement::audit}) {
    gpuguard::policy::Policy policy;
    policy.node_enforcement = mode;
    const gpuguard::enforcement::Decision decision = gpuguard::enforcement::decide(view, allocation, node, policy);
    if (decision.action != gpuguard::enforcement::Decision::Action::allow && decision.beyond.empty())
      violated("acted on nothing");
    if (decision.beyond.size() > gpuguard::enforcement::kBeyondKept || decision.beyond.size() > decision.beyond_count) {
      violated("more lines kept than the bound, or than counted");
    }
    if (decision.message.size() > gpuguard::enforcement::kMessageMax) violated("a message over its bound");
    if (mode == gpuguard::policy::NodeEnforcement::audit &&
        decision.action != gpuguard::enforcement::Decision::Action::allow) {
      violated("acted under audit");
    }
    // What is written is the allocation, in its one form, and nothing else.
    for (const auto& [name, value] : decision.set_env) {
      if (name == gpuguard::enforcement::kVisibleDevices && value != "GPU-b")
        violated("set to something other than the allocation");
      if (name == gpuguard::enforcement::kImexChannels && !value.empty())
        violated("IMEX channels set to ones not allocated");
      if (name != gpuguard::enforcement::kVisibleDevices && name != gpuguard::enforcement::kImexChannels)
        violated("set another variable");
    }
    // Written, it is within: the same container made with the adjustment is left as it is, or refused for
    // what no variable takes away.
    if (decision.action == gpuguard::enforcement::Decision::Action::adjust) {
      const auto again = gpuguard::enforcement::decide(
          gpuguard::enforcement::with_masks(gpuguard::enforcement::with_env_set(view, decision.set_env),
                                            decision.masks),
          allocation, node, policy);
      if (again.action == gpuguard::enforcement::Decision::Action::adjust) violated("written, and not within");
    }
    // A mask goes over an MPS root, strictly below a bind mount's destination, and nowhere else.
    for (const std::string& at : decision.masks) {
      if (!at.ends_with("/gpuguard") && !at.ends_with("/nvidia/mps")) violated("a mask over no MPS root");
      const bool below_a_bind = std::any_of(view.mounts.begin(), view.mounts.end(), [&](const auto& mount) {
        const std::string destination = gpuguard::k8s::lexical_path(mount.destination);
        return gpuguard::enforcement::is_bind(mount) && destination != at &&
               gpuguard::k8s::is_or_under(at, destination);
      });
      if (!below_a_bind) violated("a mask below no bind mount");
    }
    if (!decision.masks.empty() && decision.action != gpuguard::enforcement::Decision::Action::adjust)
      violated("masks that are not written");
    if (decision.action == gpuguard::enforcement::Decision::Action::refuse &&
        decision.message.find("gpuguard: ") != 0) {
      violated("a refusal that does not say it is gpuguard's");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t read_size = 1 + data[0] % 97;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Decoded chunked = decode_all(bytes, read_size);
  const Decoded whole = decode_all(bytes, bytes.empty() ? 1 : bytes.size());
  if (chunked.streams != whole.streams || chunked.messages.size() != whole.messages.size()) {
    violated("what comes out depends on the size of the reads");
  }
  gpuguard::enforcement::NodeView node;
  node.gpus = {{"GPU-a", 0, "0000:01:00.0"}, {"GPU-b", 1, "0000:02:00.0"}};
  node.gpus[0].mig_devices = {{"MIG-m", 0, 0, "", {7, 8}}};
  node.cdi_devices["nvidia.com/gpu=all"] = {"/dev/nvidia0", "/dev/nvidia1"};
  node.mps_roots_maskable = {"/run/gpuguard", "/run/nvidia/mps"};
  for (const gpuguard::nri::Message& message : chunked.messages) {
    // Encoded again, it decodes to itself.
    gpuguard::nri::MessageDecoder again;
    again.feed(gpuguard::nri::encode_message(message.stream, message.type, message.flags, message.payload));
    const auto same = again.next();
    if (!same || same->stream != message.stream || same->payload != message.payload || same->flags != message.flags) {
      violated("a message that does not survive encoding");
    }
    // The payload as a ttrpc request, and its payload as NRI's requests the enforcer reads.
    std::string_view request = message.payload;
    if (const auto envelope = gpuguard::nri::read_request(message.payload)) request = envelope->payload;
    const std::string_view pod = gpuguard::nri::string_field(request, gpuguard::nri::field::kCreatePod);
    const std::string_view container = gpuguard::nri::string_field(request, gpuguard::nri::field::kCreateContainer);
    auto view = gpuguard::nri::view_of(pod, container, node, {"app"}, gpuguard::nri::as_written);
    if (!view) continue;
    check_view(*view);
    check_decision(*view, node);
    if (gpuguard::nri::apply_adjustment(*view,
                                        gpuguard::nri::string_field(request, gpuguard::nri::field::kValidateAdjust),
                                        node, gpuguard::nri::as_written)) {
      check_view(*view);
      check_decision(*view, node);
    }
  }
  // The bytes as the kubelet's pod-resources answer, in the read size's chunks and whole: the same pods and
  // the same verdict whatever the chunks, and no pod kept past its bound.
  const auto pods_of = [&](std::size_t chunk) {
    std::vector<std::string_view> chunks;
    for (std::size_t at = 0; at < bytes.size(); at += chunk) chunks.push_back(bytes.substr(at, chunk));
    std::string taken;
    const std::string error = gpuguard::enforcer::read_pod_resources(
        chunks, [](std::string_view, std::string_view name) { return name.size() % 2 == 0; },
        [&](std::string_view ns, std::string_view name, gpuguard::enforcement::PodResources pod) {
          std::size_t kept = 0;
          for (const auto& c : pod.containers) {
            kept += c.name.size();
            for (const auto& d : c.devices) {
              kept += d.resource.size();
              for (const auto& id : d.ids) kept += id.size() + 1;
            }
            for (const auto& device : c.cdi_devices) kept += device.size() + 1;
          }
          if (kept > gpuguard::enforcer::kPodKeptMax) violated("a pod kept past its bound");
          if (name.size() % 2 != 0) violated("a pod taken that was not wanted");
          taken.append(ns).append("/").append(name).append(":").append(std::to_string(pod.containers.size()));
          taken.append(pod.unreadable).append(";");
        });
    return taken + "|" + error;
  };
  if (pods_of(read_size) != pods_of(bytes.empty() ? 1 : bytes.size())) {
    violated("the pods read depend on the chunks the answer came in");
  }
  // The bytes themselves as a Container, without the framing.
  if (auto view = gpuguard::nri::container_view(bytes, node, gpuguard::nri::as_written)) {
    check_view(*view);
    check_decision(*view, node);
  }
  check_mask_hook(bytes);
  return 0;
}

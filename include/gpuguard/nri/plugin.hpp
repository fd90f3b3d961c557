#pragma once
// An NRI plugin's side of the runtime's socket (containerd >= 2.0, CRI-O >= 1.30), written from NRI's
// protocol rather than its Go stub: connect to the socket, register (the plugin calls Runtime.RegisterPlugin
// on connection 2), then serve the runtime's calls on connection 1 (Configure, Synchronize, the events
// subscribed to) until the runtime goes away, and connect again with backoff. One thread; the runtime
// calls one event at a time and holds a lock meanwhile, so a handler must answer well inside the
// runtime's request timeout (2 s by default).
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

namespace nri::pkg::api::v1alpha1 {
class CreateContainerResponse;
}  // namespace nri::pkg::api::v1alpha1

namespace gpuguard::nri {

namespace api = ::nri::pkg::api::v1alpha1;

// NRI's event numbers (api.proto's Event) and the subscription bit of each: 1 << (event - 1). A
// Configure answer of 0 would subscribe to every event, validation included, which makes the plugin a
// validator that every create waits on: the plugin always names its events.
inline constexpr std::int32_t kRunPodSandboxEvent = 1;
inline constexpr std::int32_t kRemovePodSandboxEvent = 3;
inline constexpr std::int32_t kCreateContainerEvent = 4;
inline constexpr std::int32_t kStartContainerEvent = 6;
inline constexpr std::int32_t kRemoveContainerEvent = 11;
// NRI v0.10.0 and later (containerd 2.2, CRI-O 1.34): every plugin's adjustment of a container, merged,
// shown to the validators before the container is made. A validator that fails to answer fails the create.
inline constexpr std::int32_t kValidateContainerAdjustmentEvent = 14;
constexpr std::int32_t event_bit(std::int32_t event) { return 1 << (event - 1); }

// A refusal's gRPC code, which the runtime keeps and the kubelet shows: rpc error: code = PermissionDenied
// desc = <message>.
inline constexpr std::int32_t kPermissionDenied = 7;

struct CreateResult {
  std::unique_ptr<api::CreateContainerResponse> response;  // null: nothing to change
  std::optional<std::string> refusal;                      // set: the create fails with this message
};

// The runtime's requests reach the handler as their bytes (NRI's messages, read in place with
// messages.hpp): a request can be 4 MiB, and is held once.
class Handler {
 public:
  virtual ~Handler() = default;
  // Connected and configured (registered), or disconnected, and why; `validating` says whether the
  // runtime shows this plugin every container's final adjustment (validate below); `runtime` is the name
  // the runtime's Configure gave ("containerd", "cri-o"; empty when disconnected).
  virtual void connection(bool registered, bool validating, const std::string& runtime, const std::string& detail) = 0;
  // Each chunk of the runtime's state (a SynchronizeRequest); `last` on the final one.
  virtual void synchronize(std::string_view request, bool last) = 0;
  // A CreateContainerRequest: what to change, or a refusal.
  virtual CreateResult create_container(std::string_view request) = 0;
  // A ValidateContainerAdjustmentRequest: nullopt accepts the container as every plugin left it; a
  // reason rejects it, and the create fails with it.
  virtual std::optional<std::string> validate(std::string_view request) = 0;
  // A StartContainerRequest, the container made (runc's mounts done) and not yet started: nullopt lets it
  // start; a reason fails the start with it.
  virtual std::optional<std::string> start_container(std::string_view /*request*/) { return std::nullopt; }
  // A container removed: its PodSandbox and Container.
  virtual void remove_container(std::string_view pod, std::string_view container) = 0;
  // A sandbox made or removed (its PodSandbox); answered at once, whatever the handler does.
  virtual void run_pod_sandbox(std::string_view /*pod*/) {}
  virtual void remove_pod_sandbox(std::string_view /*pod*/) {}
};

struct PluginOptions {
  std::filesystem::path socket = "/var/run/nri/nri.sock";
  std::string name = "gpuguard";
  std::string index = "50";  // plugins run in ascending index: after those that add devices
  // Events subscribed to (event_bit of each).
  std::int32_t events = event_bit(kRunPodSandboxEvent) | event_bit(kRemovePodSandboxEvent) |
                        event_bit(kCreateContainerEvent) | event_bit(kStartContainerEvent) |
                        event_bit(kRemoveContainerEvent);
  // Also validate every container's merged adjustment where the runtime can (NRI v0.10.0 and later: the
  // runtime's NRI version, or containerd 2.2 and CRI-O 1.34 by name, where an NRI before v0.11 does not say
  // its version). A runtime that refuses the subscription all the same is asked again without it.
  bool validate = true;
  std::chrono::milliseconds backoff_first{250};
  std::chrono::milliseconds backoff_max{10'000};
  // A runtime that neither configures the plugin nor closes the connection within this is given up on.
  std::chrono::milliseconds configure_timeout{10'000};
  // Writing one answer; a runtime that does not read it is given up on.
  std::chrono::milliseconds write_timeout{2'000};
  // No NRI socket to connect to (none there, or nothing listening on it) for this long: the runtime does
  // not serve NRI (off in its config, or containerd 1.7's default), rather than restarting.
  std::chrono::milliseconds unserved_after{30'000};
};

// What the connection counts, for the program's /metrics.
struct PluginStats {
  std::uint64_t connections = 0;     // registered and configured
  std::uint64_t disconnections = 0;  // of those, ended
  std::uint64_t protocol_errors = 0;
  std::uint64_t oversized_answers = 0;  // answers over ttrpc's limit, sent as an error instead
  bool registered = false;              // configured and synchronized: the runtime sends this plugin containers' events
  bool validating = false;              // the runtime shows this plugin each container's final adjustment
  // False once connecting has found no NRI socket, or nothing listening on it, for unserved_after: the
  // node's containers are created without this plugin, which its readiness and metrics say.
  bool nri_served = true;
};

class Plugin {
 public:
  Plugin(PluginOptions options, Handler& handler);
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  // Connects, serves and reconnects until `stop` is requested (it wakes a wait at once).
  void run(const std::stop_token& stop);
  PluginStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::nri

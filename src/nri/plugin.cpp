// The NRI plugin's connection (include/gpuguard/nri/plugin.hpp): a unix socket, NRI's multiplexer and
// ttrpc over it (wire.hpp), NRI's messages (proto/nri for what it writes, messages.hpp for what it reads),
// on one thread.
#include "gpuguard/nri/plugin.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>

#include "gpuguard/log/log.hpp"
#include "gpuguard/nri/messages.hpp"
#include "gpuguard/nri/wire.hpp"
#include "nri/v1alpha1/api.pb.h"
#include "ttrpc/ttrpc.pb.h"

namespace gpuguard::nri {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kRuntimeService = "nri.pkg.api.v1alpha1.Runtime";
constexpr const char* kPluginService = "nri.pkg.api.v1alpha1.Plugin";
constexpr std::uint32_t kRegisterStream = 1;  // the plugin's one call: the first odd stream id
constexpr std::int32_t kInvalidArgument = 3;
constexpr std::int32_t kUnimplemented = 12;
constexpr std::int32_t kInternal = 13;
constexpr std::size_t kReadChunk = std::size_t{64} * 1024;

// A file descriptor closed when it goes out of scope.
class Descriptor {
 public:
  explicit Descriptor(int fd = -1) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

std::string response_with_status(std::int32_t code, const std::string& message) {
  ttrpc::Response response;
  response.mutable_status()->set_code(code);
  response.mutable_status()->set_message(message);
  return response.SerializeAsString();
}

std::string response_with_payload(const google::protobuf::MessageLite& payload) {
  ttrpc::Response response;
  response.set_payload(payload.SerializeAsString());
  return response.SerializeAsString();
}

// "v2.4.2", "1.34.0" or "v0.12.3": its major and minor numbers, or nullopt.
std::optional<std::pair<int, int>> major_minor(std::string_view version) {
  if (version.starts_with('v')) version.remove_prefix(1);
  int major = 0, minor = 0;
  const auto dot = version.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const auto [end_major, error_major] = std::from_chars(version.data(), version.data() + dot, major);
  const auto [end_minor, error_minor] =
      std::from_chars(version.data() + dot + 1, version.data() + version.size(), minor);
  if (error_major != std::errc() || error_minor != std::errc() || end_major != version.data() + dot) {
    return std::nullopt;
  }
  return std::pair{major, minor};
}

// Whether the runtime's NRI has the validation phase (v0.10.0 and later). NRI says its version from
// v0.11.0 on; before that, containerd 2.2 and CRI-O 1.34 are the releases that ship v0.10.0.
bool runtime_validates(const ::nri::pkg::api::v1alpha1::ConfigureRequest& configure) {
  if (const auto nri = major_minor(configure.nri_version())) return *nri >= std::pair{0, 10};
  const auto runtime = major_minor(configure.runtime_version());
  if (!runtime) return false;
  if (configure.runtime_name() == "containerd") return *runtime >= std::pair{2, 2};
  if (configure.runtime_name() == "cri-o") return *runtime >= std::pair{1, 34};
  return false;
}

}  // namespace

struct Plugin::Impl {
  Impl(PluginOptions o, Handler& h)
      : options(std::move(o)), handler(h), wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

  PluginOptions options;
  Handler& handler;
  Descriptor wake;  // written when a stop is requested, so that a poll returns at once
  mutable std::mutex mutex;
  PluginStats counts;
  // A runtime that did not say its NRI version and closed the connection after being asked for validation,
  // before any Synchronize message, is not asked on the next connection (an NRI that does not know the event
  // refuses the whole subscription, at the Configure); asked again once a connection without it ends before
  // any Synchronize message too, since then the subscription was not what the runtime refused. A runtime
  // that says its NRI version (v0.11.0 and later do) knows the event where the version is v0.10.0 or later:
  // a sync it ends (a running container too large to send, a timeout) never turns validation off.
  bool validation_refused = false;

  // What one connection has come to.
  struct Session {
    bool configured = false;
    bool registered = false;
    bool validating = false;
    bool nri_version_stated = false;  // the runtime's Configure said its NRI version
    bool synchronized = false;
    // A Synchronize message came: the runtime took the subscription (NRI refuses one at the Configure), even
    // where it gave up on the Synchronize after (its request timeout covers every message of it).
    bool sync_seen = false;
    bool no_listener = false;  // connect found no socket file, or nothing listening on it
  };

  // What a connection reads through: frames by connection, then whole messages on each.
  struct Wire {
    Demultiplexer frames;
    MessageDecoder calls;    // connection 1: the runtime calls the plugin
    MessageDecoder answers;  // connection 2: the answer to the plugin's registration
  };

  // One connection, from connect to whatever ended it; returns why it ended.
  std::string session(const std::stop_token& stop, Session& state);
  // Connects `fd` to the runtime's socket (a path that fits sun_path) and asks to register; empty, or why it
  // could not.
  std::string connect_and_register(int fd, Session& state);
  // One read's bytes, demultiplexed, and its whole calls answered; why the connection is to end, if it is.
  std::optional<std::string> take(int fd, std::string_view bytes, Wire& wire, Session& state);
  bool write_message(int fd, std::uint32_t conn, std::uint32_t stream, MessageType type, const std::string& payload,
                     std::string& why);
  // Serves one call of the runtime; false (with `why`) when the connection is to end.
  bool serve(int fd, const Message& message, Session& state, std::string& why);
  // The answer to one call; `keep` false when the connection is to end after it.
  std::string answer(const RequestEnvelope& request, Session& state, bool& keep, std::string& why);
  std::string answer_configure(const RequestEnvelope& request, Session& state);
  // The answer to one of the runtime's lifecycle events; nullopt when `method` is not one.
  std::optional<std::string> answer_event(const std::string& method, std::string_view payload);
  void wait(const std::stop_token& stop, std::chrono::milliseconds pause) const;
  template <typename Change>
  void count(Change change) {
    const std::lock_guard lock(mutex);
    change(counts);
  }
};

Plugin::Plugin(PluginOptions options, Handler& handler) : impl_(std::make_unique<Impl>(std::move(options), handler)) {}
Plugin::~Plugin() = default;

PluginStats Plugin::stats() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->counts;
}

void Plugin::run(const std::stop_token& stop) {
  const std::stop_callback wake_on_stop(stop, [this] {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto written = ::write(impl_->wake.get(), &one, sizeof one);
  });
  auto backoff = impl_->options.backoff_first;
  std::string last;
  std::optional<Clock::time_point> unserved_since;  // the first of the failed connects in a row
  while (!stop.stop_requested()) {
    Impl::Session state;
    const auto began = Clock::now();
    const std::string why = impl_->session(stop, state);
    if (stop.stop_requested()) break;
    if (!state.no_listener) {
      unserved_since.reset();
    } else if (!unserved_since) {
      unserved_since = began;
    }
    const bool served = !unserved_since || Clock::now() - *unserved_since < impl_->options.unserved_after;
    if (served != stats().nri_served) {
      impl_->count([served](PluginStats& s) { s.nri_served = served; });
      if (served) {
        log::info("the runtime serves NRI again", {{"socket", impl_->options.socket.string()}});
      } else {
        log::warn("the runtime does not serve NRI: containers on this node are created without the enforcer",
                  {{"reason", why}, {"socket", impl_->options.socket.string()}});
      }
    }
    if (state.configured && !state.validating && !state.sync_seen && impl_->validation_refused) {
      impl_->validation_refused = false;
      log::info("connecting with validation again: the connection without it ended before synchronizing too");
    } else if (state.validating && !state.nri_version_stated && !state.sync_seen && !impl_->validation_refused) {
      impl_->validation_refused = true;
      log::warn(
          "the runtime ended the connection after being asked to show this plugin each container's final "
          "adjustment; connecting again without",
          {{"reason", why}});
    }
    if (state.registered) {
      impl_->count([](PluginStats& s) {
        ++s.disconnections;
        s.registered = false;
        s.validating = false;
      });
      impl_->handler.connection(false, false, {}, why);
      log::warn("NRI connection ended; connecting again",
                {{"reason", why}, {"synchronized", state.synchronized}, {"socket", impl_->options.socket.string()}});
      backoff = impl_->options.backoff_first;
      last.clear();
      // At once, after a connection that lasted: while the plugin is away, the runtime creates containers
      // as if it had no such plugin. One that ends as soon as it is made waits as any failed attempt does.
      if (Clock::now() - began > impl_->options.backoff_max) continue;
    } else if (why != last) {
      log::warn("cannot register with the runtime over NRI; retrying with backoff",
                {{"reason", why}, {"socket", impl_->options.socket.string()}});
      last = why;
    }
    impl_->wait(stop, backoff);
    backoff = std::min(backoff * 2, impl_->options.backoff_max);
  }
}

void Plugin::Impl::wait(const std::stop_token& stop, std::chrono::milliseconds pause) const {
  if (stop.stop_requested()) return;
  pollfd woken{wake.get(), POLLIN, 0};
  ::poll(&woken, 1, static_cast<int>(pause.count()));
}

std::string Plugin::Impl::connect_and_register(int fd, Session& state) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = options.socket.string();
  path.copy(address.sun_path, sizeof address.sun_path - 1);  // session() has refused a path that does not fit
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    state.no_listener = errno == ENOENT || errno == ECONNREFUSED;
    return errno_text(("connect " + path).c_str());
  }
  std::string why;
  ::nri::pkg::api::v1alpha1::RegisterPluginRequest registration;
  registration.set_plugin_name(options.name);
  registration.set_plugin_idx(options.index);
  ttrpc::Request request;
  request.set_service(kRuntimeService);
  request.set_method("RegisterPlugin");
  request.set_payload(registration.SerializeAsString());
  write_message(fd, kRuntimeServiceConn, kRegisterStream, MessageType::request, request.SerializeAsString(), why);
  return why;
}

std::optional<std::string> Plugin::Impl::take(int fd, std::string_view bytes, Wire& wire, Session& state) {
  wire.frames.feed(bytes, [&wire](std::uint32_t conn, std::string_view frame) {
    if (conn == kPluginServiceConn) wire.calls.feed(frame);
    if (conn == kRuntimeServiceConn) wire.answers.feed(frame);
    // Frames on other connections are dropped, as NRI's own multiplexer drops them.
  });
  while (auto answer = wire.answers.next()) {
    if (answer->type != MessageType::response || answer->stream != kRegisterStream) continue;
    ttrpc::Response response;
    if (!response.ParseFromString(answer->payload)) return "protocol error: a registration answer that does not parse";
    if (response.has_status() && response.status().code() != 0) {
      return "the runtime refused the registration: " + response.status().message();
    }
  }
  std::string why;
  while (auto call = wire.calls.next()) {
    if (call->type != MessageType::request) continue;
    if (!serve(fd, *call, state, why)) return why;
  }
  // Calls that came whole before bytes that are not the protocol are answered; then the connection ends.
  for (const std::string* error : {&wire.frames.error(), &wire.calls.error(), &wire.answers.error()}) {
    if (!error->empty()) {
      count([](PluginStats& s) { ++s.protocol_errors; });
      return "protocol error: " + *error;
    }
  }
  return std::nullopt;
}

std::string Plugin::Impl::session(const std::stop_token& stop, Session& state) {
  if (options.socket.string().size() >= sizeof(sockaddr_un::sun_path)) {
    return "socket path too long: " + options.socket.string();
  }
  const Descriptor socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (socket.get() < 0) return errno_text("socket");
  if (std::string why = connect_and_register(socket.get(), state); !why.empty()) return why;

  Wire wire;
  const auto configure_deadline = Clock::now() + options.configure_timeout;
  // Each read is demultiplexed and its whole calls answered before the next read, so at most one large
  // request is held: the rest waits in the socket.
  std::string chunk(kReadChunk, '\0');
  while (!stop.stop_requested()) {
    int timeout = -1;
    if (!state.configured) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(configure_deadline - Clock::now());
      if (left.count() <= 0)
        return "the runtime did not configure the plugin within " + std::to_string(options.configure_timeout.count()) +
               " ms";
      timeout = static_cast<int>(left.count());
    }
    pollfd fds[2] = {{socket.get(), POLLIN, 0}, {wake.get(), POLLIN, 0}};
    if (::poll(fds, 2, timeout) < 0) {
      if (errno == EINTR) continue;
      return errno_text("poll");
    }
    if (fds[1].revents != 0) break;
    if (fds[0].revents == 0) continue;
    const ssize_t read = ::read(socket.get(), chunk.data(), chunk.size());
    if (read < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return errno_text("read");
    }
    if (read == 0) return "the runtime closed the connection";
    if (auto ended = take(socket.get(), std::string_view(chunk.data(), static_cast<std::size_t>(read)), wire, state)) {
      return *ended;
    }
  }
  return "stopped";
}

bool Plugin::Impl::serve(int fd, const Message& message, Session& state, std::string& why) {
  bool keep = true;
  std::string reply;
  if (const auto request = read_request(message.payload)) {
    reply = answer(*request, state, keep, why);
  } else {
    reply = response_with_status(kInvalidArgument, "gpuguard: a ttrpc request that does not parse");
  }
  if (reply.size() > kTtrpcMessageMax) {
    // Never dropped for its size: the runtime would take a dropped connection for a plugin that is not
    // there, and create the container unchanged. An error fails the create instead.
    count([](PluginStats& s) { ++s.oversized_answers; });
    log::error("an answer over ttrpc's limit; the runtime is sent an error instead", {{"bytes", reply.size()}});
    reply = response_with_status(kInternal, "gpuguard: the answer to this request is over ttrpc's limit");
  }
  if (!write_message(fd, kPluginServiceConn, message.stream, MessageType::response, reply, why)) return false;
  return keep;
}

std::string Plugin::Impl::answer_configure(const RequestEnvelope& request, Session& state) {
  namespace api = ::nri::pkg::api::v1alpha1;
  api::ConfigureRequest configure;
  if (!configure.ParseFromArray(request.payload.data(), static_cast<int>(request.payload.size()))) {
    return response_with_status(kInvalidArgument, "gpuguard: a Configure request that does not parse");
  }
  state.nri_version_stated = !configure.nri_version().empty();
  state.validating =
      options.validate && (!validation_refused || state.nri_version_stated) && runtime_validates(configure);
  api::ConfigureResponse response;
  response.set_events(options.events | (state.validating ? event_bit(kValidateContainerAdjustmentEvent) : 0));
  state.configured = true;
  state.registered = true;
  const bool validating = state.validating;
  bool was_unserved = false;
  // Registered, for the stats, only once synchronized: NRI sends a plugin containers' events from then, and a
  // Synchronize the runtime gives up on (its request timeout covers every message of it) ends the connection.
  count([validating, &was_unserved](PluginStats& s) {
    ++s.connections;
    s.validating = validating;
    was_unserved = !s.nri_served;
    s.nri_served = true;
  });
  if (was_unserved) log::info("the runtime serves NRI again", {{"socket", options.socket.string()}});
  handler.connection(true, validating, configure.runtime_name(),
                     configure.runtime_name() + " " + configure.runtime_version() + ", NRI " +
                         (configure.nri_version().empty() ? "(not said)" : configure.nri_version()) +
                         ", request timeout " + std::to_string(configure.request_timeout()) + " ms");
  return response_with_payload(response);
}

std::optional<std::string> Plugin::Impl::answer_event(const std::string& method, std::string_view payload) {
  if (method == "RemoveContainer") {
    handler.remove_container(string_field(payload, field::kCreatePod), string_field(payload, field::kCreateContainer));
  } else if (method == "RunPodSandbox") {
    handler.run_pod_sandbox(string_field(payload, field::kCreatePod));
  } else if (method == "RemovePodSandbox") {
    handler.remove_pod_sandbox(string_field(payload, field::kCreatePod));
  } else if (method == "StateChange") {
    // How older NRI versions relay the events that have no method of their own.
    const auto event = static_cast<std::int32_t>(varint_field(payload, field::kStateEvent).value_or(0));
    const std::string_view pod = string_field(payload, field::kStatePod);
    if (event == kRunPodSandboxEvent) handler.run_pod_sandbox(pod);
    if (event == kRemovePodSandboxEvent) handler.remove_pod_sandbox(pod);
    if (event == kRemoveContainerEvent) handler.remove_container(pod, string_field(payload, field::kStateContainer));
  } else {
    return std::nullopt;
  }
  return response_with_payload(::nri::pkg::api::v1alpha1::Empty());
}

std::string Plugin::Impl::answer(const RequestEnvelope& request, Session& state, bool& keep, std::string& why) {
  namespace api = ::nri::pkg::api::v1alpha1;
  const std::string method(request.method);
  if (request.service != kPluginService) {
    return response_with_status(kUnimplemented, "service " + std::string(request.service));
  }
  if (method == "Configure") return answer_configure(request, state);
  if (!well_formed(request.payload)) {
    return response_with_status(kInvalidArgument, "gpuguard: a " + method + " request that does not parse");
  }
  if (method == "Synchronize") {
    const bool more = varint_field(request.payload, field::kSyncMore).value_or(0) != 0;
    handler.synchronize(request.payload, !more);
    if (!more && state.configured && !state.synchronized) count([](PluginStats& s) { s.registered = true; });
    state.synchronized = state.synchronized || !more;
    state.sync_seen = true;
    // A chunk with more = true is answered with more = true and nothing else.
    api::SynchronizeResponse response;
    response.set_more(more);
    return response_with_payload(response);
  }
  if (method == "CreateContainer") {
    CreateResult result = handler.create_container(request.payload);
    if (result.refusal) return response_with_status(kPermissionDenied, *result.refusal);
    if (result.response) return response_with_payload(*result.response);
    return response_with_payload(api::CreateContainerResponse());
  }
  if (method == "StartContainer") {
    // StartContainerResponse has no fields: an empty message, as Empty's.
    if (const auto refusal = handler.start_container(request.payload)) {
      return response_with_status(kPermissionDenied, *refusal);
    }
    return response_with_payload(api::Empty());
  }
  if (method == "ValidateContainerAdjustment") {
    api::ValidateContainerAdjustmentResponse response;
    if (const auto reason = handler.validate(request.payload)) {
      response.set_reject(true);
      response.set_reason(*reason);
    }
    return response_with_payload(response);
  }
  if (auto event = answer_event(method, request.payload)) return *event;
  if (method == "Shutdown") {
    keep = false;
    why = "the runtime shut the plugin down";
    return response_with_payload(api::Empty());
  }
  return response_with_status(kUnimplemented, "method " + method);
}

bool Plugin::Impl::write_message(int fd, std::uint32_t conn, std::uint32_t stream, MessageType type,
                                 const std::string& payload, std::string& why) {
  const std::string bytes = encode_frames(conn, encode_message(stream, type, 0, payload));
  const auto deadline = Clock::now() + options.write_timeout;
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + written, bytes.size() - written, MSG_NOSIGNAL);
    if (n > 0) {
      written += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      why = errno_text("write");
      return false;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      why = "the runtime did not read an answer within " + std::to_string(options.write_timeout.count()) + " ms";
      return false;
    }
    pollfd writable{fd, POLLOUT, 0};
    ::poll(&writable, 1, static_cast<int>(left.count()));
  }
  return true;
}

}  // namespace gpuguard::nri

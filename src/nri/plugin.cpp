// The NRI plugin's connection (include/gpuguard/nri/plugin.hpp): a unix socket, NRI's multiplexer and
// ttrpc over it (wire.hpp), NRI's messages (proto/nri), on one thread.
#include "gpuguard/nri/plugin.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "gpuguard/log/log.hpp"
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

}  // namespace

struct Plugin::Impl {
  Impl(PluginOptions o, Handler& h)
      : options(std::move(o)), handler(h), wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

  PluginOptions options;
  Handler& handler;
  Descriptor wake;  // written when a stop is requested, so that a poll returns at once
  mutable std::mutex mutex;
  PluginStats counts;

  // One connection, from connect to whatever ended it; returns why it ended, and whether it had registered.
  std::string session(const std::stop_token& stop, bool& registered);
  bool write_message(int fd, std::uint32_t conn, std::uint32_t stream, MessageType type, const std::string& payload,
                     std::string& why);
  // Serves one call of the runtime; false (with `why`) when the connection is to end.
  bool serve(int fd, const Message& message, bool& configured, bool& registered, std::string& why);
  void wait(const std::stop_token& stop, std::chrono::milliseconds pause) const;
  void count(void (*change)(PluginStats&)) {
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
  while (!stop.stop_requested()) {
    bool registered = false;
    const std::string why = impl_->session(stop, registered);
    if (stop.stop_requested()) break;
    if (registered) {
      impl_->count([](PluginStats& s) {
        ++s.disconnections;
        s.registered = false;
      });
      impl_->handler.connection(false, why);
      log::warn("NRI connection ended; connecting again",
                {{"reason", why}, {"socket", impl_->options.socket.string()}});
      backoff = impl_->options.backoff_first;
      last.clear();
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

std::string Plugin::Impl::session(const std::stop_token& stop, bool& registered) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = options.socket.string();
  if (path.size() >= sizeof address.sun_path) return "socket path too long: " + path;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const Descriptor socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (socket.get() < 0) return errno_text("socket");
  if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
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
  if (!write_message(socket.get(), kRuntimeServiceConn, kRegisterStream, MessageType::request,
                     request.SerializeAsString(), why)) {
    return why;
  }

  FrameDecoder frames;
  MessageDecoder calls;    // connection 1: the runtime calls the plugin
  MessageDecoder answers;  // connection 2: the answer to the plugin's registration
  bool configured = false;
  const auto configure_deadline = Clock::now() + options.configure_timeout;
  std::string chunk(kReadChunk, '\0');
  while (!stop.stop_requested()) {
    int timeout = -1;
    if (!configured) {
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
    frames.feed(std::string_view(chunk.data(), static_cast<std::size_t>(read)));
    while (auto frame = frames.next()) {
      if (frame->conn == kPluginServiceConn) calls.feed(frame->payload);
      if (frame->conn == kRuntimeServiceConn) answers.feed(frame->payload);
      // Frames on other connections are dropped, as NRI's own multiplexer drops them.
    }
    for (const std::string* error : {&frames.error(), &calls.error(), &answers.error()}) {
      if (!error->empty()) {
        count([](PluginStats& s) { ++s.protocol_errors; });
        return "protocol error: " + *error;
      }
    }
    while (auto answer = answers.next()) {
      if (answer->type != MessageType::response || answer->stream != kRegisterStream) continue;
      ttrpc::Response response;
      if (!response.ParseFromString(answer->payload))
        return "protocol error: a registration answer that does not parse";
      if (response.has_status() && response.status().code() != 0) {
        return "the runtime refused the registration: " + response.status().message();
      }
    }
    while (auto call = calls.next()) {
      if (call->type != MessageType::request) continue;
      if (!serve(socket.get(), *call, configured, registered, why)) return why;
    }
  }
  return "stopped";
}

bool Plugin::Impl::serve(int fd, const Message& message, bool& configured, bool& registered, std::string& why) {
  ttrpc::Request request;
  std::string answer;
  bool keep = true;
  if (!request.ParseFromString(message.payload)) {
    answer = response_with_status(kInvalidArgument, "gpuguard: a ttrpc request that does not parse");
  } else if (request.service() != kPluginService) {
    answer = response_with_status(kUnimplemented, "service " + request.service());
  } else if (request.method() == "Configure") {
    ::nri::pkg::api::v1alpha1::ConfigureRequest configure;
    if (!configure.ParseFromString(request.payload())) {
      answer = response_with_status(kInvalidArgument, "gpuguard: a Configure request that does not parse");
    } else {
      ::nri::pkg::api::v1alpha1::ConfigureResponse response;
      response.set_events(options.events);
      answer = response_with_payload(response);
      configured = true;
      registered = true;
      count([](PluginStats& s) {
        ++s.connections;
        s.registered = true;
      });
      handler.connection(true, configure.runtime_name() + " " + configure.runtime_version() + ", request timeout " +
                                   std::to_string(configure.request_timeout()) + " ms");
    }
  } else if (request.method() == "Synchronize") {
    ::nri::pkg::api::v1alpha1::SynchronizeRequest synchronize;
    if (!synchronize.ParseFromString(request.payload())) {
      answer = response_with_status(kInvalidArgument, "gpuguard: a Synchronize request that does not parse");
    } else {
      handler.synchronize(synchronize, !synchronize.more());
      // A chunk with more = true is answered with more = true and nothing else.
      ::nri::pkg::api::v1alpha1::SynchronizeResponse response;
      response.set_more(synchronize.more());
      answer = response_with_payload(response);
    }
  } else if (request.method() == "CreateContainer" || request.method() == "RemoveContainer" ||
             request.method() == "RunPodSandbox" || request.method() == "RemovePodSandbox") {
    // RemoveContainerRequest has CreateContainerRequest's fields (pod = 1, container = 2), and the pod
    // sandbox requests its pod = 1.
    ::nri::pkg::api::v1alpha1::CreateContainerRequest event;
    if (!event.ParseFromString(request.payload())) {
      answer =
          response_with_status(kInvalidArgument, "gpuguard: a " + request.method() + " request that does not parse");
    } else if (request.method() == "RemoveContainer") {
      handler.remove_container(event.pod(), event.container());
      answer = response_with_payload(::nri::pkg::api::v1alpha1::Empty());
    } else if (request.method() == "RunPodSandbox") {
      handler.run_pod_sandbox(event.pod());
      answer = response_with_payload(::nri::pkg::api::v1alpha1::Empty());
    } else if (request.method() == "RemovePodSandbox") {
      handler.remove_pod_sandbox(event.pod());
      answer = response_with_payload(::nri::pkg::api::v1alpha1::Empty());
    } else {
      CreateResult result = handler.create_container(event.pod(), event.container());
      if (result.refusal) {
        answer = response_with_status(kPermissionDenied, *result.refusal);
      } else if (result.response) {
        answer = response_with_payload(*result.response);
      } else {
        answer = response_with_payload(::nri::pkg::api::v1alpha1::CreateContainerResponse());
      }
    }
  } else if (request.method() == "StateChange") {
    // How older NRI versions relay the events that have no method of their own.
    ::nri::pkg::api::v1alpha1::StateChangeEvent event;
    if (!event.ParseFromString(request.payload())) {
      answer = response_with_status(kInvalidArgument, "gpuguard: a StateChange request that does not parse");
    } else {
      if (event.event() == kRunPodSandboxEvent) handler.run_pod_sandbox(event.pod());
      if (event.event() == kRemovePodSandboxEvent) handler.remove_pod_sandbox(event.pod());
      if (event.event() == kRemoveContainerEvent) handler.remove_container(event.pod(), event.container());
      answer = response_with_payload(::nri::pkg::api::v1alpha1::Empty());
    }
  } else if (request.method() == "Shutdown") {
    answer = response_with_payload(::nri::pkg::api::v1alpha1::Empty());
    keep = false;
    why = "the runtime shut the plugin down";
  } else {
    answer = response_with_status(kUnimplemented, "method " + request.method());
  }
  if (!write_message(fd, kPluginServiceConn, message.stream, MessageType::response, answer, why)) return false;
  return keep;
}

bool Plugin::Impl::write_message(int fd, std::uint32_t conn, std::uint32_t stream, MessageType type,
                                 const std::string& payload, std::string& why) {
  if (payload.size() > kTtrpcMessageMax) {
    why = "an answer of " + std::to_string(payload.size()) + " bytes, over ttrpc's limit";
    return false;
  }
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

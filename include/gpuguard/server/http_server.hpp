#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "gpuguard/server/http.hpp"

namespace boost::asio::ssl {
class context;
}

namespace gpuguard::server {

struct ServerOptions {
  std::string listen_address = "0.0.0.0:8443";  // host:port, [v6]:port; port 0 picks a free one
  unsigned threads = 2;
  std::size_t body_limit = std::size_t{7} * 1024 * 1024;  // what controller-runtime allows; above it: 413
  std::size_t header_limit = std::size_t{16} * 1024;
  // Connections open at once; one more is closed as soon as it is accepted.
  std::size_t max_connections = 256;
  // Bytes of request bodies and of answers over 16 KiB that all connections may hold at once. A request
  // whose body does not fit is answered 503 with Retry-After before any of it is read.
  std::size_t inflight_bytes = std::size_t{16} * 1024 * 1024;
  std::chrono::milliseconds handshake_timeout{10'000};
  // From the handshake to the end of the first request's headers.
  std::chrono::milliseconds first_request_timeout{10'000};
  // Waiting for the next request on a kept-alive connection, and reading its headers. Above the
  // apiserver's 90 s idle-connection timeout, so the client side closes first.
  std::chrono::milliseconds idle_timeout{120'000};
  // Reading the body, handling and writing, unless the caller asks for less with ?timeout=.
  std::chrono::milliseconds request_timeout{30'000};
  // On SIGTERM/SIGINT: keep serving this long, answering with `Connection: close`, so that endpoints
  // drop the pod before it stops accepting...
  std::chrono::milliseconds shutdown_delay{5'000};
  // ...and exit at the latest this long after the signal.
  std::chrono::milliseconds shutdown_timeout{25'000};
  // Called once when the signal arrives, before the delay (the webhook fails /readyz from then on).
  std::function<void()> on_shutdown;
  // Where the server counts its answers and shed connections; none when null. Outlives the server.
  ServerCounters* counters = nullptr;
};

// The TLS context for the next handshake; called once per accepted connection.
using TlsProvider = std::function<std::shared_ptr<boost::asio::ssl::context>()>;

// Serves a Handler over HTTPS/1.1 with keep-alive, or over plain HTTP/1.1 when the TlsProvider is empty
// (only for a client on the same host, such as a kube-scheduler talking to its extender on localhost).
// `threads` event loops, one thread each, and one more for accepting; a connection is a coroutine on the
// loop it was given (they take turns, each step a bounded amount of work), and every handshake, read and
// write has a deadline. What a client can hold is bounded: connections, the bytes buffered per connection,
// and the request bytes in flight over all of them.
class HttpServer {
 public:
  HttpServer(ServerOptions options, TlsProvider tls, const Handler& handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; throws std::runtime_error with the reason when it cannot.
  // Returns the bound address as host:port (the real port when 0 was asked for).
  std::string bind();
  // Serves until SIGINT/SIGTERM or stop(), then drains as ServerOptions says, and returns. Throws
  // std::system_error when a connection loop's thread cannot start, after stopping and joining those that
  // did, with the caller's signal mask as it was. Its connection loops' threads block both signals, so a
  // caller that holds them blocked in its own threads (cli::StopSignalsHeld) must release them in this one
  // before it calls run(), or no stop comes.
  void run();
  // Starts the same drain as a signal does; safe from any thread.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::server

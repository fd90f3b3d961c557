// The one translation unit that instantiates Beast's HTTP and SSL stream templates.
#include "gpuguard/server/http_server.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/basic_signal_set.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <csignal>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gpuguard/log/log.hpp"
#include "request_head.hpp"
#include "tls_stream.hpp"

namespace gpuguard::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

// One event loop per thread, and a connection stays on the loop that accepted it: its coroutine, its
// deadlines and the drain's posts all run on one thread, so nothing on a request's path needs a strand or
// a lock, and every I/O object names its executor's concrete type instead of a type-erased one.
using Executor = asio::io_context::executor_type;
using Socket = asio::basic_stream_socket<tcp, Executor>;
using Timer =
    asio::basic_waitable_timer<std::chrono::steady_clock, asio::wait_traits<std::chrono::steady_clock>, Executor>;
template <class T = void>
using Task = asio::awaitable<T, Executor>;

constexpr auto kNoThrow = asio::as_tuple(asio::use_awaitable_t<Executor>{});

// Spare capacity after the body so that the JSON decoder (simdjson needs 64 bytes) can read it in place.
constexpr std::size_t kBodySlack = 64;

// Beast reads into the free space of its buffer, at least 512 bytes, and the body parser empties the
// buffer as it goes, so a buffer left to itself stays small and a 10 KB body takes twenty reads, each a
// trip through OpenSSL and the scheduler. While a body is read the buffer gets room for one TLS record's
// plaintext (what one SSL_read can return), and it is released once the answer is written, so that idle
// keep-alive connections hold none of it.
constexpr std::size_t kBodyReadRoom = std::size_t{16} * 1024;

void make_room_for_body(beast::flat_buffer& buffer, std::optional<std::uint64_t> content_length) {
  const std::uint64_t unread = content_length.value_or(kBodyReadRoom);
  if (unread > buffer.size()) {
    buffer.reserve(buffer.size() +
                   static_cast<std::size_t>(std::min<std::uint64_t>(unread - buffer.size(), kBodyReadRoom)));
  }
}

tcp::endpoint parse_listen_address(const std::string& address) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw std::runtime_error("listen address '" + address + "' must be IP:port");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned port = 0;
  try {
    std::size_t used = 0;
    port = static_cast<unsigned>(std::stoul(address.substr(colon + 1), &used));
    if (used != address.size() - colon - 1 || port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    throw std::runtime_error("listen address '" + address + "' has an invalid port");
  }
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) throw std::runtime_error("listen address '" + address + "' does not start with an IP address");
  return {ip, static_cast<unsigned short>(port)};
}

std::string to_string(const tcp::endpoint& endpoint) {
  const auto ip = endpoint.address();
  return (ip.is_v6() ? "[" + ip.to_string() + "]" : ip.to_string()) + ":" + std::to_string(endpoint.port());
}

// A request that arrived but does not parse deserves a 400; any other error means the peer went away or
// a deadline passed, and there is nobody left to answer.
bool is_malformed_request(const boost::system::error_code& ec) {
  static const auto& http_errors = make_error_code(http::error::bad_method).category();
  return ec.category() == http_errors && ec != http::error::end_of_stream && ec != http::error::partial_message;
}

}  // namespace

using Expiry = Deadline<Executor>;

// What the drain needs to reach into a session. Touched only on the session's loop.
struct SessionControl {
  Executor executor;
  Expiry* expiry = nullptr;  // null once the session has ended
  bool waiting_for_request = false;
  std::chrono::steady_clock::time_point idle_since;
};

std::vector<std::unique_ptr<asio::io_context>> make_loops(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::unique_ptr<asio::io_context>> loops;
  for (unsigned i = 0; i < threads; ++i) loops.push_back(std::make_unique<asio::io_context>(1));  // one thread each
  return loops;
}

struct HttpServer::Impl {
  Impl(ServerOptions o, TlsProvider t, const Handler& h)
      : options(std::move(o)), tls(std::move(t)), handler(h), loops(make_loops(options.threads)) {}

  ServerOptions options;
  TlsProvider tls;
  const Handler& handler;
  // Declared before the loops: a loop that is destroyed with coroutines still on it ends their sessions.
  std::atomic<bool> draining{false};  // signal received: answer with Connection: close
  std::atomic<bool> stopping{false};  // delay over: no new connections, idle ones are closed
  std::atomic<std::size_t> sessions{0};
  std::mutex controls_mutex;
  std::vector<std::weak_ptr<SessionControl>> controls;
  // loops[0] also runs the acceptor, the signals and the drain.
  std::vector<std::unique_ptr<asio::io_context>> loops;
  std::size_t next_loop = 0;  // round robin; touched only by the accept loop
  asio::basic_socket_acceptor<tcp, Executor> acceptor{*loops.front()};
  asio::basic_signal_set<Executor> signals{*loops.front(), SIGINT, SIGTERM};
  Timer drain_timer{*loops.front()};

  Task<> accept_loop();
  Task<> session(Socket socket);
  template <class Stream>
  Task<> serve_requests(Stream& stream, Expiry& expiry, SessionControl& control);
  template <class Stream>
  Task<bool> respond(Stream& stream, Expiry& expiry, Response response, unsigned version, bool keep_alive,
                     std::chrono::milliseconds deadline);
  template <class Stream>
  Task<> answer_read_error(Stream& stream, Expiry& expiry, const boost::system::error_code& ec,
                           std::chrono::milliseconds deadline);
  Response call_handler(const RequestHead& head, std::string body);
  std::shared_ptr<SessionControl> register_session(Executor executor, Expiry& expiry);
  void begin_shutdown();
  void stop_accepting(std::chrono::steady_clock::time_point deadline);
  void wait_for_sessions(std::chrono::steady_clock::time_point deadline);
};

Task<> HttpServer::Impl::accept_loop() {
  while (!stopping) {
    asio::io_context& loop = *loops[next_loop++ % loops.size()];
    auto [ec, socket] = co_await acceptor.async_accept(loop.get_executor(), kNoThrow);
    if (ec) {
      if (stopping || ec == asio::error::operation_aborted) co_return;
      // Typically EMFILE: back off instead of spinning, existing connections keep being served.
      log::warn("accept failed", {{"reason", ec.message()}});
      Timer pause(*loops.front(), 50ms);
      co_await pause.async_wait(kNoThrow);
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    auto executor = socket.get_executor();
    asio::co_spawn(executor, session(std::move(socket)), [](const std::exception_ptr& failure) {
      if (!failure) return;
      try {
        std::rethrow_exception(failure);
      } catch (const std::exception& e) {
        log::error("connection failed", {{"reason", e.what()}});
      }
    });
  }
}

Response HttpServer::Impl::call_handler(const RequestHead& head, std::string body) {
  try {
    return handler.handle(head, std::move(body));
  } catch (const std::exception& e) {
    log::error("request handler failed", {{"path", head.path}, {"reason", e.what()}});
    return text_response(500, "internal error");
  }
}

template <class Stream>
Task<bool> HttpServer::Impl::respond(Stream& stream, Expiry& expiry, Response response, unsigned version,
                                     bool keep_alive, std::chrono::milliseconds deadline) {
  http::response<http::string_body> message{static_cast<http::status>(response.status), version};
  message.set(http::field::content_type, response.content_type);
  for (auto& [name, value] : response.headers) message.set(name, value);
  message.body() = std::move(response.body);
  message.keep_alive(keep_alive && !draining);
  message.prepare_payload();
  expiry.expires_after(deadline);
  auto [ec, written] = co_await http::async_write(stream, message, kNoThrow);
  co_return !ec && message.keep_alive();
}

// Tells the client why its request could not be read, when there is still a client to tell.
template <class Stream>
Task<> HttpServer::Impl::answer_read_error(Stream& stream, Expiry& expiry, const boost::system::error_code& ec,
                                           std::chrono::milliseconds deadline) {
  if (ec == http::error::body_limit) {
    co_await respond(stream, expiry,
                     text_response(413, "request body over " + std::to_string(options.body_limit) + " bytes"), 11,
                     false, deadline);
  } else if (ec == http::error::header_limit) {
    co_await respond(stream, expiry, text_response(431, "request headers too large"), 11, false, deadline);
  } else if (is_malformed_request(ec)) {
    co_await respond(stream, expiry, text_response(400, "malformed HTTP request: " + ec.message()), 11, false,
                     deadline);
  }
}

Task<> HttpServer::Impl::session(Socket socket) {
  struct SessionEnd {
    Impl& impl;
    std::shared_ptr<SessionControl> control;
    ~SessionEnd() {
      control->expiry = nullptr;
      --impl.sessions;
    }
  };
  Expiry expiry(socket);
  const SessionEnd session_end{*this, register_session(socket.get_executor(), expiry)};
  if (!tls) {
    co_await serve_requests(socket, expiry, *session_end.control);
    boost::system::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_send, ignored);
    co_return;
  }
  const std::shared_ptr<ssl::context> context = tls();  // this pair for the whole connection
  TlsStream<Executor> stream(socket, context->native_handle());
  expiry.expires_after(options.handshake_timeout);
  if (auto [ec, n] = co_await stream.async_handshake(kNoThrow); ec) {
    log::debug("TLS handshake failed", {{"reason", ec.message()}});
    co_return;
  }
  co_await serve_requests(stream, expiry, *session_end.control);
  expiry.expires_after(2s);
  co_await stream.async_shutdown(kNoThrow);
}

template <class Stream>
Task<> HttpServer::Impl::serve_requests(Stream& stream, Expiry& expiry, SessionControl& control) {
  beast::flat_buffer buffer;
  bool keep_alive = true;
  while (keep_alive) {
    RequestParser parser;
    apply_limits(parser, options);
    control.waiting_for_request = true;
    control.idle_since = std::chrono::steady_clock::now();
    expiry.expires_after(stopping ? 1s : options.idle_timeout);
    // A declared Content-Length over the body limit already fails here, before any of the body is read.
    auto [read_error, header_bytes] = co_await http::async_read_header(stream, buffer, parser, kNoThrow);
    control.waiting_for_request = false;
    if (read_error) {
      co_await answer_read_error(stream, expiry, read_error, options.request_timeout);
      break;
    }

    auto& request = parser.get();
    const RequestHead head = request_head(parser);
    const auto deadline =
        std::min(timeout_parameter(head.query).value_or(options.request_timeout), options.request_timeout);
    keep_alive = request.keep_alive();

    if (auto early = handler.reject_early(head)) {
      keep_alive = co_await respond(stream, expiry, std::move(*early), request.version(),
                                    keep_alive && parser.is_done(), deadline);
      continue;
    }
    if (head.content_length) request.body().reserve(*head.content_length + kBodySlack);
    expiry.expires_after(deadline);
    if (request[http::field::expect] == "100-continue") {
      // curl waits a second for this before sending a large body; the apiserver never asks.
      http::response<http::empty_body> go_on{http::status::continue_, request.version()};
      if (auto [ec, n] = co_await http::async_write(stream, go_on, kNoThrow); ec) break;
    }
    if (!parser.is_done()) make_room_for_body(buffer, head.content_length);  // done: the request has no body
    if (auto [ec, n] = co_await http::async_read(stream, buffer, parser, kNoThrow); ec) {
      co_await answer_read_error(stream, expiry, ec, deadline);  // a chunked body can pass the limit only here
      break;
    }
    keep_alive = co_await respond(stream, expiry, call_handler(head, std::move(request.body())), request.version(),
                                  keep_alive, deadline);
    if (buffer.size() == 0) buffer.shrink_to_fit();  // nothing of a next request read yet: free it all
  }
}

std::shared_ptr<SessionControl> HttpServer::Impl::register_session(Executor executor, Expiry& expiry) {
  auto control = std::make_shared<SessionControl>(SessionControl{
      .executor = std::move(executor), .expiry = &expiry, .waiting_for_request = false, .idle_since = {}});
  ++sessions;
  std::lock_guard lock(controls_mutex);
  std::erase_if(controls, [](const auto& weak) { return weak.expired(); });
  controls.push_back(control);
  return control;
}

// SIGTERM: readiness goes at once, serving goes on for the delay (with Connection: close), then new
// connections are refused and the open ones end as soon as they are idle, within the timeout.
void HttpServer::Impl::begin_shutdown() {
  if (draining.exchange(true)) return;
  const auto deadline = std::chrono::steady_clock::now() + options.shutdown_timeout;
  if (options.on_shutdown) options.on_shutdown();
  boost::system::error_code ignored;
  signals.cancel(ignored);
  drain_timer.expires_after(std::min(options.shutdown_delay, options.shutdown_timeout));
  drain_timer.async_wait([this, deadline](boost::system::error_code) { stop_accepting(deadline); });
}

void HttpServer::Impl::stop_accepting(std::chrono::steady_clock::time_point deadline) {
  stopping = true;
  boost::system::error_code ignored;
  acceptor.close(ignored);
  // A connection idle for a second is closed; one that just sent (or is about to send) a request is not,
  // so a request already on its way is still answered.
  std::lock_guard lock(controls_mutex);
  for (const auto& weak : controls) {
    auto control = weak.lock();
    if (!control) continue;
    // A new expiry would only apply to the next read, not the pending one: close the idle stream instead.
    asio::post(control->executor, [control] {
      if (control->expiry == nullptr || !control->waiting_for_request) return;
      auto timer = std::make_shared<Timer>(control->executor, control->idle_since + 1s);
      timer->async_wait([control, timer](boost::system::error_code) {
        if (control->expiry != nullptr && control->waiting_for_request) control->expiry->close();
      });
    });
  }
  wait_for_sessions(deadline);
}

void HttpServer::Impl::wait_for_sessions(std::chrono::steady_clock::time_point deadline) {
  if (sessions == 0 || std::chrono::steady_clock::now() >= deadline) {
    if (sessions != 0) log::warn("shutdown timeout reached with connections open", {{"connections", sessions.load()}});
    for (const auto& loop : loops) loop->stop();
    return;
  }
  drain_timer.expires_after(10ms);
  drain_timer.async_wait([this, deadline](boost::system::error_code) { wait_for_sessions(deadline); });
}

HttpServer::HttpServer(ServerOptions options, TlsProvider tls, const Handler& handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(tls), handler)) {}

HttpServer::~HttpServer() = default;

std::string HttpServer::bind() {
  const tcp::endpoint endpoint = parse_listen_address(impl_->options.listen_address);
  auto& acceptor = impl_->acceptor;
  boost::system::error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("cannot listen on " + impl_->options.listen_address + ": " + ec.message());
  return to_string(acceptor.local_endpoint());
}

void HttpServer::run() {
  // OpenSSL writes to the sockets itself, with write(2): a peer that went away must give EPIPE, not a signal.
  std::signal(SIGPIPE, SIG_IGN);
  impl_->signals.async_wait([this](boost::system::error_code ec, int signal_number) {
    if (ec) return;
    log::info("shutting down", {{"signal", signal_number},
                                {"delay_ms", impl_->options.shutdown_delay.count()},
                                {"timeout_ms", impl_->options.shutdown_timeout.count()}});
    impl_->begin_shutdown();
  });
  auto& loops = impl_->loops;
  asio::co_spawn(*loops.front(), impl_->accept_loop(), [](const std::exception_ptr&) {});
  // The other loops wait for connections until the drain stops every loop.
  std::vector<asio::executor_work_guard<Executor>> waiting;
  std::vector<std::jthread> threads;
  for (auto loop = loops.begin() + 1; loop != loops.end(); ++loop) {
    waiting.push_back(asio::make_work_guard(**loop));
    threads.emplace_back([&context = **loop] { context.run(); });
  }
  loops.front()->run();
}

void HttpServer::stop() {
  asio::post(*impl_->loops.front(), [this] { impl_->begin_shutdown(); });
}

}  // namespace gpuguard::server

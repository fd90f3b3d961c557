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
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <array>
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

// What stops the server: the signal set waits for these, and the connections' loops block them.
constexpr std::array<int, 2> kStopSignals{SIGINT, SIGTERM};

// The stop signals blocked in the calling thread while this lives (the threads it starts meanwhile inherit
// them blocked); the mask it found is put back however the scope ends.
class StopSignalsBlocked {
 public:
  StopSignalsBlocked() {
    sigset_t stop;
    sigemptyset(&stop);
    for (const int signal : kStopSignals) sigaddset(&stop, signal);
    ::pthread_sigmask(SIG_BLOCK, &stop, &before_);
  }
  ~StopSignalsBlocked() { ::pthread_sigmask(SIG_SETMASK, &before_, nullptr); }
  StopSignalsBlocked(const StopSignalsBlocked&) = delete;
  StopSignalsBlocked& operator=(const StopSignalsBlocked&) = delete;

 private:
  sigset_t before_;
};

// A thread per connection loop, each kept waiting for connections until the drain stops its loop. However
// run() leaves, by the drain or by a throw (a thread the system would not start, say under a pids limit,
// or a handler of the control loop), the loops are let go and stopped and every thread started is joined:
// a start that fails is an error the program reports, never a wait for threads that cannot end.
class LoopThreads {
 public:
  explicit LoopThreads(const std::vector<std::unique_ptr<asio::io_context>>& loops) {
    try {
      for (const auto& loop : loops) {
        waiting_.push_back(asio::make_work_guard(*loop));
        threads_.emplace_back([&context = *loop] { context.run(); });
      }
    } catch (...) {
      end();
      throw;
    }
  }
  ~LoopThreads() { end(); }
  LoopThreads(const LoopThreads&) = delete;
  LoopThreads& operator=(const LoopThreads&) = delete;

 private:
  void end() {
    for (auto& guard : waiting_) {
      guard.reset();
      guard.get_executor().context().stop();
    }
    for (auto& thread : threads_) thread.join();
    threads_.clear();
  }

  std::vector<asio::executor_work_guard<Executor>> waiting_;
  std::vector<std::thread> threads_;
};

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
    const std::uint64_t wanted = buffer.size() + std::min<std::uint64_t>(unread - buffer.size(), kBodyReadRoom);
    buffer.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(wanted, buffer.max_size())));
  }
}

// How long a new connection at the connection limit waits for room, before it is refused.
constexpr auto kRoomWait = std::chrono::milliseconds(100);

// A connection that has been served is closed to make room for a new one only after this long idle.
constexpr auto kServedIdleGrace = std::chrono::seconds(10);

// Answers up to this size are part of a connection's own cost (one TLS record); larger ones are counted
// against the server's byte budget while they are written.
constexpr std::size_t kUncountedAnswer = std::size_t{16} * 1024;

// The bytes of request bodies and answers that all connections together may hold at once. A request takes
// its share before any room is made for its body; without it, it is answered 503 and its body never read.
// What is held is shown on /metrics, so that a test sees the budget come back rather than waits for it.
class ByteBudget {
 public:
  ByteBudget(std::size_t total, ServerCounters* counters) : left_(total), counters_(counters) {}
  bool take(std::size_t bytes) {
    std::size_t left = left_.load(std::memory_order_relaxed);
    do {
      if (left < bytes) return false;
    } while (!left_.compare_exchange_weak(left, left - bytes, std::memory_order_relaxed));
    if (counters_ != nullptr) counters_->hold_bytes(static_cast<std::int64_t>(bytes));
    return true;
  }
  void give(std::size_t bytes) {
    if (counters_ != nullptr && bytes != 0) counters_->hold_bytes(-static_cast<std::int64_t>(bytes));
    left_.fetch_add(bytes, std::memory_order_relaxed);
  }

 private:
  std::atomic<std::size_t> left_;
  ServerCounters* counters_;
};

// A request between its head and its answer, counted for as long as this lives.
class RequestInFlight {
 public:
  explicit RequestInFlight(ServerCounters* counters) : counters_(counters) {
    if (counters_ != nullptr) counters_->hold_request(1);
  }
  ~RequestInFlight() {
    if (counters_ != nullptr) counters_->hold_request(-1);
  }
  RequestInFlight(const RequestInFlight&) = delete;
  RequestInFlight& operator=(const RequestInFlight&) = delete;

 private:
  ServerCounters* counters_;
};

// What one request holds of the budget, given back when it goes out of scope.
class BudgetShare {
 public:
  explicit BudgetShare(ByteBudget& budget) : budget_(budget) {}
  ~BudgetShare() { budget_.give(bytes_); }
  BudgetShare(const BudgetShare&) = delete;
  BudgetShare& operator=(const BudgetShare&) = delete;
  bool grow(std::size_t bytes) {
    if (!budget_.take(bytes)) return false;
    bytes_ += bytes;
    return true;
  }

 private:
  ByteBudget& budget_;
  std::size_t bytes_ = 0;
};

Response server_busy() {
  Response response = text_response(503, "server busy: too many request bytes in flight; retry");
  response.headers.emplace_back("Retry-After", "1");
  return response;
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

// Logged at most once a minute, with how many connections were refused since the last line.
class RefusalLog {
 public:
  void count(std::size_t limit) {
    ++refused_;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_) return;
    log::warn("connection limit reached; new connections are closed at once",
              {{"max_connections", limit}, {"refused", refused_}});
    refused_ = 0;
    next_ = now + std::chrono::minutes(1);
  }

 private:
  std::size_t refused_ = 0;
  std::chrono::steady_clock::time_point next_;
};

}  // namespace

using Expiry = Deadline<Executor>;

// What the drain and the connection limit need to reach into a session. `expiry` is touched only on the
// session's loop; the accept loop reads the rest to choose a connection to close.
struct SessionControl {
  using Clock = std::chrono::steady_clock;
  SessionControl(Executor e, Expiry& x)
      : executor(std::move(e)), expiry(&x), idle_since(Clock::now().time_since_epoch().count()) {}
  Clock::time_point idle() const {
    return Clock::time_point(Clock::duration(idle_since.load(std::memory_order_relaxed)));
  }

  Executor executor;
  Expiry* expiry;  // null once the session has ended
  // From the accept to the end of the first request's headers, and again between requests: nothing of a
  // request is held, so closing the connection loses no work.
  std::atomic<bool> waiting_for_request{true};
  std::atomic<bool> served{false};    // has sent a request
  std::atomic<bool> evicting{false};  // chosen to make room
  std::atomic<Clock::rep> idle_since;
};

std::vector<std::unique_ptr<asio::io_context>> make_loops(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::unique_ptr<asio::io_context>> loops;
  for (unsigned i = 0; i < threads; ++i) loops.push_back(std::make_unique<asio::io_context>(1));  // one thread each
  return loops;
}

struct HttpServer::Impl {
  Impl(ServerOptions o, TlsProvider t, const Handler& h)
      : options(std::move(o)),
        tls(std::move(t)),
        handler(h),
        budget(options.inflight_bytes, options.counters),
        loops(make_loops(options.threads)) {}

  ServerOptions options;
  TlsProvider tls;
  const Handler& handler;
  // Declared before the loops: a loop that is destroyed with coroutines still on it ends their sessions.
  std::atomic<bool> draining{false};     // signal received: answer with Connection: close
  std::atomic<bool> stopping{false};     // delay over: no new connections, idle ones are closed
  std::atomic<std::size_t> sessions{0};  // counted when accepted, before the session starts
  ByteBudget budget;
  RefusalLog refusals;  // touched only by the accept loop
  std::mutex controls_mutex;
  std::vector<std::weak_ptr<SessionControl>> controls;
  // The connections' loops. The acceptor, the signals and the drain run on a loop of their own, so that
  // a busy connection never delays accepting the next one.
  std::vector<std::unique_ptr<asio::io_context>> loops;
  asio::io_context control_loop{1};
  std::size_t next_loop = 0;  // round robin; touched only by the accept loop
  asio::basic_socket_acceptor<tcp, Executor> acceptor{control_loop};
  asio::basic_signal_set<Executor> signals{control_loop, kStopSignals[0], kStopSignals[1]};
  Timer drain_timer{control_loop};

  Task<> accept_loop();
  Task<> session(Socket socket);
  template <class Stream>
  Task<> serve_requests(Stream& stream, Expiry& expiry, SessionControl& control);
  std::string wire_answer(const Response& response, unsigned version, bool& keep_alive);
  template <class Stream>
  Task<bool> respond(Stream& stream, Expiry& expiry, Response response, unsigned version, bool keep_alive,
                     std::chrono::milliseconds deadline);
  template <class Stream>
  Task<> answer_read_error(Stream& stream, Expiry& expiry, const boost::system::error_code& ec,
                           std::chrono::milliseconds deadline);
  template <class Stream>
  Task<bool> read_body(Stream& stream, beast::flat_buffer& buffer, std::uint64_t length, std::string& body);
  template <class Stream>
  Task<bool> write_answer(Stream& stream, std::string_view wire);
  Response call_handler(const RequestHead& head, std::string body);
  std::shared_ptr<SessionControl> register_session(Executor executor, Expiry& expiry);
  bool make_room();
  // What the count may reach while connections chosen to make room are still closing.
  std::size_t connection_ceiling() const { return options.max_connections + options.max_connections / 8 + 1; }
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
      Timer pause(control_loop, 50ms);
      co_await pause.async_wait(kNoThrow);
      continue;
    }
    // Connections start, and those closed to make room end, on their own loops, which takes a moment when
    // those are busy: one not yet started cannot be chosen, one closing still counts. So a connection
    // that finds no room waits for it a while (the ones after it wait in the kernel's backlog) before it
    // is refused.
    bool room = sessions < options.max_connections;
    for (auto waited = 0ms; !room && !stopping; waited += 1ms) {
      room = sessions < options.max_connections || make_room();
      if (room || waited >= kRoomWait) break;
      Timer pause(control_loop, 1ms);
      co_await pause.async_wait(kNoThrow);
    }
    if (!room) {
      refusals.count(options.max_connections);
      if (options.counters != nullptr) options.counters->count_shed(ServerCounters::Shed::refused);
      socket.close(ec);
      continue;
    }
    ++sessions;
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

// The answer as it goes on the wire, keep-alive unless the server is draining or the handler asked to close
// (`keep_alive` says which):
// status line, headers, body. Written here, not by Beast's serializer, which builds a list of fields (an
// allocation each) and walks them as a sequence of buffers; the headers are the server's own.
std::string HttpServer::Impl::wire_answer(const Response& response, unsigned version, bool& keep_alive) {
  keep_alive = keep_alive && !draining && !response.close_connection;
  if (options.counters != nullptr) options.counters->count_answer(response.status);
  const std::string_view reason = http::obsolete_reason(http::int_to_status(response.status));
  const std::string length = std::to_string(response.body.size());
  std::size_t size = 96 + reason.size() + response.content_type.size() + length.size() + response.body.size();
  for (const auto& [name, value] : response.headers) size += name.size() + value.size() + 4;
  std::string wire;
  wire.reserve(size);
  wire.append(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ").append(std::to_string(response.status)).append(" ");
  wire.append(reason).append("\r\nContent-Type: ").append(response.content_type).append("\r\n");
  for (const auto& [name, value] : response.headers) wire.append(name).append(": ").append(value).append("\r\n");
  wire.append("Content-Length: ").append(length).append("\r\n");
  // HTTP/1.1 keeps a connection unless told to close; HTTP/1.0 closes it unless told to keep it.
  if (version == 10 && keep_alive) wire.append("Connection: keep-alive\r\n");
  if (version != 10 && !keep_alive) wire.append("Connection: close\r\n");
  wire.append("\r\n").append(response.body);
  return wire;
}

// The answers that end a connection or are sent early. The ordinary answer is written by serve_requests
// itself: a coroutine frame of this size (over 1,020 bytes) is never one that Asio recycles, so calling
// this for every request cost a memalign and a free each.
template <class Stream>
Task<bool> HttpServer::Impl::respond(Stream& stream, Expiry& expiry, Response response, unsigned version,
                                     bool keep_alive, std::chrono::milliseconds deadline) {
  const std::string wire = wire_answer(response, version, keep_alive);
  expiry.expires_after(deadline);
  co_return co_await write_answer(stream, wire) && keep_alive;
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
  } else if (ec == http::error::buffer_overflow) {
    // A chunk size, chunk extension or trailer that does not end within the connection's buffer.
    co_await respond(stream, expiry,
                     text_response(400, "malformed HTTP request: a line longer than " +
                                            std::to_string(options.header_limit + kBodyReadRoom) + " bytes"),
                     11, false, deadline);
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
  // Bounded: what is unparsed of a head, a chunk line or a trailer can take no more than this.
  beast::flat_buffer buffer(options.header_limit + kBodyReadRoom);
  bool keep_alive = true;
  bool first = true;
  while (keep_alive) {
    RequestParser parser;
    apply_limits(parser, options);
    if constexpr (requires { stream.begin_request(); }) stream.begin_request();
    control.idle_since = std::chrono::steady_clock::now().time_since_epoch().count();
    control.waiting_for_request = true;
    // A connection that has not asked for anything yet is worth less patience than a kept-alive one.
    expiry.expires_after(stopping ? 1s : first ? options.first_request_timeout : options.idle_timeout);
    first = false;
    // A declared Content-Length over the body limit already fails here, before any of the body is read.
    auto [read_error, header_bytes] = co_await http::async_read_header(stream, buffer, parser, kNoThrow);
    control.waiting_for_request = false;
    control.served = true;
    if (read_error) {
      co_await answer_read_error(stream, expiry, read_error, options.request_timeout);
      break;
    }
    const RequestInFlight in_flight(options.counters);

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
    BudgetShare share(budget);
    if (!parser.is_done()) {
      // A chunked body may grow to the limit: it takes that much.
      const std::uint64_t room = head.content_length.value_or(options.body_limit) + kBodySlack;
      if (!share.grow(static_cast<std::size_t>(room))) {
        co_await respond(stream, expiry, server_busy(), request.version(), false, deadline);
        break;
      }
      request.body().reserve(static_cast<std::size_t>(room));
    }
    expiry.expires_after(deadline);
    if (request[http::field::expect] == "100-continue") {
      // curl waits a second for this before sending a large body; the apiserver never asks.
      http::response<http::empty_body> go_on{http::status::continue_, request.version()};
      if (auto [ec, n] = co_await http::async_write(stream, go_on, kNoThrow); ec) break;
    }
    if (head.content_length && !parser.is_done()) {
      // A body of known length (the API server's, always) goes straight into its string: what the head's
      // read took of it first, then the stream's reads into the rest. Beast's parser would read it into
      // the connection's buffer, with room for a record, and copy it again.
      if (!co_await read_body(stream, buffer, *head.content_length, request.body())) break;
    } else {
      if (!parser.is_done()) make_room_for_body(buffer, head.content_length);  // done: the request has no body
      if (auto [ec, n] = co_await http::async_read(stream, buffer, parser, kNoThrow); ec) {
        co_await answer_read_error(stream, expiry, ec, deadline);  // a chunked body can pass the limit only here
        break;
      }
    }
    Response response = call_handler(head, std::move(request.body()));
    if (response.body.size() > kUncountedAnswer && !share.grow(response.body.size())) response = server_busy();
    const std::string wire = wire_answer(response, request.version(), keep_alive);
    expiry.expires_after(deadline);
    keep_alive = co_await write_answer(stream, wire) && keep_alive;
    // The client sends its next request only once it has this answer: reading for it at once finds
    // nothing, and a wait on the socket costs Asio an epoll_ctl. After the loop's other connections have
    // had their turns, it is usually there.
    co_await asio::post(stream.get_executor(), asio::use_awaitable_t<Executor>{});
    if (buffer.size() == 0) buffer.shrink_to_fit();  // nothing of a next request read yet: free it all
  }
}

// Writes the answer: what the stream takes at once in this turn, the rest (a socket that is full, an
// answer of more than a record) through the loop. False when the write failed.
template <class Stream>
Task<bool> HttpServer::Impl::write_answer(Stream& stream, std::string_view wire) {
  if constexpr (requires { stream.write_now(asio::const_buffer{}); }) {
    while (!wire.empty()) {
      const std::size_t written = stream.write_now(asio::buffer(wire));
      if (written == 0) break;
      wire.remove_prefix(written);
    }
    if (wire.empty()) co_return true;
  }
  auto [ec, n] = co_await asio::async_write(stream, asio::buffer(wire), kNoThrow);
  co_return !ec;
}

// Reads a body of `length` bytes into `body`: first what `buffer` already holds of it (and no more: what
// follows is the next request's), then from the stream, one read at a time. False when the stream ends or
// fails first (the peer went away, or the deadline closed the socket): there is nobody to answer.
template <class Stream>
Task<bool> HttpServer::Impl::read_body(Stream& stream, beast::flat_buffer& buffer, std::uint64_t length,
                                       std::string& body) {
  const auto size = static_cast<std::size_t>(length);  // the body limit, checked with the head, bounds it
  body.resize(size);
  const std::size_t held = std::min(size, buffer.size());
  asio::buffer_copy(asio::buffer(body.data(), held), buffer.data());
  buffer.consume(held);
  for (std::size_t have = held; have < size;) {
    if constexpr (requires { stream.read_held(body.data(), size); }) {
      if (const std::size_t n = stream.read_held(body.data() + have, size - have); n > 0) {
        have += n;
        continue;
      }
    }
    auto [ec, n] = co_await stream.async_read_some(asio::buffer(body.data() + have, size - have), kNoThrow);
    if (ec) co_return false;
    have += n;
  }
  co_return true;
}

std::shared_ptr<SessionControl> HttpServer::Impl::register_session(Executor executor, Expiry& expiry) {
  auto control = std::make_shared<SessionControl>(std::move(executor), expiry);
  std::lock_guard lock(controls_mutex);
  std::erase_if(controls, [](const auto& weak) { return weak.expired(); });
  controls.push_back(control);
  return control;
}

// At the connection limit, a new connection takes the place of one that holds no request: one that has
// not sent a request yet (the longest waiting first), else one that has been served and then idle for
// kServedIdleGrace. A client's pool of kept-alive connections (the API server's) is thus never broken
// up by connections that only open and wait. The one chosen is closed on its own loop, so the count runs
// over the limit until it has gone; by no more than an eighth (connection_ceiling), past which it makes none.
// False when there is no such connection.
bool HttpServer::Impl::make_room() {
  if (sessions >= connection_ceiling()) return false;
  const auto served_idle_before = std::chrono::steady_clock::now() - kServedIdleGrace;
  std::shared_ptr<SessionControl> chosen;
  std::lock_guard lock(controls_mutex);
  for (const auto& weak : controls) {
    auto control = weak.lock();
    if (!control || !control->waiting_for_request || control->evicting) continue;
    if (control->served && control->idle() > served_idle_before) continue;
    if (!chosen ||
        std::pair(control->served.load(), control->idle()) < std::pair(chosen->served.load(), chosen->idle()))
      chosen = std::move(control);
  }
  if (!chosen) return false;
  chosen->evicting = true;
  // On its loop, where it cannot change state meanwhile: if a request has begun since, it stays.
  asio::post(chosen->executor, [chosen, counters = options.counters] {
    if (chosen->expiry == nullptr || !chosen->waiting_for_request) return;
    chosen->expiry->close();
    if (counters != nullptr) counters->count_shed(ServerCounters::Shed::evicted);
  });
  return true;
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
      auto timer = std::make_shared<Timer>(control->executor, control->idle() + 1s);
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
    control_loop.stop();
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
  asio::co_spawn(impl_->control_loop, impl_->accept_loop(), [](const std::exception_ptr&) {});
  // The connections' loops start with SIGINT and SIGTERM blocked, so that the kernel never gives those to a
  // loop: where the program holds them blocked in its other threads too (cli::StopSignalsHeld), only the
  // thread that runs the signals' loop below takes them.
  std::optional<LoopThreads> threads;
  {
    const StopSignalsBlocked blocked;
    threads.emplace(impl_->loops);
  }
  impl_->control_loop.run();
}

void HttpServer::stop() {
  asio::post(impl_->control_loop, [this] { impl_->begin_shutdown(); });
}

}  // namespace gpuguard::server

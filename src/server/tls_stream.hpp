#pragma once
// What a connection is made of below HTTP: its deadline, and TLS that OpenSSL reads and writes itself on
// the socket's descriptor. Asio's ssl::stream instead runs OpenSSL over a BIO pair with four 17 KiB
// buffers per connection and copies every byte twice more; here the only asynchronous step is waiting
// until the socket can be read or written, as OpenSSL asks. Included only by http_server.cpp, the one
// translation unit that instantiates Asio's and Beast's templates.
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/basic_stream_socket.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

namespace gpuguard::server {

// When the deadline passes, the socket is closed, which ends whatever the connection waits for with
// operation_aborted. Moving the deadline later only moves a time point: the timer notices when it fires
// and waits again, so a request on a kept-alive connection usually costs no timer update.
template <class Executor>
class Deadline {
 public:
  using Socket = boost::asio::basic_stream_socket<boost::asio::ip::tcp, Executor>;
  using Clock = std::chrono::steady_clock;

  explicit Deadline(Socket& socket) : state_(std::make_shared<State>(socket)) {}
  ~Deadline() {
    state_->socket = nullptr;  // the timer's handler may still run: it holds the state, not this
    state_->timer.cancel();
  }
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

  void expires_after(Clock::duration duration) {
    state_->deadline = Clock::now() + duration;
    if (!state_->armed || state_->timer.expiry() > state_->deadline) arm(state_);
  }

  // Closes the socket now (the drain uses this for idle connections).
  void close() {
    if (state_->socket == nullptr) return;
    boost::system::error_code ignored;
    state_->socket->close(ignored);
  }

 private:
  struct State {
    explicit State(Socket& s) : timer(s.get_executor()), socket(&s) {}
    boost::asio::basic_waitable_timer<Clock, boost::asio::wait_traits<Clock>, Executor> timer;
    Socket* socket;  // null once the connection is gone
    Clock::time_point deadline;
    bool armed = false;
  };

  static void arm(const std::shared_ptr<State>& state) {
    state->armed = true;
    state->timer.expires_at(state->deadline);  // a wait already pending ends with operation_aborted
    state->timer.async_wait([state](const boost::system::error_code& ec) {
      if (ec == boost::asio::error::operation_aborted || state->socket == nullptr) return;
      state->armed = false;
      if (Clock::now() < state->deadline) {
        arm(state);  // moved later since this wait began
        return;
      }
      boost::system::error_code ignored;
      state->socket->close(ignored);
    });
  }

  std::shared_ptr<State> state_;
};

// A server-side TLS connection over a socket that it borrows. An AsyncReadStream and AsyncWriteStream
// for Beast, with a handshake and a shutdown of its own.
template <class Executor>
class TlsStream {
 public:
  using executor_type = Executor;  // NOLINT(readability-identifier-naming): the name Asio's stream concept asks for
  using Socket = boost::asio::basic_stream_socket<boost::asio::ip::tcp, Executor>;

  // Throws std::bad_alloc when OpenSSL cannot make the connection's state.
  TlsStream(Socket& socket, SSL_CTX* context) : socket_(socket), ssl_(SSL_new(context)) {
    if (!ssl_) throw std::bad_alloc();
    boost::system::error_code ignored;
    socket_.non_blocking(true, ignored);
    const int fd = static_cast<int>(socket_.native_handle());
    BIO* reader = BIO_new(reader_method());
    BIO* writer = BIO_new_socket(fd, BIO_NOCLOSE);
    if (reader == nullptr || writer == nullptr) {
      BIO_free(reader);
      BIO_free(writer);
      throw std::bad_alloc();
    }
    BIO_set_data(reader, this);
    BIO_set_init(reader, 1);
    SSL_set_bio(ssl_.get(), reader, writer);  // the SSL owns both now
    SSL_set_accept_state(ssl_.get());
    // Write what fits, as write_some may.
    SSL_set_mode(ssl_.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    // With AUTO_RETRY, one SSL_read goes on handling records that carry no data (a KeyUpdate, an alert)
    // for as long as the peer sends them. Without it, and without OpenSSL's read-ahead, OpenSSL returns
    // after each such record, since none is left in its own buffer: a step handles one record. (With
    // OpenSSL's read-ahead, a step went through every record of an 18 KiB buffer, some 700 KeyUpdates or
    // 4 ms, even after the connection was condemned.) The reading is ahead below OpenSSL instead, in
    // read_socket, which OpenSSL cannot see through: one read(2) per record or more, not two (its header,
    // then its body). The budget on the bytes one step reads bounds the rest.
    SSL_clear_mode(ssl_.get(), SSL_MODE_AUTO_RETRY);
    SSL_set_msg_callback(ssl_.get(), count_handshake_messages);
    SSL_set_msg_callback_arg(ssl_.get(), this);
  }
  TlsStream(const TlsStream&) = delete;  // OpenSSL's callbacks hold its address
  TlsStream& operator=(const TlsStream&) = delete;

  // The most handshake messages (KeyUpdates, in practice) a client may send after the handshake for each
  // request. No client sends any unasked; a connection past this is closed.
  static constexpr unsigned kMaxHandshakeMessagesPerRequest = 8;
  // The most bytes one step reads from the socket before it returns to the loop: two full records.
  static constexpr std::size_t kReadBudgetPerStep = std::size_t{34} * 1024;
  // The most one read(2) takes from the socket: a whole record at its largest (5 + 16,384 + 256 bytes)
  // and the next one's header. It reads into a buffer of the loop's (its thread's), which OpenSSL takes from
  // within the same step; what it leaves at the step's end (the start of a next record, read with this
  // one) the connection keeps in a buffer of its own, of that size, until OpenSSL has taken it. So a
  // connection holds none of it between steps unless a client sent more than a record at once.
  static constexpr std::size_t kReadAhead = std::size_t{16} * 1024 + 512;

  // A new request begins: the handshake messages it may carry are counted afresh.
  void begin_request() noexcept { handshake_messages_ = 0; }

  executor_type get_executor() noexcept { return socket_.get_executor(); }

  template <class Token>
  auto async_handshake(Token&& token) {
    return run(
        [this](SSL* ssl) {
          const int result = SSL_do_handshake(ssl);
          if (result == 1) handshake_done_ = true;
          return result;
        },
        [](int r) { return r == 1; }, std::forward<Token>(token));
  }

  // Sends close_notify and does not wait for the peer's: the connection closes right after. Nothing is
  // sent after a fatal error, as OpenSSL requires.
  template <class Token>
  auto async_shutdown(Token&& token) {
    return run([](SSL* ssl) { return SSL_shutdown(ssl); }, [](int r) { return r >= 0; }, std::forward<Token>(token),
               failed_);
  }

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& buffers, Token&& token) {
    const auto buffer = first_of<boost::asio::mutable_buffer>(buffers);
    return run([buffer](SSL* ssl) { return SSL_read(ssl, buffer.data(), clamp(buffer.size())); },
               [](int r) { return r > 0; }, std::forward<Token>(token), buffer.size() == 0);
  }

  // One TLS record per call: a sequence of buffers (a response's head and body) is first gathered into
  // one, so that it goes out as a single record rather than one per buffer.
  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& buffers, Token&& token) {
    const auto buffer = gather(buffers);
    return run([buffer](SSL* ssl) { return SSL_write(ssl, buffer.data(), clamp(buffer.size())); },
               [](int r) { return r > 0; }, std::forward<Token>(token), buffer.size() == 0);
  }

  // Without a trip through the loop, what needs no wait on the socket. A step that completes at once
  // still completes through the executor (async_compose may not complete inside its initiation), and
  // between the steps of one request the loop's other connections run, each holding its request's
  // buffers meanwhile; so the rest of a record already read, and an answer that the socket takes at
  // once, are handled here, in the request's own turn, which a record and an answer bound.

  // Up to `size` bytes of plaintext that OpenSSL already holds (the rest of a record it has read), without
  // reading the socket; 0 when it holds none. An error is left for the next read to report.
  std::size_t read_held(void* data, std::size_t size) {
    if (failed_ || condemned_ || !socket_.is_open() || size == 0) return 0;
    const int held = SSL_pending(ssl_.get());
    if (held <= 0) return 0;
    if (ERR_peek_error() != 0) ERR_clear_error();
    const int result = SSL_read(ssl_.get(), data, clamp(std::min(size, static_cast<std::size_t>(held))));
    return result > 0 ? static_cast<std::size_t>(result) : 0;
  }

  // Writes what the socket takes now of `buffers` (one record, as async_write_some); 0 when it would
  // wait, or failed: async_write_some then goes on with the same bytes, as OpenSSL requires of a retry,
  // and reports what failed.
  template <class ConstBuffers>
  std::size_t write_now(const ConstBuffers& buffers) {
    if (failed_ || !socket_.is_open()) return 0;
    const auto buffer = gather(buffers);
    if (buffer.size() == 0) return 0;
    if (ERR_peek_error() != 0) ERR_clear_error();
    errno = 0;
    const int result = SSL_write(ssl_.get(), buffer.data(), clamp(buffer.size()));
    return result > 0 ? static_cast<std::size_t>(result) : 0;
  }

 private:
  static constexpr std::size_t kRecordSize = std::size_t{16} * 1024;  // the most plaintext one TLS record carries

  struct SslFree {
    void operator()(SSL* ssl) const { SSL_free(ssl); }
  };

  static int clamp(std::size_t size) { return static_cast<int>(std::min<std::size_t>(size, INT_MAX)); }

  // What one SSL_write takes of a sequence: its first buffer, or the sequence gathered into one record.
  template <class ConstBuffers>
  boost::asio::const_buffer gather(const ConstBuffers& buffers) {
    auto buffer = first_of<boost::asio::const_buffer>(buffers);
    if (buffer.size() < kRecordSize && boost::asio::buffer_size(buffers) > buffer.size()) {
      gathered_.resize(std::min(boost::asio::buffer_size(buffers), kRecordSize));
      boost::asio::buffer_copy(boost::asio::buffer(gathered_), buffers);
      buffer = boost::asio::buffer(gathered_);
    }
    return buffer;
  }

  // The first non-empty buffer of a sequence: what one SSL_read or SSL_write call takes.
  template <class Buffer, class Buffers>
  static Buffer first_of(const Buffers& buffers) {
    for (auto it = boost::asio::buffer_sequence_begin(buffers); it != boost::asio::buffer_sequence_end(buffers); ++it) {
      const Buffer buffer(*it);
      if (buffer.size() > 0) return buffer;
    }
    return Buffer{};
  }

  // The BIO that OpenSSL reads the socket through: reads ahead into the loop's buffer (kReadAhead), refuses to read
  // the socket once the step's budget is spent (as "try again": the step yields) and for good once the
  // connection is condemned. Writes go to a plain socket BIO.
  static BIO_METHOD* reader_method() {
    static BIO_METHOD* const kMethod = [] {
      BIO_METHOD* made = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "gpuguard socket reader");
      if (made == nullptr || BIO_meth_set_read_ex(made, read_socket) != 1 ||
          BIO_meth_set_ctrl(made, control_reader) != 1) {
        throw std::bad_alloc();
      }
      return made;
    }();
    return kMethod;
  }

  static int read_socket(BIO* bio, char* out, std::size_t size, std::size_t* read) {
    auto* self = static_cast<TlsStream*>(BIO_get_data(bio));
    BIO_clear_retry_flags(bio);
    *read = 0;
    if (self->condemned_) return 0;
    if (self->ahead_begin_ == self->ahead_end_) {
      if (self->read_budget_ == 0) {
        self->throttled_ = true;
        BIO_set_retry_read(bio);
        return 0;
      }
      char* const scratch = loop_read_buffer();
      const ssize_t got =
          ::read(static_cast<int>(self->socket_.native_handle()), scratch, std::min(kReadAhead, self->read_budget_));
      if (got <= 0) {
        if (got == 0) {
          self->peer_closed_ = true;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
          BIO_set_retry_read(bio);
        }
        return 0;  // errno stays what read(2) left: error_of reads it
      }
      self->read_budget_ -= std::min(static_cast<std::size_t>(got), self->read_budget_);
      self->ahead_ = scratch;
      self->ahead_begin_ = 0;
      self->ahead_end_ = static_cast<std::size_t>(got);
    }
    const std::size_t taken = std::min(size, self->ahead_end_ - self->ahead_begin_);
    std::memcpy(out, self->ahead_ + self->ahead_begin_, taken);
    self->ahead_begin_ += taken;
    *read = taken;
    return 1;
  }

  static long control_reader(BIO* bio, int command, long, void*) {
    const auto* self = static_cast<const TlsStream*>(BIO_get_data(bio));
    switch (command) {
      case BIO_CTRL_EOF:  // OpenSSL tells a peer that closed without close_notify by this
        return self->peer_closed_ ? 1 : 0;
      case BIO_CTRL_PENDING: return static_cast<long>(self->ahead_end_ - self->ahead_begin_);
      case BIO_CTRL_FLUSH: return 1;
      default: return 0;
    }
  }

  bool read_ahead_pending() const noexcept { return ahead_begin_ != ahead_end_; }

  // The loop's read buffer: one per thread, and a connection's steps run on its loop's thread alone, so
  // it is this step's, from the read(2) until the step ends.
  static char* loop_read_buffer() {
    thread_local const std::unique_ptr<char[]> kBuffer = std::make_unique_for_overwrite<char[]>(kReadAhead);
    return kBuffer.get();
  }

  // At a step's end: what OpenSSL left of the loop's buffer moves to one of the connection's own, of its
  // size (the next step may run after another connection's reads); what it took all of is let go.
  void keep_read_ahead() {
    if (!read_ahead_pending()) {
      kept_.reset();
      ahead_ = nullptr;
      ahead_begin_ = ahead_end_ = 0;
      return;
    }
    if (ahead_ != loop_read_buffer()) return;  // already the connection's own
    const std::size_t pending = ahead_end_ - ahead_begin_;
    auto kept = std::make_unique_for_overwrite<char[]>(pending);
    std::memcpy(kept.get(), ahead_ + ahead_begin_, pending);
    kept_ = std::move(kept);
    ahead_ = kept_.get();
    ahead_begin_ = 0;
    ahead_end_ = pending;
  }

  static void count_handshake_messages(int write, int, int content_type, const void*, std::size_t, SSL*, void* arg) {
    auto* self = static_cast<TlsStream*>(arg);
    if (write != 0 || content_type != SSL3_RT_HANDSHAKE || !self->handshake_done_) return;
    if (++self->handshake_messages_ > kMaxHandshakeMessagesPerRequest) self->condemned_ = true;
  }

  // What a failed SSL call means, as Asio's ssl::stream reports it.
  boost::system::error_code error_of(int result, int ssl_error) const {
    if (ssl_error == SSL_ERROR_ZERO_RETURN) return boost::asio::error::eof;  // close_notify
    if (const unsigned long queued = ERR_get_error(); queued != 0) {
      if (ERR_GET_REASON(queued) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
        return boost::asio::ssl::error::stream_truncated;
      return {static_cast<int>(queued), boost::asio::error::get_ssl_category()};
    }
    if (ssl_error == SSL_ERROR_SYSCALL && result == 0) return boost::asio::ssl::error::stream_truncated;
    if (ssl_error == SSL_ERROR_SYSCALL && errno != 0) return {errno, boost::system::system_category()};
    return boost::asio::ssl::error::stream_truncated;
  }

  // Calls `step` until `done` says it succeeded, waiting on the socket whenever OpenSSL wants to read or
  // write first. Completes with the step's result as a byte count. A step that succeeds at once still
  // completes through the executor, never inside the initiating call.
  template <class Step, class Done, class Token>
  auto run(Step step, Done done, Token&& token, bool nothing_to_do = false) {
    return boost::asio::async_compose<Token, void(boost::system::error_code, std::size_t)>(
        [this, step, done, nothing_to_do, waited = false, finished = false, outcome = boost::system::error_code{},
         transferred = std::size_t{0}](auto& self, boost::system::error_code wait_error = {}) mutable {
          if (finished) {
            self.complete(outcome, transferred);
            return;
          }
          if (wait_error) {
            self.complete(wait_error, 0);  // closed by the deadline or the drain
            return;
          }
          int result = 0;
          if (!socket_.is_open()) {
            // Closed by the deadline or the drain. OpenSSL still holds the old descriptor number, which the
            // next socket opened anywhere in the process may already own: it must not read or write it.
            outcome = boost::asio::error::bad_descriptor;
            failed_ = true;
          } else if (!nothing_to_do) {
            if (ERR_peek_error() != 0) ERR_clear_error();  // SSL_get_error reads this thread's queue
            errno = 0;
            read_budget_ = kReadBudgetPerStep;
            throttled_ = false;
            result = step(ssl_.get());
            keep_read_ahead();
            if (!done(result)) {
              const int ssl_error = SSL_get_error(ssl_.get(), result);
              if (condemned_) {
                outcome = boost::asio::error::connection_aborted;  // too many handshake messages
                failed_ = true;
              } else if (ssl_error == SSL_ERROR_WANT_READ && (throttled_ || read_ahead_pending())) {
                // Its budget spent, or a record that carried no data handled with more already read: let
                // the loop's other work run before reading on.
                waited = true;
                boost::asio::post(std::move(self));
                return;
              } else if (ssl_error == SSL_ERROR_WANT_READ || ssl_error == SSL_ERROR_WANT_WRITE) {
                waited = true;
                socket_.async_wait(ssl_error == SSL_ERROR_WANT_READ ? Socket::wait_read : Socket::wait_write,
                                   std::move(self));
                return;
              } else {
                outcome = error_of(result, ssl_error);
                failed_ = outcome != boost::asio::error::eof;
              }
            }
          }
          transferred = outcome || result < 0 ? 0 : static_cast<std::size_t>(result);
          finished = true;
          if (!waited) {
            boost::asio::post(std::move(self));
            return;
          }
          self.complete(outcome, transferred);
        },
        token, socket_);
  }

  Socket& socket_;
  std::unique_ptr<SSL, SslFree> ssl_;
  std::string gathered_;
  bool failed_ = false;  // a fatal TLS or socket error happened
  bool handshake_done_ = false;
  bool condemned_ = false;    // sent too many handshake messages: no more reading
  bool throttled_ = false;    // the current step spent its read budget
  bool peer_closed_ = false;  // read(2) gave end of file
  unsigned handshake_messages_ = 0;
  std::size_t read_budget_ = kReadBudgetPerStep;
  // Read from the socket, not yet taken by OpenSSL: [ahead_begin_, ahead_end_) of the loop's buffer within
  // a step, of kept_ between steps.
  const char* ahead_ = nullptr;
  std::unique_ptr<char[]> kept_;
  std::size_t ahead_begin_ = 0;
  std::size_t ahead_end_ = 0;
};

}  // namespace gpuguard::server

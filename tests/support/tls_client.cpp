#include "tls_client.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>

namespace gpuguard::test {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

struct TlsClient::Impl {
  asio::io_context ioc;
  ssl::context ctx{ssl::context::tls_client};
  std::unique_ptr<ssl::stream<tcp::socket>> stream;
  boost::beast::flat_buffer buffer;
};

TlsClient::TlsClient(unsigned short port, const TlsOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->ctx.load_verify_file(std::string(GPUGUARD_TEST_CERTS_DIR) + "/ca.crt");
  impl_->ctx.set_verify_mode(ssl::verify_peer);
  SSL_CTX* native = impl_->ctx.native_handle();
  if (options.min_version) SSL_CTX_set_min_proto_version(native, options.min_version);
  if (options.max_version) SSL_CTX_set_max_proto_version(native, options.max_version);
  if (!options.alpn.empty()) {
    std::string wire;
    for (const auto& protocol : options.alpn) wire += static_cast<char>(protocol.size()) + protocol;
    SSL_CTX_set_alpn_protos(native, reinterpret_cast<const unsigned char*>(wire.data()),
                            static_cast<unsigned>(wire.size()));
  }
  impl_->stream = std::make_unique<ssl::stream<tcp::socket>>(impl_->ioc, impl_->ctx);
  impl_->stream->set_verify_callback(ssl::host_name_verification("127.0.0.1"));
  auto& socket = impl_->stream->next_layer();
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  // No SO_RCVTIMEO: Asio's blocking reads wait in poll() once it expires, so it bounds nothing, and a read
  // under it ends in EINTR, not restarted, whenever a signal for another thread wakes this one (a SIGCHLD
  // that std::system() blocks in its own thread). The test's ctest TIMEOUT bounds a server that hangs.
  impl_->stream->handshake(ssl::stream_base::client);  // throws on failure
}

TlsClient::~TlsClient() = default;

HttpReply TlsClient::request(const std::string& method, const std::string& target, const std::string& body,
                             const std::string& content_type) {
  http::request<http::string_body> request{http::string_to_verb(method), target, 11};
  request.set(http::field::host, "127.0.0.1");
  if (!body.empty() || method == "POST") {
    request.set(http::field::content_type, content_type);
    request.body() = body;
    request.prepare_payload();
  }
  http::write(*impl_->stream, request);
  return read_reply();
}

HttpReply TlsClient::read_reply() {
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::uint64_t{64} * 1024 * 1024);
  http::read(*impl_->stream, impl_->buffer, parser);
  HttpReply reply;
  reply.status = parser.get().result_int();
  for (const auto& field : parser.get()) {
    std::string name(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    reply.headers[name] = std::string(field.value());
  }
  reply.body = parser.get().body();
  return reply;
}

void TlsClient::write_raw(const std::string& bytes) { asio::write(*impl_->stream, asio::buffer(bytes)); }

std::pair<std::string, bool> TlsClient::read_until_closed(std::chrono::milliseconds limit) {
  using std::chrono::steady_clock;
  const auto deadline = steady_clock::now() + limit;
  std::string received;
  char chunk[4096];
  while (steady_clock::now() < deadline) {
    // Read only what has arrived (or what OpenSSL already holds), so that the deadline holds.
    if (SSL_pending(impl_->stream->native_handle()) == 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady_clock::now());
      pollfd readable{impl_->stream->next_layer().native_handle(), POLLIN, 0};
      if (::poll(&readable, 1, static_cast<int>(std::max<long long>(left.count(), 0))) <= 0) continue;
    }
    boost::system::error_code ec;
    const std::size_t n = impl_->stream->read_some(asio::buffer(chunk), ec);
    received.append(chunk, n);
    if (ec == asio::error::interrupted) continue;
    if (ec) return {received, true};
  }
  return {received, false};
}

bool TlsClient::answered_within(std::chrono::milliseconds limit) {
  pollfd readable{impl_->stream->next_layer().native_handle(), POLLIN, 0};
  return ::poll(&readable, 1, static_cast<int>(limit.count())) > 0;
}

std::string TlsClient::negotiated_alpn() const {
  const unsigned char* data = nullptr;
  unsigned int length = 0;
  SSL_get0_alpn_selected(impl_->stream->native_handle(), &data, &length);
  return std::string(reinterpret_cast<const char*>(data), length);
}

std::string TlsClient::negotiated_version() const { return SSL_get_version(impl_->stream->native_handle()); }

}  // namespace gpuguard::test

namespace gpuguard::test {

std::string TlsClient::peer_serial() const {
  X509* peer = SSL_get1_peer_certificate(impl_->stream->native_handle());
  if (peer == nullptr) return {};
  BIGNUM* serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(peer), nullptr);
  char* hex = BN_bn2hex(serial);
  std::string text = hex;
  OPENSSL_free(hex);
  BN_free(serial);
  X509_free(peer);
  return text;
}

}  // namespace gpuguard::test

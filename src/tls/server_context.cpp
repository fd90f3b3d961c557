#include "gpuguard/tls/server_context.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <stdexcept>
#include <string>

namespace gpuguard::tls {
namespace {

namespace ssl = boost::asio::ssl;

std::string openssl_reason() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown error";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

// The apiserver forces HTTP/1.1 through ALPN; a client that offers only other protocols is refused with
// the no_application_protocol alert rather than silently served something it did not ask for.
int select_http11(SSL*, const unsigned char** out, unsigned char* out_length, const unsigned char* offered,
                  unsigned int offered_length, void*) {
  static const unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, out_length, kHttp11, sizeof kHttp11, offered, offered_length) !=
      OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

std::shared_ptr<ssl::context> make_server_context(const std::filesystem::path& cert_file,
                                                  const std::filesystem::path& key_file) {
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX* native = context->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_max_proto_version(native, TLS1_3_VERSION);
  SSL_CTX_set_options(native, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  if (SSL_CTX_set_cipher_list(native, kIntermediateCiphers) != 1 ||
      SSL_CTX_set1_groups_list(native, "X25519:prime256v1:secp384r1") != 1 ||
      SSL_CTX_set_dh_auto(native, 1) != 1) {
    throw std::runtime_error("TLS configuration rejected by OpenSSL: " + openssl_reason());
  }
  SSL_CTX_set_alpn_select_cb(native, select_http11, nullptr);

  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(native, cert_file.c_str()) != 1) {
    throw std::runtime_error("cannot load certificate " + cert_file.string() + ": " + openssl_reason());
  }
  if (SSL_CTX_use_PrivateKey_file(native, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    throw std::runtime_error("cannot load private key " + key_file.string() + ": " + openssl_reason());
  }
  if (SSL_CTX_check_private_key(native) != 1) {
    throw std::runtime_error("private key " + key_file.string() + " does not match certificate " +
                             cert_file.string());
  }
  return context;
}

}  // namespace gpuguard::tls

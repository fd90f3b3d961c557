#include "gpuguard/tls/server_context.hpp"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <ctime>
#include <stdexcept>

#include "gpuguard/files/read_file.hpp"
#include "gpuguard/log/log.hpp"

namespace gpuguard::tls {
namespace {

namespace ssl = boost::asio::ssl;

std::string openssl_reason() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data found";
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

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using Bio = std::unique_ptr<BIO, BioFree>;

Bio memory_bio(const std::string& pem) { return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))); }

// The leaf certificate, then every further certificate in the file as the chain.
void use_certificate_chain(SSL_CTX* native, const std::string& pem, const std::string& name) {
  Bio bio = memory_bio(pem);
  X509* leaf = PEM_read_bio_X509_AUX(bio.get(), nullptr, nullptr, nullptr);
  if (leaf == nullptr || SSL_CTX_use_certificate(native, leaf) != 1) {
    X509_free(leaf);
    throw std::runtime_error("cannot load certificate " + name + ": " + openssl_reason());
  }
  X509_free(leaf);
  SSL_CTX_clear_chain_certs(native);
  while (X509* intermediate = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(native, intermediate) != 1) {
      X509_free(intermediate);
      throw std::runtime_error("cannot load certificate chain " + name + ": " + openssl_reason());
    }
  }
  ERR_clear_error();  // the loop ends on "no start line", which is expected
}

void use_private_key(SSL_CTX* native, const std::string& pem, const std::string& name) {
  Bio bio = memory_bio(pem);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  const bool used = key != nullptr && SSL_CTX_use_PrivateKey(native, key) == 1;
  EVP_PKEY_free(key);
  if (!used) throw std::runtime_error("cannot load private key " + name + ": " + openssl_reason());
}

}  // namespace

std::shared_ptr<ssl::context> make_server_context(const std::string& cert_pem, const std::string& key_pem,
                                                  const std::string& cert_name, const std::string& key_name) {
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX* native = context->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_max_proto_version(native, TLS1_3_VERSION);
  SSL_CTX_set_options(native, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  // An idle keep-alive connection (the apiserver keeps a pool) then holds no 16 KiB record buffers.
  SSL_CTX_set_mode(native, SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_set_cipher_list(native, kIntermediateCiphers) != 1 ||
      SSL_CTX_set1_groups_list(native, "X25519:prime256v1:secp384r1") != 1 || SSL_CTX_set_dh_auto(native, 1) != 1) {
    throw std::runtime_error("TLS configuration rejected by OpenSSL: " + openssl_reason());
  }
  SSL_CTX_set_alpn_select_cb(native, select_http11, nullptr);

  ERR_clear_error();
  use_certificate_chain(native, cert_pem, cert_name);
  use_private_key(native, key_pem, key_name);
  if (SSL_CTX_check_private_key(native) != 1) {
    ERR_clear_error();
    throw std::runtime_error("private key " + key_name + " does not match certificate " + cert_name);
  }
  return context;
}

double certificate_expiry(ssl::context& context) {
  X509* leaf = SSL_CTX_get0_certificate(context.native_handle());
  std::tm tm{};
  if (leaf == nullptr || ASN1_TIME_to_tm(X509_get0_notAfter(leaf), &tm) != 1) return 0;
  return static_cast<double>(timegm(&tm));
}

CertificateWatcher::CertificateWatcher(std::filesystem::path cert_file, std::filesystem::path key_file,
                                       metrics::ReloadMetrics& metrics)
    : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)), metrics_(metrics) {
  load(true);
}

void CertificateWatcher::watch(std::chrono::milliseconds interval) {
  poller_ = std::make_unique<files::Poller>(interval, [this] { reload(); });
}

bool CertificateWatcher::reload() { return load(false); }

bool CertificateWatcher::load(bool at_start) {
  auto cert = files::read_file(cert_file_);
  auto key = files::read_file(key_file_);
  if (!at_start && (!cert || !key)) return false;  // mid-swap: the next check sees the new files
  if (!at_start && *cert == last_cert_ && *key == last_key_) return false;
  if (!cert) throw std::runtime_error("cannot read certificate " + cert_file_.string());
  if (!key) throw std::runtime_error("cannot read private key " + key_file_.string());
  last_cert_ = *cert;
  last_key_ = *key;
  std::shared_ptr<ssl::context> context;
  try {
    context = make_server_context(*cert, *key, cert_file_.string(), key_file_.string());
  } catch (const std::exception& e) {
    if (at_start) throw;
    metrics_.count_certificate_reload(false);
    log::error("certificate refused; the previous one stays in use", {{"reason", e.what()}});
    return false;
  }
  const double expiry = certificate_expiry(*context);
  context_.store(std::move(context));
  metrics_.set_certificate_expiry(expiry);
  if (!at_start) metrics_.count_certificate_reload(true);
  log::info(at_start ? "certificate loaded" : "certificate reloaded",
            {{"file", cert_file_.string()}, {"not_after", static_cast<long long>(expiry)}});
  return true;
}

}  // namespace gpuguard::tls

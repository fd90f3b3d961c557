#pragma once
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/ssl/context.hpp>

#include "gpuguard/files/poller.hpp"
#include "gpuguard/metrics/reloads.hpp"

namespace gpuguard::tls {

// Mozilla "intermediate" TLS 1.2 ciphers; TLS 1.3 keeps OpenSSL's three default suites, which match it.
inline constexpr const char* kIntermediateCiphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384:DHE-RSA-CHACHA20-POLY1305";

// A server context for a PEM certificate chain and its private key (ECDSA or RSA): TLS 1.2 and 1.3 only,
// the ciphers above, and ALPN that accepts http/1.1 and nothing else. Throws std::runtime_error naming
// `cert_name`/`key_name` and the OpenSSL reason when the pair cannot be used; never prints key material.
std::shared_ptr<boost::asio::ssl::context> make_server_context(const std::string& cert_pem, const std::string& key_pem,
                                                               const std::string& cert_name,
                                                               const std::string& key_name);

// notAfter of the context's leaf certificate, in seconds since the epoch.
double certificate_expiry(boost::asio::ssl::context& context);

// The serving certificate, reloaded when its files change (a mounted Secret's files are symlinks that the
// kubelet swaps). A pair that cannot be used is refused, logged and counted; the previous one stays, so
// handshakes never fail because of a rotation.
class CertificateWatcher {
 public:
  // Throws std::runtime_error when the files do not hold a usable pair at start.
  CertificateWatcher(std::filesystem::path cert_file, std::filesystem::path key_file, metrics::ReloadMetrics& metrics);

  std::shared_ptr<boost::asio::ssl::context> current() const { return context_.load(); }
  void watch(std::chrono::milliseconds interval);
  // One check, as the poller does it; returns true when a new pair was swapped in.
  bool reload();

 private:
  bool load(bool at_start);

  std::filesystem::path cert_file_, key_file_;
  metrics::ReloadMetrics& metrics_;
  std::atomic<std::shared_ptr<boost::asio::ssl::context>> context_;
  std::string last_cert_, last_key_;
  std::unique_ptr<files::Poller> poller_;
};

}  // namespace gpuguard::tls

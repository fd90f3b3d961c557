#pragma once
#include <filesystem>
#include <memory>

#include <boost/asio/ssl/context.hpp>

namespace gpuguard::tls {

// Mozilla "intermediate" TLS 1.2 ciphers; TLS 1.3 keeps OpenSSL's three default suites, which match it.
inline constexpr const char* kIntermediateCiphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384:DHE-RSA-CHACHA20-POLY1305";

// A server context for a PEM certificate chain and its private key (ECDSA or RSA): TLS 1.2 and 1.3 only,
// the ciphers above, and ALPN that accepts http/1.1 and nothing else. Throws std::runtime_error naming the
// file and the OpenSSL reason when the pair cannot be used; never prints key material.
std::shared_ptr<boost::asio::ssl::context> make_server_context(const std::filesystem::path& cert_file,
                                                               const std::filesystem::path& key_file);

}  // namespace gpuguard::tls

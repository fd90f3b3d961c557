#include "gpuguard/kube/api_server.hpp"

#include <cstdlib>
#include <stdexcept>

namespace gpuguard::kube {

std::string bracketed(const std::string& host) { return host.find(':') != std::string::npos ? "[" + host + "]" : host; }

ApiServer ApiServer::from_url(std::string_view url) {
  constexpr std::string_view kScheme = "https://";
  if (!url.starts_with(kScheme))
    throw std::invalid_argument("apiserver URL '" + std::string(url) + "' must start with https://");
  std::string_view rest = url.substr(kScheme.size());
  ApiServer server;
  const std::size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    server.path_prefix = std::string(rest.substr(slash));
    while (!server.path_prefix.empty() && server.path_prefix.back() == '/') server.path_prefix.pop_back();
    rest = rest.substr(0, slash);
  }
  std::string_view host = rest;
  if (rest.starts_with('[')) {
    const std::size_t close = rest.find(']');
    if (close == std::string_view::npos)
      throw std::invalid_argument("apiserver URL '" + std::string(url) + "' has an unclosed [");
    host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && !rest.starts_with(':'))
      throw std::invalid_argument("apiserver URL '" + std::string(url) + "' is malformed after ]");
    if (!rest.empty()) server.port = std::string(rest.substr(1));
  } else if (const std::size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    server.port = std::string(rest.substr(colon + 1));
  }
  server.host = std::string(host);
  if (server.host.empty()) throw std::invalid_argument("apiserver URL '" + std::string(url) + "' has no host");
  const bool numeric_port = !server.port.empty() && server.port.size() <= 5 &&
                            server.port.find_first_not_of("0123456789") == std::string::npos &&
                            std::stoul(server.port) > 0 && std::stoul(server.port) <= 65535;
  if (!numeric_port) throw std::invalid_argument("apiserver URL '" + std::string(url) + "' has an invalid port");
  return server;
}

ApiServer ApiServer::in_cluster() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0') {
    throw std::runtime_error("KUBERNETES_SERVICE_HOST/PORT are not set (not running in a pod); pass --apiserver-url");
  }
  ApiServer server = from_url("https://" + bracketed(host) + ":" + port);
  server.token_file = std::filesystem::path(kServiceAccountDir) / "token";
  server.ca_file = std::filesystem::path(kServiceAccountDir) / "ca.crt";
  return server;
}

std::string ApiServer::url() const { return "https://" + bracketed(host) + ":" + port + path_prefix; }

}  // namespace gpuguard::kube

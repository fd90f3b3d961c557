#pragma once
// Where the Kubernetes API is and how to authenticate to it: from a URL and files, or from the pod's
// service account. Parsing only; src/kube/api_client.cpp does the talking.
#include <filesystem>
#include <string>
#include <string_view>

namespace gpuguard::kube {

inline constexpr const char* kServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";

struct ApiServer {
  std::string host;  // DNS name or IP address (IPv6 without brackets)
  std::string port = "443";
  std::string path_prefix;           // for an apiserver behind a proxy path; usually empty
  std::filesystem::path token_file;  // re-read for every request; empty: no Authorization header
  std::filesystem::path ca_file;     // re-read for every connection; empty: the system's trust store
  // The name or address its certificate is checked against, and sent as SNI when a name; empty: host. One
  // API server of several, reached at its own address, is checked as the Service all of them serve.
  std::string verify_name;

  // https://host[:port][/prefix]. Throws std::invalid_argument naming what is wrong.
  static ApiServer from_url(std::string_view url);
  // KUBERNETES_SERVICE_HOST/PORT and the service account's token and CA. Throws std::runtime_error when
  // those are missing (not running in a pod).
  static ApiServer in_cluster();
  std::string url() const;
};

// An IPv6 address in a URL or Host header goes in brackets.
std::string bracketed(const std::string& host);

}  // namespace gpuguard::kube

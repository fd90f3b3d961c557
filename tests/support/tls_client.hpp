#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gpuguard::test {

struct HttpReply {
  unsigned status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

struct TlsOptions {
  int max_version = 0;  // e.g. TLS1_1_VERSION; 0 = library default
  int min_version = 0;
  std::vector<std::string> alpn = {"http/1.1"};  // what the apiserver offers
};

// A blocking HTTPS/1.1 client that verifies the server against the test CA (host 127.0.0.1) and keeps
// its connection alive between requests. Its reads wait for the server (the test's ctest TIMEOUT bounds
// them), except read_until_closed's, which its limit bounds.
class TlsClient {
 public:
  explicit TlsClient(unsigned short port, const TlsOptions& options = {});
  ~TlsClient();

  HttpReply request(const std::string& method, const std::string& target, const std::string& body = "",
                    const std::string& content_type = "application/json");
  // Raw access for misbehaving-client tests.
  void write_raw(const std::string& bytes);
  // The next response on the connection, such as the answer to a request sent with write_raw.
  HttpReply read_reply();
  // Reads until the server closes; returns what arrived and whether it closed within `limit`.
  std::pair<std::string, bool> read_until_closed(std::chrono::milliseconds limit);
  // Whether the server sent anything (or closed) within `limit`, without reading it.
  bool answered_within(std::chrono::milliseconds limit);
  std::string negotiated_alpn() const;
  std::string negotiated_version() const;
  std::string peer_serial() const;  // hex serial of the certificate the server presented

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::test

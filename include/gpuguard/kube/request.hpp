#pragma once
// A request to the Kubernetes API that is not a list or a watch: the device plugin's PATCH of its Node's
// status, the node enforcer's Events, the audit loop's Lease and PolicyReports. Blocking, on an io_context
// of its own, bounded by a timeout. send_request connects for the one request, for a caller that writes
// rarely (a condition on change); RequestSession keeps its connection between requests, for one that
// writes often (a Lease every 2 s and a report per namespace).
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/kube/api_server.hpp"

namespace gpuguard::kube {

struct Request {
  std::string method;  // "PATCH", "GET"
  std::string path;    // "/api/v1/nodes/n1/status", without the server's path prefix
  std::string content_type;
  std::string body;
  std::string user_agent = "gpuguard";
  std::string accept;  // empty: JSON, as the API serves it by default
};

struct Reply {
  unsigned status = 0;  // 0: no HTTP answer; `error` says why
  std::string body;     // up to 1 MiB
  std::string error;    // the transport's failure, or the Status message of a non-2xx answer
  // Its Warning headers as sent (`299 - "text"`), the first 16: what admission said of a create.
  std::vector<std::string> warnings;
};

Reply send_request(const ApiServer& server, const Request& request, std::chrono::milliseconds timeout);

// Requests over one connection, kept open while the API server keeps it: one TLS handshake for many
// requests, as client-go's transport does. A request that finds its kept connection closed by the server
// (while it was idle) before any of an answer came is sent once more on a new one; a timeout is not. The token is read
// for every request, the CA file for every connection. For one thread at a time.
class RequestSession {
 public:
  explicit RequestSession(ApiServer server);
  ~RequestSession();
  RequestSession(const RequestSession&) = delete;
  RequestSession& operator=(const RequestSession&) = delete;

  Reply send(const Request& request, std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// For a query parameter (a field selector, a continue token): every byte but the unreserved ones as %XX.
std::string percent_encode(std::string_view text);

}  // namespace gpuguard::kube

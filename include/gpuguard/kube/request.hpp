#pragma once
// One request to the Kubernetes API that is not a list or a watch: the device plugin's PATCH of its
// Node's status, the audit loop's Lease and PolicyReports. Blocking, on an io_context of its own, bounded
// by a timeout; for a caller that writes rarely (a condition on change, a Lease every 2 s, a report when it
// changes), which needs no connection kept open.
#include <chrono>
#include <string>
#include <string_view>

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
};

Reply send_request(const ApiServer& server, const Request& request, std::chrono::milliseconds timeout);

// For a query parameter (a field selector, a continue token): every byte but the unreserved ones as %XX.
std::string percent_encode(std::string_view text);

}  // namespace gpuguard::kube

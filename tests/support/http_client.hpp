#pragma once
// Plain HTTP/1.1 from a test to a server on 127.0.0.1 (the extender's verbs, the status ports of the device
// plugin and the audit controller).
#include <string>

namespace gpuguard::test {

struct Reply {
  unsigned status = 0;
  std::string body;
};

// One request on a fresh connection (Connection: close); reads bounded by SO_RCVTIMEO.
Reply http_request(unsigned short port, const std::string& method, const std::string& path,
                   const std::string& body = "", const std::string& content_type = "application/json");

}  // namespace gpuguard::test

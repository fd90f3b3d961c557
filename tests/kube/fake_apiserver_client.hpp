#pragma once
// The fake API server as kube's clients reach it, for the kube integration tests: its URL, the test CA,
// and a token file holding its token, removed with this.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "fake_apiserver.hpp"
#include "gpuguard/kube/api_server.hpp"
#include "server_process.hpp"

namespace gpuguard::test {

class FakeApiserverClient {
 public:
  FakeApiserverClient(const FakeApiserver& apiserver, const std::string& token)
      : token_file_(std::filesystem::temp_directory_path() / ("gpuguard-" + token + "-" + std::to_string(::getpid()))),
        server_(kube::ApiServer::from_url(apiserver.url())) {
    std::ofstream(token_file_) << token;
    server_.token_file = token_file_;
    server_.ca_file = certs_dir() + "/ca.crt";
  }
  ~FakeApiserverClient() {
    std::error_code ignored;
    std::filesystem::remove(token_file_, ignored);
  }
  FakeApiserverClient(const FakeApiserverClient&) = delete;
  FakeApiserverClient& operator=(const FakeApiserverClient&) = delete;

  const kube::ApiServer& server() const { return server_; }

 private:
  std::filesystem::path token_file_;
  kube::ApiServer server_;
};

}  // namespace gpuguard::test

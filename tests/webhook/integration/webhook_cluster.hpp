#pragma once
// The real webhook's view of a cluster in the webhook's integration tests: the fake API server, a token file
// it takes, and the flags that point the webhook at both (as a pod's service account would).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fake_apiserver.hpp"
#include "server_process.hpp"

namespace gpuguard::test {

struct WebhookCluster {
  FakeApiserver apiserver{"webhook-token"};
  std::filesystem::path dir;
  explicit WebhookCluster(const std::string& name)
      : dir(std::filesystem::temp_directory_path() / ("gpuguard-" + name + "-" + std::to_string(getpid()))) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "token") << "webhook-token";
  }
  ~WebhookCluster() { std::filesystem::remove_all(dir); }
  WebhookCluster(const WebhookCluster&) = delete;
  WebhookCluster& operator=(const WebhookCluster&) = delete;
  // The API's flags, then `more`.
  std::vector<std::string> flags(const std::vector<std::string>& more = {}) const {
    std::vector<std::string> all = {"--apiserver-url",
                                    apiserver.url(),
                                    "--token-file",
                                    (dir / "token").string(),
                                    "--ca-file",
                                    certs_dir() + "/ca.crt",
                                    "--api-discovery-interval",
                                    "0.5"};
    all.insert(all.end(), more.begin(), more.end());
    return all;
  }
};

}  // namespace gpuguard::test

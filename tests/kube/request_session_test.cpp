// kube::RequestSession against the fake API server over real TLS: many requests over one connection, and
// a connection the server closed while it was idle found and replaced within the same request.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fake_apiserver.hpp"
#include "gpuguard/kube/request.hpp"
#include "server_process.hpp"

using namespace gpuguard;
namespace fs = std::filesystem;

TEST_CASE("request session: one handshake for many requests, and a connection the server closed is replaced") {
  test::FakeApiserver apiserver("session-token");
  const fs::path token = fs::temp_directory_path() / ("gpuguard-session-token-" + std::to_string(getpid()));
  std::ofstream(token) << "session-token";
  kube::ApiServer server = kube::ApiServer::from_url(apiserver.url());
  server.token_file = token;
  server.ca_file = test::certs_dir() + "/ca.crt";
  kube::RequestSession session(server);
  const kube::Request get{"GET", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", "", "", "gpuguard-test", ""};
  for (int i = 0; i < 20; ++i) CHECK(session.send(get, std::chrono::seconds(5)).status == 404);
  CHECK(apiserver.handshakes() == 1);

  // Closed by the server: the very next request is answered, over a second connection.
  apiserver.cut_connections();
  const kube::Reply after = session.send(get, std::chrono::seconds(5));
  CHECK(after.status == 404);
  CHECK(apiserver.handshakes() == 2);

  // send_request makes a connection for each request.
  for (int i = 0; i < 3; ++i) CHECK(kube::send_request(server, get, std::chrono::seconds(5)).status == 404);
  CHECK(apiserver.handshakes() == 5);
  fs::remove(token);
}

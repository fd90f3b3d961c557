// kube::RequestSession against the fake API server over real TLS: many requests over one connection, and
// a connection the server closed while it was idle found and replaced within the same request.
#include <catch2/catch.hpp>

#include "fake_apiserver.hpp"
#include "fake_apiserver_client.hpp"
#include "gpuguard/kube/request.hpp"

using namespace gpuguard;

TEST_CASE("request session: one handshake for many requests, and a connection the server closed is replaced") {
  test::FakeApiserver apiserver("session-token");
  const test::FakeApiserverClient client(apiserver, "session-token");
  const kube::ApiServer& server = client.server();
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
}

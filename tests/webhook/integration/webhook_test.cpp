// The real gpuguard-webhook binary on 127.0.0.1, spoken to over real TLS.
#include <openssl/ssl.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "files.hpp"
#include "gpuguard/admission/base64.hpp"
#include "server_process.hpp"
#include "tls_client.hpp"

using namespace gpuguard::test;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string fixture_review(const std::string& name) {
  return read_file(fixtures_dir() / "admission" / name / "review.json");
}

json patch_of(const HttpReply& reply) {
  const json response = json::parse(reply.body);
  const auto bytes = gpuguard::admission::base64_decode(response["response"]["patch"].get<std::string>());
  REQUIRE(bytes.has_value());
  return json::parse(*bytes);
}

}  // namespace

TEST_CASE("serves reviews over TLS with keep-alive, and exits 0 on SIGTERM") {
  WebhookProcess webhook;
  TlsClient client(webhook.port());
  CHECK(client.negotiated_alpn() == "http/1.1");

  CHECK(client.request("GET", "/healthz").status == 200);
  CHECK(client.request("GET", "/readyz").status == 200);

  const std::string body = fixture_review("user-all");
  for (int i = 0; i < 50; ++i) {  // one connection throughout: the client never reconnects
    const HttpReply reply = client.request("POST", "/mutate?timeout=10s", body);
    REQUIRE(reply.status == 200);
    REQUIRE(reply.headers.at("content-type") == "application/json");
    const json response = json::parse(reply.body);
    CHECK(response["response"]["uid"] == json::parse(body)["request"]["uid"]);
    const json patched = json::parse(body)["request"]["object"].patch(patch_of(reply));
    CHECK(patched == read_json(fixtures_dir() / "admission" / "user-all" / "expected-object.json"));
  }
  CHECK(webhook.terminate() == 0);
}

TEST_CASE("answers bad requests with the right status and keeps serving") {
  WebhookProcess webhook;
  TlsClient client(webhook.port());
  CHECK(client.request("POST", "/mutate", "{\"apiVersion\":").status == 400);
  CHECK(client.request("POST", "/mutate", "{\"kind\":\"Pod\",\"apiVersion\":\"v1\"}").status == 400);
  const HttpReply wrong_type =
      client.request("POST", "/mutate", read_file(fixtures_dir() / "invalid" / "uid-number.json"));
  CHECK(wrong_type.status == 400);
  CHECK_THAT(wrong_type.body, Catch::Contains("request.uid"));

  const HttpReply get_mutate = client.request("GET", "/mutate");
  CHECK(get_mutate.status == 405);
  CHECK(get_mutate.headers.at("allow") == "POST");
  CHECK(client.request("GET", "/nope").status == 404);

  TlsClient other(webhook.port());
  CHECK(other.request("POST", "/mutate", fixture_review("no-env"), "text/plain").status == 415);

  TlsClient after(webhook.port());
  CHECK(after.request("POST", "/mutate", fixture_review("no-env")).status == 200);
}

TEST_CASE("a body over 4 MiB (--body-limit) gets 413 without being read") {
  WebhookProcess webhook;
  TlsClient client(webhook.port());
  client.write_raw(
      "POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: 4194305\r\n\r\n{");
  const auto [received, closed] = client.read_until_closed(5s);
  CHECK(received.starts_with("HTTP/1.1 413"));
  CHECK(closed);

  // Without a Content-Length the limit applies while reading.
  TlsClient chunked(webhook.port());
  chunked.write_raw(
      "POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n");
  const std::string piece(std::size_t{1024} * 1024, ' ');
  char size_line[32];
  std::snprintf(size_line, sizeof size_line, "%zx\r\n", piece.size());
  bool refused = false;
  for (int i = 0; i < 5 && !refused; ++i) {
    try {
      chunked.write_raw(size_line + piece + "\r\n");
    } catch (const std::exception&) {
      refused = true;  // the server answered and closed while we were still sending
    }
  }
  const auto [chunked_reply, chunked_closed] = chunked.read_until_closed(5s);
  CHECK(chunked_reply.starts_with("HTTP/1.1 413"));
  CHECK(chunked_closed);

  // Exactly at the limit is read and judged on its content.
  TlsClient at_limit(webhook.port());
  std::string padded = fixture_review("no-env");
  padded.append(4194304 - padded.size(), ' ');
  CHECK(at_limit.request("POST", "/mutate", padded).status == 200);
}

// The server sizes its read buffer per request and releases it after the answer; none of that may lose a
// byte, however the body is framed or cut into TLS records.
TEST_CASE("a body is read whole when chunked, cut into small TLS records, or pipelined behind another") {
  WebhookProcess webhook;
  const std::string body = fixture_review("user-all");
  const std::string head =
      "POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n";
  const auto count_answers = [](const std::string& received) {
    std::size_t answers = 0;
    for (std::size_t at = received.find("HTTP/1.1 200"); at != std::string::npos;
         at = received.find("HTTP/1.1 200", at + 1)) {
      ++answers;
    }
    return answers;
  };

  TlsClient chunked(webhook.port());
  chunked.write_raw(head + "Transfer-Encoding: chunked\r\n\r\n");
  for (std::size_t at = 0; at < body.size(); at += 700) {
    const std::string piece = body.substr(at, 700);
    char size_line[32];
    std::snprintf(size_line, sizeof size_line, "%zx\r\n", piece.size());
    chunked.write_raw(size_line + piece + "\r\n");
  }
  chunked.write_raw("0\r\n\r\n");
  const auto [chunked_reply, chunked_closed] = chunked.read_until_closed(5s);
  CHECK(count_answers(chunked_reply) == 1);
  CHECK_THAT(chunked_reply, Catch::Contains("\"patchType\":\"JSONPatch\""));

  TlsClient trickled(webhook.port());
  trickled.write_raw(head + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n");
  for (std::size_t at = 0; at < body.size(); at += 37) trickled.write_raw(body.substr(at, 37));
  const auto [trickled_reply, trickled_closed] = trickled.read_until_closed(5s);
  CHECK(count_answers(trickled_reply) == 1);
  CHECK_THAT(trickled_reply, Catch::Contains("\"patchType\":\"JSONPatch\""));

  TlsClient pipelined(webhook.port());
  const std::string keep_alive_head = "POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  pipelined.write_raw(keep_alive_head + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body + head +
                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  const auto [pipelined_reply, pipelined_closed] = pipelined.read_until_closed(5s);
  CHECK(count_answers(pipelined_reply) == 2);
  CHECK(pipelined_closed);
}

TEST_CASE("a 2.5 MiB pod is reviewed and every container patched") {
  WebhookProcess webhook;
  json review = json::parse(fixture_review("other-env"));
  json& containers = review["request"]["object"]["spec"]["containers"];
  const json base = containers[0];
  std::size_t size = review.dump().size();
  while (size < 2'621'440) {
    json c = base;
    c["name"] = std::string("c").append(std::to_string(containers.size()));
    for (int e = 0; e < 40; ++e)
      c["env"].push_back({{"name", std::string("VAR_").append(std::to_string(e))}, {"value", std::string(40, 'v')}});
    size += c.dump().size() + 1;
    containers.push_back(std::move(c));
  }
  REQUIRE(review.dump().size() >= 2'621'440);
  TlsClient client(webhook.port());
  const HttpReply reply = client.request("POST", "/mutate", review.dump());
  REQUIRE(reply.status == 200);
  const json patched = review["request"]["object"].patch(patch_of(reply));
  for (const auto& c : patched["spec"]["containers"]) {
    CHECK(c["env"].back() == json({{"name", "NVIDIA_VISIBLE_DEVICES"}, {"value", "none"}}));
  }
}

TEST_CASE("TLS: 1.2 and 1.3 only, ALPN http/1.1 only") {
  WebhookProcess webhook;
  {
    TlsClient tls12(webhook.port(), {.max_version = TLS1_2_VERSION});
    CHECK(tls12.negotiated_version() == "TLSv1.2");
    CHECK(tls12.request("GET", "/healthz").status == 200);
  }
  {
    TlsClient tls13(webhook.port(), {.min_version = TLS1_3_VERSION});
    CHECK(tls13.negotiated_version() == "TLSv1.3");
  }
  CHECK_THROWS(TlsClient(webhook.port(), {.max_version = TLS1_1_VERSION}));
  CHECK_THROWS(TlsClient(webhook.port(), {.alpn = {"h2"}}));
  TlsClient no_alpn(webhook.port(), {.alpn = {}});
  CHECK(no_alpn.negotiated_alpn().empty());
  CHECK(no_alpn.request("GET", "/healthz").status == 200);
}

TEST_CASE("slow clients neither stall others nor hold a connection past the deadline") {
  WebhookProcess webhook;
  TlsClient slow(webhook.port());
  slow.write_raw(
      "POST /mutate?timeout=1s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: 1000\r\n\r\n{\"apiVersion\"");
  TlsClient idle_handshake_done(webhook.port());  // connected and silent

  const auto started = std::chrono::steady_clock::now();
  TlsClient fast(webhook.port());
  CHECK(fast.request("POST", "/mutate", fixture_review("no-env")).status == 200);
  CHECK(std::chrono::steady_clock::now() - started < 2s);

  // The body never completes: the ?timeout=1s deadline closes the connection.
  const auto [received, closed] = slow.read_until_closed(5s);
  CHECK(closed);
  CHECK(received.empty());
}

TEST_CASE("review subcommand: a bare Pod goes through the same path as the server") {
  const auto pod_file = std::filesystem::temp_directory_path() / "gpuguard-review-pod.json";
  std::ofstream(pod_file) << json::parse(fixture_review("user-all"))["request"]["object"].dump();
  const ExitResult result = run_webhook("review - < " + pod_file.string() + " 2>/dev/null");
  std::filesystem::remove(pod_file);
  REQUIRE(result.status == 0);
  const json printed = json::parse(result.output);
  CHECK(printed["review"]["response"]["uid"] == "00000000-0000-0000-0000-000000000000");
  CHECK(printed["review"]["response"]["allowed"] == true);
  const json pod = json::parse(fixture_review("user-all"))["request"]["object"];
  CHECK(pod.patch(printed["patch"]) == read_json(fixtures_dir() / "admission" / "user-all" / "expected-object.json"));
}

TEST_CASE("a pod annotated gpuguard.io/arm-probe is told which webhook answered it (--instance), and no other pod") {
  WebhookProcess webhook(
      {"--instance", "gpuguard-system/gpuguard-webhook", "--replica", "gpuguard-webhook-5d8f9c7b6-x2x9q"});
  json probe = json::parse(fixture_review("user-all"));
  probe["request"]["object"]["metadata"]["annotations"]["gpuguard.io/arm-probe"] = "true";
  // The warnings, and whether the connection is closed after the answer (the arm hook's is, so that the API
  // server's next call may go to another replica), over one connection each.
  const auto answer_to = [&webhook](const json& review) {
    TlsClient client(webhook.port());
    const HttpReply reply = client.request("POST", "/mutate", review.dump());
    REQUIRE(reply.status == 200);
    const auto connection = reply.headers.find("connection");
    const bool said_close = connection != reply.headers.end() && connection->second == "close";
    // Closed indeed: the end of the stream follows, or (kept) nothing does within a second.
    const auto [after, closed] = client.read_until_closed(said_close ? 5s : 1s);
    CHECK(after.empty());
    CHECK(closed == said_close);
    return std::make_pair(json::parse(reply.body)["response"].value("warnings", json::array()), said_close);
  };
  const json named =
      "arm probe answered by gpuguard webhook gpuguard-system/gpuguard-webhook replica "
      "gpuguard-webhook-5d8f9c7b6-x2x9q";
  const auto [probed, probe_closed] = answer_to(probe);
  CHECK(std::count(probed.begin(), probed.end(), named) == 1);
  CHECK(probed.size() >= 2);  // and the webhook's own warning that it replaced the value
  CHECK(probe_closed);
  const auto [plain, plain_closed] = answer_to(json::parse(fixture_review("user-all")));
  CHECK(std::count(plain.begin(), plain.end(), named) == 0);
  CHECK_FALSE(plain_closed);
  CHECK(webhook.terminate() == 0);
  for (const char* bad :
       {"Upper", "pod_name", "a-pod-name-longer-than-any-the-api-server-generates-for-a-deployment"}) {
    INFO(bad);
    const ExitResult refused =
        run_webhook(std::string("--instance gpuguard-system/gpuguard-webhook --replica '") + bad +
                    "' --tls-cert-file " + certs_dir() + "/tls.crt --tls-private-key-file " + certs_dir() + "/tls.key");
    CHECK(refused.status == 2);
    CHECK_THAT(refused.output, Catch::Contains("must be a pod's name"));
  }
  const ExitResult alone = run_webhook("--replica gpuguard-webhook-0 --tls-cert-file " + certs_dir() +
                                       "/tls.crt --tls-private-key-file " + certs_dir() + "/tls.key");
  CHECK(alone.status == 2);
  CHECK_THAT(alone.output, Catch::Contains("with --instance"));
  for (const char* bad :
       {"gpuguard-webhook", "/gpuguard-webhook", "gpuguard-system/", "a/b/c", "GPU/guard", "ns/name\"quoted",
        "gpuguard-system/gpuguard-webhook-a-name-longer-than-the-chart-ever-gives-it-0123", "-system/gpuguard",
        "gpu.system/gpuguard", "gpuguard-system/-webhook", "gpuguard-system/gpuguard..webhook"}) {
    INFO(bad);
    const ExitResult refused = run_webhook(std::string("--instance '") + bad + "' --tls-cert-file " + certs_dir() +
                                           "/tls.crt --tls-private-key-file " + certs_dir() + "/tls.key");
    CHECK(refused.status == 2);
    CHECK_THAT(refused.output, Catch::Contains("is not NAMESPACE/DEPLOYMENT"));
  }
}

TEST_CASE("every command and subcommand answers --help with its usage and exit 0, and a bad flag with exit 2") {
  for (const std::string command : {"", "review", "audit", "audit-controller", "arm"}) {
    const std::string program = command.empty() ? "gpuguard-webhook" : "gpuguard-webhook " + command;
    INFO(program);
    const ExitResult help = run_webhook(command + " --help");
    CHECK(help.status == 0);
    CHECK_THAT(help.output, Catch::Contains(program));
    CHECK(run_webhook(command + " --no-such-flag").status == 2);
  }
}

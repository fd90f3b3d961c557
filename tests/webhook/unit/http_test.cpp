#include <catch2/catch.hpp>

#include "gpuguard/server/http.hpp"
#include "gpuguard/webhook/webhook_handler.hpp"

using namespace gpuguard;
using namespace std::chrono_literals;

TEST_CASE("?timeout= is read as the apiserver writes it") {
  CHECK(server::timeout_parameter("timeout=10s") == 10s);
  CHECK(server::timeout_parameter("a=b&timeout=500ms") == 500ms);
  CHECK(server::timeout_parameter("timeout=1.5s") == 1500ms);
  CHECK(server::timeout_parameter("timeout=1m") == 60s);
  CHECK_FALSE(server::timeout_parameter("").has_value());
  CHECK_FALSE(server::timeout_parameter("timeout=").has_value());
  CHECK_FALSE(server::timeout_parameter("timeout=10").has_value());
  CHECK_FALSE(server::timeout_parameter("timeout=-1s").has_value());
  CHECK_FALSE(server::timeout_parameter("timeout=10h").has_value());
  CHECK_FALSE(server::timeout_parameter("mytimeout=10s").has_value());
}

TEST_CASE("JSON content types") {
  CHECK(server::is_json_content_type("application/json"));
  CHECK(server::is_json_content_type("Application/JSON; charset=utf-8"));
  CHECK_FALSE(server::is_json_content_type("application/jsonp"));
  CHECK_FALSE(server::is_json_content_type("text/plain"));
  CHECK_FALSE(server::is_json_content_type(""));
}

namespace {
policy::PolicyProvider default_policy() {
  auto policy = std::make_shared<const policy::Policy>();
  return [policy] { return policy; };
}
}  // namespace

TEST_CASE("webhook routes: status codes decided from the headers alone") {
  webhook::WebhookMetrics metrics("test");
  webhook::WebhookHandler handler(default_policy(), metrics);
  auto early = [&](std::string_view method, std::string_view path, std::string_view type = "application/json",
                   bool body = false) {
    server::RequestHead head;
    head.method = method;
    head.path = path;
    head.content_type = type;
    head.body = body;
    const auto response = handler.reject_early(head);
    return response ? response->status : 0u;
  };
  CHECK(early("POST", "/mutate") == 0);
  CHECK(early("GET", "/mutate") == 405);
  CHECK(early("POST", "/mutate", "text/plain") == 415);
  CHECK(early("POST", "/mutate", "") == 415);
  CHECK(early("GET", "/healthz") == 0);
  CHECK(early("GET", "/healthz", "", true) == 400);  // a body would hold the connection until it came
  CHECK(early("GET", "/metrics", "", true) == 400);
  CHECK(early("POST", "/mutate", "application/json", true) == 0);
  CHECK(early("POST", "/readyz") == 405);
  CHECK(early("GET", "/metrics") == 0);
  CHECK(early("DELETE", "/metrics") == 405);
  CHECK(early("GET", "/mutate/extra") == 404);
  CHECK(early("GET", "/") == 404);
}

TEST_CASE("webhook routes: readiness follows set_ready, bad reviews are 400 and counted") {
  webhook::WebhookMetrics metrics("test");
  webhook::WebhookHandler handler(default_policy(), metrics);
  server::RequestHead ready;
  ready.method = "GET";
  ready.path = "/readyz";
  CHECK(handler.handle(ready, "").status == 503);
  handler.set_ready(true);
  CHECK(handler.handle(ready, "").status == 200);

  server::RequestHead mutate;
  mutate.method = "POST";
  mutate.path = "/mutate";
  const auto response = handler.handle(mutate, "{\"kind\":\"AdmissionReview\"}");
  CHECK(response.status == 400);
  CHECK_THAT(response.body, Catch::Contains("apiVersion"));
  CHECK_THAT(metrics.render(),
             Catch::Contains("gpuguard_admission_requests_total{operation=\"unknown\",result=\"invalid\"} 1"));
}

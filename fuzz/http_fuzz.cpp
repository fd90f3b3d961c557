// libFuzzer target: raw bytes as an HTTP/1.1 request, read by the server's own request-head code with
// the limits of its default ServerOptions, then routed through the webhook's handler exactly as the
// server does (headers first, body only when they pass). Asserts that every answer has a status the
// server may send.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "gpuguard/webhook/webhook_handler.hpp"
#include "server/request_head.hpp"

using namespace gpuguard;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static webhook::WebhookMetrics metrics("fuzz");
  static const auto policy = std::make_shared<const policy::Policy>();
  static webhook::WebhookHandler handler([] { return policy; }, metrics);
  static const server::ServerOptions options;
  static const std::set<unsigned> kStatuses = {200, 400, 404, 405, 413, 415, 503};

  server::RequestParser parser;
  server::apply_limits(parser, options);
  parser.eager(true);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(data, size), ec);
  if (ec || !parser.is_header_done()) return 0;

  const server::RequestHead head = server::request_head(parser);
  (void)server::timeout_parameter(head.query);
  unsigned status = 0;
  if (auto early = handler.reject_early(head)) {
    status = early->status;
  } else if (parser.is_done()) {
    status = handler.handle(head, std::move(parser.get().body())).status;
  } else {
    return 0;  // the body is incomplete: the server would wait for the rest, under its deadline
  }
  if (!kStatuses.count(status)) {
    std::fprintf(stderr, "unexpected status %u\n", status);
    std::abort();
  }
  return 0;
}

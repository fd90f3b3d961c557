// libFuzzer target: raw bytes as an HTTP/1.1 request, parsed by Beast's request parser with the
// server's limits, then routed through the webhook's handler exactly as the server does (headers first,
// body only when they pass). Asserts that every answer has a status the server may send.
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "gpuguard/metrics/registry.hpp"
#include "gpuguard/webhook/webhook_handler.hpp"

namespace http = boost::beast::http;
using namespace gpuguard;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static metrics::Registry registry("fuzz");
  static const auto policy = std::make_shared<const admission::Policy>();
  static webhook::WebhookHandler handler([] { return policy; }, registry);
  static const std::set<unsigned> kStatuses = {200, 400, 404, 405, 413, 415, 503};

  http::request_parser<http::string_body> parser;
  parser.header_limit(16 * 1024);
  parser.body_limit(7 * 1024 * 1024);
  parser.eager(true);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(data, size), ec);
  if (ec || !parser.is_header_done()) return 0;

  auto& request = parser.get();
  const std::string_view target = request.target();
  const std::size_t question = target.find('?');
  server::RequestHead head;
  head.method = request.method_string();
  head.path = target.substr(0, question);
  head.query = question == std::string_view::npos ? std::string_view{} : target.substr(question + 1);
  head.content_type = request[http::field::content_type];
  (void)server::timeout_parameter(head.query);

  unsigned status = 0;
  if (auto early = handler.reject_early(head)) {
    status = early->status;
  } else if (parser.is_done()) {
    status = handler.handle(head, std::move(request.body())).status;
  } else {
    return 0;  // the body is incomplete: the server would wait for the rest, under its deadline
  }
  if (!kStatuses.count(status)) {
    std::fprintf(stderr, "unexpected status %u\n", status);
    std::abort();
  }
  return 0;
}

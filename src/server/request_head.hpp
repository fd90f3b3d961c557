#pragma once
// How the server reads a request's head with Beast: the parser's limits from ServerOptions, and the
// RequestHead a Handler sees. A private header, so that the HTTP fuzzer runs exactly this code.
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <string_view>

#include "gpuguard/server/http.hpp"
#include "gpuguard/server/http_server.hpp"

namespace gpuguard::server {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

inline void apply_limits(RequestParser& parser, const ServerOptions& options) {
  parser.header_limit(static_cast<std::uint32_t>(options.header_limit));
  parser.body_limit(options.body_limit);
}

// The head of the request whose headers `parser` has read; its views point into the parser's message.
inline RequestHead request_head(RequestParser& parser) {
  auto& request = parser.get();
  const std::string_view target = request.target();
  const std::size_t question = target.find('?');
  RequestHead head;
  head.method = request.method_string();
  head.path = target.substr(0, question);
  head.query = question == std::string_view::npos ? std::string_view{} : target.substr(question + 1);
  head.content_type = request[boost::beast::http::field::content_type];
  if (auto length = parser.content_length()) head.content_length = *length;
  head.body = !parser.is_done();
  return head;
}

}  // namespace gpuguard::server

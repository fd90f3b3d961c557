// The transport half of list-and-watch, and of the one-shot requests (a Node status PATCH); the second
// translation unit that instantiates Beast (its HTTP client side), after src/server.
#include "api_client.hpp"

#include <openssl/ssl.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include <cstdlib>
#include <optional>
#include <stdexcept>

#include <simdjson.h>

#include "gpuguard/files/read_file.hpp"
#include "gpuguard/kube/json_object_splitter.hpp"
#include "gpuguard/log/log.hpp"

namespace gpuguard::kube {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
namespace od = simdjson::ondemand;
using Stream = beast::ssl_stream<beast::tcp_stream>;

constexpr auto kNoThrow = asio::as_tuple(asio::use_awaitable);
static_assert(kJsonPadding >= simdjson::SIMDJSON_PADDING);
// A page of 500 pods is a few MB; an apiserver that ignores `limit` may send the whole collection.
constexpr std::uint64_t kListBodyLimit = 1ULL << 30;
// A Node, as a PATCH returns it, is tens of KB.
constexpr std::uint64_t kReplyBodyLimit = 1ULL << 20;
constexpr std::size_t kMaxWarnings = 16;

bool is_ip_address(const std::string& host) {
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

// Room after the text for simdjson to read past its end; the view stays valid while `text` is untouched.
simdjson::padded_string_view padded(std::string& text) {
  text.reserve(text.size() + kJsonPadding);
  return simdjson::padded_string_view(text.data(), text.size(), text.capacity());
}

// A padded view of text that lies inside a padded buffer, such as one object of a page or an event.
simdjson::padded_string_view padded_inside(std::string_view text) {
  return simdjson::padded_string_view(text.data(), text.size(), text.size() + kJsonPadding);
}

struct Status {
  std::int64_t code = 0;
  std::string message;
};

// A Kubernetes Status object's code and message; empty when the text is not one.
Status status_of(od::parser& parser, simdjson::padded_string_view text) {
  Status status;
  od::document document;
  od::object object;
  if (parser.iterate(text).get(document) || document.get_object().get(object)) return status;
  for (auto field : object) {
    std::string_view key, message;
    if (field.unescaped_key().get(key)) break;
    if (key == "code") {
      if (field.value().get_int64().get(status.code)) status.code = 0;
    } else if (key == "message" && !field.value().get_string().get(message)) {
      status.message = message;
    }
  }
  return status;
}

// The message of a Kubernetes Status body, or the start of whatever else came back.
std::string status_message(od::parser& parser, std::string& body) {
  std::string message = status_of(parser, padded(body)).message;
  return message.empty() ? body.substr(0, 200) : message;
}

std::string resource_version_of(od::parser& parser, std::string_view object) {
  od::document document;
  std::string_view version;
  if (parser.iterate(padded_inside(object)).get(document) ||
      document["metadata"]["resourceVersion"].get_string().get(version)) {
    return {};
  }
  return std::string(version);
}

struct Page {
  std::string version, continue_token;
  std::size_t items = 0;
};

// Walks a list page once, handing each item's text to the store as it is reached: no DOM of the page.
std::optional<std::string> read_page(od::parser& parser, std::string& body, Store& store, Page& page) {
  const std::string not_a_list = "the list response is not a Kubernetes list";
  od::document document;
  od::object root;
  if (parser.iterate(padded(body)).get(document) || document.get_object().get(root)) return not_a_list;
  bool has_items = false;
  for (auto field : root) {
    std::string_view key;
    od::value value;
    if (field.unescaped_key().get(key) || field.value().get(value)) return not_a_list;
    if (key == "metadata") {
      od::object metadata;
      if (value.get_object().get(metadata)) return not_a_list;
      for (auto entry : metadata) {
        std::string_view name, text;
        if (entry.unescaped_key().get(name)) return not_a_list;
        if (name == "resourceVersion" && !entry.value().get_string().get(text)) page.version = text;
        if (name == "continue" && !entry.value().get_string().get(text)) page.continue_token = text;
      }
    } else if (key == "items") {
      od::json_type type;
      if (value.type().get(type)) return not_a_list;
      has_items = true;
      if (type == od::json_type::null) continue;
      od::array items;
      if (value.get_array().get(items)) return not_a_list;
      for (auto item : items) {
        od::object object;
        std::string_view text;
        if (item.get_object().get(object) || object.raw_json().get(text)) return "a listed item is not an object";
        store.list_item(text);
        ++page.items;
      }
    }
  }
  if (!has_items) return not_a_list;
  return std::nullopt;
}

// One event of a watch stream, applied to the resource's store (`event` is the room it is copied into, for
// simdjson's padding). How the watch ends, when this event ends it, with `error` saying why it failed.
std::optional<WatchEnd> apply_watch_event(od::parser& json, std::string_view text, std::string& event,
                                          WatchedResource& resource, std::string& version, std::string& error) {
  event.assign(text);
  std::string type;
  std::string_view object;
  od::document document;
  od::object fields;
  if (!json.iterate(padded(event)).get(document) && !document.get_object().get(fields)) {
    for (auto field : fields) {
      std::string_view key, value;
      od::object inner;
      if (field.unescaped_key().get(key)) break;
      if (key == "type" && !field.value().get_string().get(value)) type = value;
      if (key == "object" && !field.value().get_object().get(inner) && inner.raw_json().get(object)) object = {};
    }
  }
  if (type.empty() || object.empty()) {
    error = "malformed watch event";
    return WatchEnd::failed;
  }
  if (type == "ERROR") {
    const Status error_status = status_of(json, padded_inside(object));
    if (error_status.code == 410) return WatchEnd::gone;
    error = "watch error event: " +
            (error_status.message.empty() ? std::string(object.substr(0, 200)) : error_status.message);
    return WatchEnd::failed;
  }
  if (type == "ADDED" || type == "MODIFIED" || type == "DELETED") resource.store->apply(type, object);
  if (type == "ADDED" || type == "MODIFIED" || type == "DELETED" || type == "BOOKMARK") {
    if (auto v = resource_version_of(json, object); !v.empty()) version = std::move(v);
  }
  return std::nullopt;
}

}  // namespace

// The stream's TLS context lives as long as the stream.
struct Connection {
  Connection(asio::io_context& ioc, ssl::context c) : context(std::move(c)), stream(ioc, context) {}
  ssl::context context;
  Stream stream;
};

ApiClient::ApiClient(asio::io_context& ioc, ApiServer server, const InformerOptions& options)
    : ioc_(ioc), server_(std::move(server)), options_(options) {}

std::optional<std::string> ApiClient::bearer_token(std::string& error) const {
  if (server_.token_file.empty()) return std::string{};
  auto token = files::read_file(server_.token_file);
  if (!token) {
    error = "cannot read token file " + server_.token_file.string();
    return std::nullopt;
  }
  while (!token->empty() && std::isspace(static_cast<unsigned char>(token->back()))) token->pop_back();
  return token;
}

std::string ApiClient::target(const WatchedResource& resource, std::string query) const {
  if (!resource.field_selector.empty()) query += "&fieldSelector=" + percent_encode(resource.field_selector);
  if (!resource.label_selector.empty()) query += "&labelSelector=" + percent_encode(resource.label_selector);
  return server_.path_prefix + resource.path + "?" + query;
}

asio::awaitable<std::unique_ptr<Connection>> ApiClient::connect(std::string& error) {
  // A fresh context per connection, so that a rotated CA file is picked up.
  ssl::context context(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_2_VERSION);
  context.set_verify_mode(ssl::verify_peer);
  boost::system::error_code ec;
  if (server_.ca_file.empty()) {
    context.set_default_verify_paths(ec);
  } else if (auto ca = files::read_file(server_.ca_file)) {
    context.add_certificate_authority(asio::buffer(*ca), ec);
  } else {
    error = "cannot read CA file " + server_.ca_file.string();
    co_return nullptr;
  }
  if (ec) {
    error = "cannot use CA file " + server_.ca_file.string() + ": " + ec.message();
    co_return nullptr;
  }

  tcp::resolver resolver(ioc_);
  auto [resolve_error, endpoints] = co_await resolver.async_resolve(server_.host, server_.port, kNoThrow);
  if (resolve_error) {
    error = "cannot resolve " + server_.host + ": " + resolve_error.message();
    co_return nullptr;
  }
  auto connection = std::make_unique<Connection>(ioc_, std::move(context));
  Stream& stream = connection->stream;
  const std::string& verified = server_.verify_name.empty() ? server_.host : server_.verify_name;
  if (!is_ip_address(verified)) SSL_set_tlsext_host_name(stream.native_handle(), verified.c_str());
  stream.set_verify_callback(ssl::host_name_verification(verified));
  auto& transport = beast::get_lowest_layer(stream);
  transport.expires_after(options_.connect_timeout);
  if (auto [e, endpoint] = co_await transport.async_connect(endpoints, kNoThrow); e) {
    error = "cannot connect to " + server_.url() + ": " + e.message();
    co_return nullptr;
  }
  if (auto [e] = co_await stream.async_handshake(ssl::stream_base::client, kNoThrow); e) {
    error = "TLS handshake with " + server_.url() + " failed: " + e.message();
    co_return nullptr;
  }
  co_return connection;
}

template <typename Message>
bool ApiClient::authorize(Message& request, std::string& error) const {
  const auto token = bearer_token(error);
  if (!token) return false;
  request.set(http::field::host, bracketed(server_.host) + ":" + server_.port);
  request.set(http::field::accept, "application/json");
  request.set(http::field::user_agent, options_.user_agent);
  if (!token->empty()) request.set(http::field::authorization, "Bearer " + *token);
  return true;
}

template <typename Stream>
asio::awaitable<bool> ApiClient::send_get(Stream& stream, const std::string& target, std::string& error) {
  http::request<http::empty_body> request{http::verb::get, target, 11};
  if (!authorize(request, error)) co_return false;
  if (auto [e, n] = co_await http::async_write(stream, request, kNoThrow); e) {
    error = "sending the request failed: " + e.message();
    co_return false;
  }
  co_return true;
}

// What one request on a connection came to: the reply, whether the connection turned out closed before
// any of an answer came (the server closed it while it was idle), and whether it can carry another.
struct ApiClient::Exchange {
  Reply reply;
  bool found_closed = false;
  bool reusable = false;
};

namespace {

// The errors of a connection the peer has closed, as a write or a read meets them.
bool is_closed(const boost::system::error_code& e) {
  return e == asio::error::eof || e == asio::error::connection_reset || e == asio::error::broken_pipe ||
         e == http::error::end_of_stream || e == ssl::error::stream_truncated;
}

}  // namespace

asio::awaitable<ApiClient::Exchange> ApiClient::exchange(Connection& connection, const Request& r,
                                                         std::chrono::milliseconds timeout) {
  Exchange out;
  Reply& reply = out.reply;
  Stream& stream = connection.stream;
  beast::get_lowest_layer(stream).expires_after(timeout);
  http::request<http::string_body> request{http::string_to_verb(r.method), server_.path_prefix + r.path, 11};
  if (!authorize(request, reply.error)) co_return out;
  if (!r.content_type.empty()) request.set(http::field::content_type, r.content_type);
  if (!r.accept.empty()) request.set(http::field::accept, r.accept);
  request.body() = r.body;
  request.prepare_payload();
  if (auto [e, n] = co_await http::async_write(stream, request, kNoThrow); e) {
    reply.error = "sending the request failed: " + e.message();
    out.found_closed = is_closed(e);
    co_return out;
  }
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kReplyBodyLimit);
  auto [e, n] = co_await http::async_read(stream, buffer, parser, kNoThrow);
  if (e) {
    out.found_closed = !parser.got_some() && is_closed(e);
    reply.error = "reading the answer failed: " + e.message();
    co_return out;
  }
  reply.status = parser.get().result_int();
  reply.body = std::move(parser.get().body());
  // The head is bounded by the parser (8 KiB), and so are the warnings it can hold.
  for (const auto& field : parser.get()) {
    if (beast::iequals(field.name_string(), "Warning") && reply.warnings.size() < kMaxWarnings) {
      reply.warnings.emplace_back(field.value());
    }
  }
  if (reply.status < 200 || reply.status >= 300) {
    std::string copy = reply.body;
    reply.error = "HTTP " + std::to_string(reply.status) + ": " + status_message(json_, copy);
  }
  // Whatever came after the answer is not an answer to anything: such a connection is not used again.
  out.reusable = parser.get().keep_alive() && buffer.size() == 0;
  // An idle kept connection must not time out: the next request sets its own time.
  beast::get_lowest_layer(stream).expires_never();
  co_return out;
}

asio::awaitable<Reply> ApiClient::send(const Request& r, std::chrono::milliseconds timeout) {
  Reply reply;
  if (http::string_to_verb(r.method) == http::verb::unknown) {
    reply.error = "unknown HTTP method " + r.method;
    co_return reply;
  }
  auto connection = co_await connect(reply.error);
  if (!connection) co_return reply;
  Exchange done = co_await exchange(*connection, r, timeout);
  Stream& stream = connection->stream;
  beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(2));
  co_await stream.async_shutdown(kNoThrow);
  co_return std::move(done.reply);
}

asio::awaitable<Reply> ApiClient::send_kept(const Request& r, std::chrono::milliseconds timeout,
                                            std::unique_ptr<Connection>& kept) {
  if (http::string_to_verb(r.method) == http::verb::unknown) {
    Reply reply;
    reply.error = "unknown HTTP method " + r.method;
    co_return reply;
  }
  for (bool retried = false;; retried = true) {
    const bool reused = kept != nullptr;
    if (!reused) {
      Reply reply;
      kept = co_await connect(reply.error);
      if (!kept) co_return reply;
    }
    Exchange done = co_await exchange(*kept, r, timeout);
    if (done.reply.status == 0 || !done.reusable) kept.reset();
    // The server closed a kept connection while it was idle: the request was never read.
    if (done.found_closed && reused && !retried) continue;
    co_return std::move(done.reply);
  }
}

struct RequestSession::Impl {
  explicit Impl(ApiServer server) : client(ioc, std::move(server), options) {}
  asio::io_context ioc;
  InformerOptions options;
  ApiClient client;
  std::unique_ptr<Connection> kept;
};

RequestSession::RequestSession(ApiServer server) : impl_(std::make_unique<Impl>(std::move(server))) {}

RequestSession::~RequestSession() = default;

Reply RequestSession::send(const Request& request, std::chrono::milliseconds timeout) {
  Impl& i = *impl_;
  i.options.connect_timeout = timeout;
  i.options.user_agent = request.user_agent;
  Reply reply;
  asio::co_spawn(
      i.ioc, [&]() -> asio::awaitable<void> { reply = co_await i.client.send_kept(request, timeout, i.kept); },
      [](const std::exception_ptr& e) {
        if (e) std::rethrow_exception(e);
      });
  i.ioc.restart();
  i.ioc.run();
  return reply;
}

std::string percent_encode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

Reply send_request(const ApiServer& server, const Request& request, std::chrono::milliseconds timeout) {
  asio::io_context ioc;
  InformerOptions options;
  options.connect_timeout = timeout;
  options.user_agent = request.user_agent;
  ApiClient client(ioc, server, options);
  Reply reply;
  asio::co_spawn(
      ioc, [&]() -> asio::awaitable<void> { reply = co_await client.send(request, timeout); },
      [](const std::exception_ptr& e) {
        if (e) std::rethrow_exception(e);
      });
  ioc.run();
  return reply;
}

// Every page of the collection into the store; returns its resourceVersion, or nullopt after logging why
// it failed.
asio::awaitable<std::optional<std::string>> ApiClient::list(WatchedResource& resource) {
  Store& store = *resource.store;
  std::string error;
  auto connection = co_await connect(error);
  store.list_begin();
  Page page;
  std::size_t items = 0;
  while (connection) {
    Stream& stream = connection->stream;
    std::string query = "limit=" + std::to_string(options_.page_size);
    if (!page.continue_token.empty()) query += "&continue=" + percent_encode(page.continue_token);
    beast::get_lowest_layer(stream).expires_after(options_.list_page_timeout);
    if (!co_await send_get(stream, target(resource, query), error)) break;
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(kListBodyLimit);
    if (auto [e, n] = co_await http::async_read(stream, buffer, parser, kNoThrow); e) {
      error = "reading the list failed: " + e.message();
      break;
    }
    auto& response = parser.get();
    if (response.result_int() == 410 && !page.continue_token.empty()) {
      // The continue token expired between pages: start over.
      store.list_end(false);
      store.list_begin();
      page = {};
      items = 0;
      continue;
    }
    if (response.result_int() != 200) {
      error = "HTTP " + std::to_string(response.result_int()) + ": " + status_message(json_, response.body());
      break;
    }
    page.continue_token.clear();
    page.items = 0;
    if (auto failure = read_page(json_, response.body(), store, page)) {
      error = std::move(*failure);
      break;
    }
    items += page.items;
    if (!page.continue_token.empty()) {
      if (!response.keep_alive()) connection = co_await connect(error);
      continue;
    }
    store.list_end(true);
    log::info("listed", {{"resource", resource.name}, {"items", items}, {"resource_version", page.version}});
    co_return page.version;
  }
  store.list_end(false);
  log::warn("list failed", {{"resource", resource.name}, {"apiserver", server_.url()}, {"reason", error}});
  co_return std::nullopt;
}

asio::awaitable<WatchEnd> ApiClient::watch(WatchedResource& resource, std::string& version,
                                           std::chrono::milliseconds timeout) {
  std::string error;
  auto connection = co_await connect(error);
  const auto seconds = std::max<long long>(1, std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
  const std::string query = "watch=1&allowWatchBookmarks=true&resourceVersion=" + percent_encode(version) +
                            "&timeoutSeconds=" + std::to_string(seconds);
  // One deadline for the whole watch: the apiserver ends it after `seconds`, a silent peer is dropped.
  if (connection) beast::get_lowest_layer(connection->stream).expires_after(std::chrono::seconds(seconds + 30));
  if (!connection || !co_await send_get(connection->stream, target(resource, query), error)) {
    log::warn("watch failed", {{"resource", resource.name}, {"apiserver", server_.url()}, {"reason", error}});
    co_return WatchEnd::failed;
  }
  Stream& stream = connection->stream;
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);  // a stream, not a document
  if (auto [e, n] = co_await http::async_read_header(stream, buffer, parser, kNoThrow); e) {
    log::warn("watch failed", {{"resource", resource.name}, {"reason", "reading the response: " + e.message()}});
    co_return WatchEnd::failed;
  }
  const unsigned status = parser.get().result_int();
  if (status == 410) co_return WatchEnd::gone;

  JsonObjectSplitter splitter;
  std::string body;  // of an error response only
  std::optional<WatchEnd> end;
  std::string event;  // each event copied out of the stream with room after it for simdjson
  auto on_event = [&](std::string_view text) {
    if (!end) end = apply_watch_event(json_, text, event, resource, version, error);
  };
  char chunk[64 * 1024];
  while (!parser.is_done() && !end) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    // read_some: hand over each event as it arrives instead of waiting for the buffer to fill.
    auto [e, n] = co_await http::async_read_some(stream, buffer, parser, kNoThrow);
    if (e && e != http::error::need_buffer) {
      error = "the watch stream broke: " + e.message();
      end = WatchEnd::failed;
      break;
    }
    const std::string_view received(chunk, sizeof chunk - parser.get().body().size);
    if (status != 200) {
      if (body.size() < 4096) body.append(received);
    } else if (!splitter.feed(received, on_event)) {
      error = "the watch stream is not a sequence of JSON objects";
      end = WatchEnd::failed;
    }
  }
  if (status != 200) {
    error = "HTTP " + std::to_string(status) + ": " + status_message(json_, body);
    end = WatchEnd::failed;
  }
  if (end == WatchEnd::failed) {
    log::warn("watch failed", {{"resource", resource.name}, {"apiserver", server_.url()}, {"reason", error}});
  }
  beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(2));
  co_await stream.async_shutdown(kNoThrow);
  co_return end.value_or(WatchEnd::closed);
}

}  // namespace gpuguard::kube

// The second translation unit that instantiates Beast (its HTTP client side), after src/server.
#include "gpuguard/kube/informer.hpp"

#include <openssl/ssl.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/steady_timer.hpp>
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
#include <random>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "gpuguard/kube/json_object_splitter.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/watch/poller.hpp"

namespace gpuguard::kube {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using nlohmann::json;
using Stream = beast::ssl_stream<beast::tcp_stream>;

// The stream's TLS context lives as long as the stream.
struct Connection {
  Connection(asio::io_context& ioc, ssl::context c) : context(std::move(c)), stream(ioc, context) {}
  ssl::context context;
  Stream stream;
};

constexpr auto nothrow = asio::as_tuple(asio::use_awaitable);
// A page of 500 pods is a few MB; an apiserver that ignores `limit` may send the whole collection.
constexpr std::uint64_t kListBodyLimit = 1ULL << 30;

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

// An IPv6 address in a URL or Host header goes in brackets.
std::string bracketed(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

bool is_ip_address(const std::string& host) {
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

// The message of a Kubernetes Status body, or the start of whatever else came back.
std::string status_message(const std::string& body) {
  const json status = json::parse(body, nullptr, false);
  if (status.is_object() && status.contains("message") && status["message"].is_string()) {
    return status["message"].get<std::string>();
  }
  return body.substr(0, 200);
}

std::string resource_version_of(const json& object) {
  const auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return {};
  const auto version = metadata->find("resourceVersion");
  return version != metadata->end() && version->is_string() ? version->get<std::string>() : std::string{};
}

enum class WatchEnd { closed, gone, failed };

}  // namespace

ApiServer ApiServer::from_url(std::string_view url) {
  constexpr std::string_view kScheme = "https://";
  if (!url.starts_with(kScheme)) throw std::invalid_argument("apiserver URL '" + std::string(url) + "' must start with https://");
  std::string_view rest = url.substr(kScheme.size());
  ApiServer server;
  const std::size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    server.path_prefix = std::string(rest.substr(slash));
    while (!server.path_prefix.empty() && server.path_prefix.back() == '/') server.path_prefix.pop_back();
    rest = rest.substr(0, slash);
  }
  std::string_view host = rest;
  if (rest.starts_with('[')) {
    const std::size_t close = rest.find(']');
    if (close == std::string_view::npos) throw std::invalid_argument("apiserver URL '" + std::string(url) + "' has an unclosed [");
    host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && !rest.starts_with(':')) throw std::invalid_argument("apiserver URL '" + std::string(url) + "' is malformed after ]");
    if (!rest.empty()) server.port = std::string(rest.substr(1));
  } else if (const std::size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    server.port = std::string(rest.substr(colon + 1));
  }
  server.host = std::string(host);
  if (server.host.empty()) throw std::invalid_argument("apiserver URL '" + std::string(url) + "' has no host");
  const bool numeric_port = !server.port.empty() && server.port.size() <= 5 &&
                            server.port.find_first_not_of("0123456789") == std::string::npos &&
                            std::stoul(server.port) > 0 && std::stoul(server.port) <= 65535;
  if (!numeric_port) throw std::invalid_argument("apiserver URL '" + std::string(url) + "' has an invalid port");
  return server;
}

ApiServer ApiServer::in_cluster() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0') {
    throw std::runtime_error("KUBERNETES_SERVICE_HOST/PORT are not set (not running in a pod); pass --apiserver-url");
  }
  ApiServer server = from_url("https://" + bracketed(host) + ":" + port);
  server.token_file = std::filesystem::path(kServiceAccountDir) / "token";
  server.ca_file = std::filesystem::path(kServiceAccountDir) / "ca.crt";
  return server;
}

std::string ApiServer::url() const { return "https://" + bracketed(host) + ":" + port + path_prefix; }

struct Informers::Impl {
  Impl(ApiServer s, std::vector<WatchedResource> r, InformerOptions o, InformerObserver ob)
      : server(std::move(s)), resources(std::move(r)), options(std::move(o)), observer(std::move(ob)) {}

  ApiServer server;
  std::vector<WatchedResource> resources;
  InformerOptions options;
  InformerObserver observer;
  asio::io_context ioc;
  std::atomic<std::size_t> listed{0};
  std::mt19937 random{std::random_device{}()};
  std::thread thread;

  void observe(const WatchedResource& resource, std::string_view outcome) {
    if (observer) observer(resource.name, outcome);
  }
  asio::awaitable<void> run(WatchedResource& resource);
  asio::awaitable<std::unique_ptr<Connection>> connect(std::string& error);
  asio::awaitable<bool> send_get(Stream& stream, const std::string& target, std::string& error);
  asio::awaitable<std::optional<std::string>> list(WatchedResource& resource);
  asio::awaitable<WatchEnd> watch(WatchedResource& resource, std::string& version);
  std::optional<std::string> bearer_token(std::string& error) const;
  std::string target(const WatchedResource& resource, std::string query) const;
};

std::optional<std::string> Informers::Impl::bearer_token(std::string& error) const {
  if (server.token_file.empty()) return std::string{};
  auto token = watch::read_file(server.token_file);
  if (!token) {
    error = "cannot read token file " + server.token_file.string();
    return std::nullopt;
  }
  while (!token->empty() && std::isspace(static_cast<unsigned char>(token->back()))) token->pop_back();
  return token;
}

std::string Informers::Impl::target(const WatchedResource& resource, std::string query) const {
  if (!resource.field_selector.empty()) query += "&fieldSelector=" + percent_encode(resource.field_selector);
  return server.path_prefix + resource.path + "?" + query;
}

asio::awaitable<std::unique_ptr<Connection>> Informers::Impl::connect(std::string& error) {
  // A fresh context per connection, so that a rotated CA file is picked up.
  ssl::context context(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_2_VERSION);
  context.set_verify_mode(ssl::verify_peer);
  boost::system::error_code ec;
  if (server.ca_file.empty()) {
    context.set_default_verify_paths(ec);
  } else if (auto ca = watch::read_file(server.ca_file)) {
    context.add_certificate_authority(asio::buffer(*ca), ec);
  } else {
    error = "cannot read CA file " + server.ca_file.string();
    co_return nullptr;
  }
  if (ec) {
    error = "cannot use CA file " + server.ca_file.string() + ": " + ec.message();
    co_return nullptr;
  }

  tcp::resolver resolver(ioc);
  auto [resolve_error, endpoints] = co_await resolver.async_resolve(server.host, server.port, nothrow);
  if (resolve_error) {
    error = "cannot resolve " + server.host + ": " + resolve_error.message();
    co_return nullptr;
  }
  auto connection = std::make_unique<Connection>(ioc, std::move(context));
  Stream& stream = connection->stream;
  if (!is_ip_address(server.host)) SSL_set_tlsext_host_name(stream.native_handle(), server.host.c_str());
  stream.set_verify_callback(ssl::host_name_verification(server.host));
  auto& transport = beast::get_lowest_layer(stream);
  transport.expires_after(options.connect_timeout);
  if (auto [e, endpoint] = co_await transport.async_connect(endpoints, nothrow); e) {
    error = "cannot connect to " + server.url() + ": " + e.message();
    co_return nullptr;
  }
  if (auto [e] = co_await stream.async_handshake(ssl::stream_base::client, nothrow); e) {
    error = "TLS handshake with " + server.url() + " failed: " + e.message();
    co_return nullptr;
  }
  co_return connection;
}

asio::awaitable<bool> Informers::Impl::send_get(Stream& stream, const std::string& target, std::string& error) {
  const auto token = bearer_token(error);
  if (!token) co_return false;
  http::request<http::empty_body> request{http::verb::get, target, 11};
  request.set(http::field::host, bracketed(server.host) + ":" + server.port);
  request.set(http::field::accept, "application/json");
  request.set(http::field::user_agent, options.user_agent);
  if (!token->empty()) request.set(http::field::authorization, "Bearer " + *token);
  if (auto [e, n] = co_await http::async_write(stream, request, nothrow); e) {
    error = "sending the request failed: " + e.message();
    co_return false;
  }
  co_return true;
}

// Every page of the collection; returns its resourceVersion, or nullopt after logging why it failed.
asio::awaitable<std::optional<std::string>> Informers::Impl::list(WatchedResource& resource) {
  std::string error;
  auto connection = co_await connect(error);
  std::vector<json> items;
  std::string continue_token, version;
  while (connection) {
    Stream& stream = connection->stream;
    std::string query = "limit=" + std::to_string(options.page_size);
    if (!continue_token.empty()) query += "&continue=" + percent_encode(continue_token);
    beast::get_lowest_layer(stream).expires_after(options.list_page_timeout);
    if (!co_await send_get(stream, target(resource, query), error)) break;
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(kListBodyLimit);
    if (auto [e, n] = co_await http::async_read(stream, buffer, parser, nothrow); e) {
      error = "reading the list failed: " + e.message();
      break;
    }
    auto& response = parser.get();
    if (response.result_int() == 410 && !continue_token.empty()) {
      // The continue token expired between pages: start over.
      items.clear();
      continue_token.clear();
      continue;
    }
    if (response.result_int() != 200) {
      error = "HTTP " + std::to_string(response.result_int()) + ": " + status_message(response.body());
      break;
    }
    json page = json::parse(response.body(), nullptr, false);
    if (!page.is_object() || !page.contains("items") || !(page["items"].is_array() || page["items"].is_null())) {
      error = "the list response is not a Kubernetes list";
      break;
    }
    if (page["items"].is_array()) {
      for (json& item : page["items"]) items.push_back(resource.trim ? resource.trim(item) : std::move(item));
    }
    version = resource_version_of(page);
    const json& metadata = page["metadata"];
    continue_token = metadata.is_object() && metadata.contains("continue") && metadata["continue"].is_string()
                         ? metadata["continue"].get<std::string>()
                         : std::string{};
    if (!continue_token.empty()) {
      if (!response.keep_alive()) connection = co_await connect(error);
      continue;
    }
    resource.replace(items);
    observe(resource, "list_success");
    log::info("listed", {{"resource", resource.name}, {"items", items.size()}, {"resource_version", version}});
    co_return version;
  }
  observe(resource, "list_failure");
  log::warn("list failed", {{"resource", resource.name}, {"apiserver", server.url()}, {"reason", error}});
  co_return std::nullopt;
}

asio::awaitable<WatchEnd> Informers::Impl::watch(WatchedResource& resource, std::string& version) {
  std::string error;
  auto connection = co_await connect(error);
  const auto seconds = std::uniform_int_distribution<long long>(options.watch_timeout_min.count(),
                                                                options.watch_timeout_max.count())(random);
  const std::string query = "watch=1&allowWatchBookmarks=true&resourceVersion=" + percent_encode(version) +
                            "&timeoutSeconds=" + std::to_string(seconds);
  // One deadline for the whole watch: the apiserver ends it after `seconds`, a silent peer is dropped.
  if (connection) beast::get_lowest_layer(connection->stream).expires_after(std::chrono::seconds(seconds + 30));
  if (!connection || !co_await send_get(connection->stream, target(resource, query), error)) {
    log::warn("watch failed", {{"resource", resource.name}, {"apiserver", server.url()}, {"reason", error}});
    co_return WatchEnd::failed;
  }
  Stream& stream = connection->stream;
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);  // a stream, not a document
  if (auto [e, n] = co_await http::async_read_header(stream, buffer, parser, nothrow); e) {
    log::warn("watch failed", {{"resource", resource.name}, {"reason", "reading the response: " + e.message()}});
    co_return WatchEnd::failed;
  }
  const unsigned status = parser.get().result_int();
  if (status == 410) co_return WatchEnd::gone;

  JsonObjectSplitter splitter;
  std::string body;  // of an error response only
  std::optional<WatchEnd> end;
  auto on_event = [&](std::string_view text) {
    if (end) return;
    const json event = json::parse(text, nullptr, false);
    const auto type = event.is_object() && event.contains("type") && event["type"].is_string()
                          ? event["type"].get<std::string>() : std::string{};
    const auto object = event.is_object() ? event.find("object") : event.end();
    if (type.empty() || object == event.end() || !object->is_object()) {
      error = "malformed watch event";
      end = WatchEnd::failed;
    } else if (type == "ERROR") {
      const auto code = object->find("code");
      if (code != object->end() && code->is_number_integer() && code->get<int>() == 410) {
        end = WatchEnd::gone;
      } else {
        error = "watch error event: " + status_message(object->dump());
        end = WatchEnd::failed;
      }
    } else if (type == "ADDED" || type == "MODIFIED" || type == "DELETED") {
      resource.apply(type, *object);
      if (auto v = resource_version_of(*object); !v.empty()) version = std::move(v);
    } else if (type == "BOOKMARK") {
      if (auto v = resource_version_of(*object); !v.empty()) version = std::move(v);
    }
  };
  char chunk[64 * 1024];
  while (!parser.is_done() && !end) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    // read_some: hand over each event as it arrives instead of waiting for the buffer to fill.
    auto [e, n] = co_await http::async_read_some(stream, buffer, parser, nothrow);
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
    error = "HTTP " + std::to_string(status) + ": " + status_message(body);
    end = WatchEnd::failed;
  }
  if (end == WatchEnd::failed) {
    log::warn("watch failed", {{"resource", resource.name}, {"apiserver", server.url()}, {"reason", error}});
  }
  beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(2));
  co_await stream.async_shutdown(nothrow);
  co_return end.value_or(WatchEnd::closed);
}

asio::awaitable<void> Informers::Impl::run(WatchedResource& resource) {
  std::chrono::milliseconds backoff = options.backoff_initial;
  auto pause = [&]() -> asio::awaitable<void> {
    // Full jitter over the upper half, so that many extenders do not retry in step.
    const auto wait = std::chrono::milliseconds(
        std::uniform_int_distribution<long long>(backoff.count() / 2, backoff.count())(random));
    asio::steady_timer timer(ioc, wait);
    co_await timer.async_wait(nothrow);
    backoff = std::min(backoff * 2, options.backoff_max);
  };
  std::string version;
  bool counted = false;
  for (;;) {
    if (version.empty()) {
      auto listed_version = co_await list(resource);
      if (!listed_version) {
        co_await pause();
        continue;
      }
      version = std::move(*listed_version);
      if (!counted) {
        counted = true;
        ++listed;
      }
      backoff = options.backoff_initial;
    }
    const auto started = std::chrono::steady_clock::now();
    const WatchEnd end = co_await watch(resource, version);
    if (end == WatchEnd::gone) {
      observe(resource, "watch_gone");
      log::info("watch resource version expired; listing again", {{"resource", resource.name}, {"resource_version", version}});
      version.clear();
    } else if (end == WatchEnd::closed && std::chrono::steady_clock::now() - started > std::chrono::seconds(1)) {
      observe(resource, "watch_closed");
      backoff = options.backoff_initial;
    } else {
      // Failed, or closed at once (which, repeated, would be a busy loop): wait before resuming.
      observe(resource, end == WatchEnd::closed ? "watch_closed" : "watch_error");
      co_await pause();
    }
  }
}

Informers::Informers(ApiServer server, std::vector<WatchedResource> resources, InformerOptions options,
                     InformerObserver observer)
    : impl_(std::make_unique<Impl>(std::move(server), std::move(resources), std::move(options), std::move(observer))) {}

Informers::~Informers() {
  impl_->ioc.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void Informers::start() {
  for (auto& resource : impl_->resources) asio::co_spawn(impl_->ioc, impl_->run(resource), asio::detached);
  impl_->thread = std::thread([this] {
    try {
      impl_->ioc.run();
    } catch (const std::exception& e) {
      // A handler threw (the JSON given to it is checked, so this is a bug): nothing is watched any more.
      log::error("Kubernetes API watch loop failed", {{"reason", e.what()}});
    }
  });
}

bool Informers::synced() const { return impl_->listed.load() == impl_->resources.size(); }

}  // namespace gpuguard::kube

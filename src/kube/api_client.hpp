#pragma once
// The transport half of list-and-watch, as client-go's ListerWatcher over its REST client: a paged list
// and a watch stream against one apiserver, over HTTPS with the bearer token, and the one-shot requests of
// request.hpp. It keeps no state between calls and decides nothing about retries: kube::Reflector does.
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include <simdjson.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "gpuguard/kube/api_server.hpp"
#include "gpuguard/kube/informer.hpp"
#include "gpuguard/kube/reflector.hpp"
#include "gpuguard/kube/request.hpp"

namespace gpuguard::kube {

struct Connection;

class ApiClient {
 public:
  ApiClient(boost::asio::io_context& ioc, ApiServer server, const InformerOptions& options);

  // Every page of the collection, each item to `resource.store` as its page arrives. Returns the list's
  // resourceVersion, or nullopt after logging why it failed.
  boost::asio::awaitable<std::optional<std::string>> list(WatchedResource& resource);
  // Events to `resource.store` until the stream ends; `version` follows every event and bookmark.
  // `timeout` is what the apiserver is asked to end the watch after.
  boost::asio::awaitable<WatchEnd> watch(WatchedResource& resource, std::string& version,
                                         std::chrono::milliseconds timeout);
  // One request with a body (a PATCH of a status), answered whole within `timeout`, on a connection of
  // its own.
  boost::asio::awaitable<Reply> send(const Request& request, std::chrono::milliseconds timeout);
  // The same on `kept`, connected first when empty and emptied when it cannot carry another request;
  // once more on a new connection when a kept one failed before any of an answer came.
  boost::asio::awaitable<Reply> send_kept(const Request& request, std::chrono::milliseconds timeout,
                                          std::unique_ptr<Connection>& kept);

 private:
  struct Exchange;
  boost::asio::awaitable<Exchange> exchange(Connection& connection, const Request& request,
                                            std::chrono::milliseconds timeout);
  boost::asio::awaitable<std::unique_ptr<Connection>> connect(std::string& error);
  template <typename Stream>
  boost::asio::awaitable<bool> send_get(Stream& stream, const std::string& target, std::string& error);
  template <typename Message>
  bool authorize(Message& request, std::string& error) const;
  std::optional<std::string> bearer_token(std::string& error) const;
  std::string target(const WatchedResource& resource, std::string query) const;

  boost::asio::io_context& ioc_;
  ApiServer server_;
  const InformerOptions& options_;
  // Reused for every page and event: its buffers grow to the largest page once.
  simdjson::ondemand::parser json_;
};

}  // namespace gpuguard::kube

#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "gpuguard/deviceplugin/resource.hpp"

namespace grpc {
class Server;
}

namespace gpuguard::deviceplugin {

// One resource served on its own socket in the kubelet's plugin directory, and registered under it.
class PluginServer {
 public:
  // `yielded_to`: why another plugin now serves this very resource name on the node (empty: none). Since
  // Kubernetes 1.37 the kubelet keeps both plugins' endpoints under one name and takes whichever list came
  // last as the resource's devices, so a list sent then would replace the other plugin's: once it says so,
  // the kubelet's streams send nothing more (and stay open: see ListAndWatch).
  PluginServer(Resource& resource, const std::filesystem::path& plugin_dir,
               std::function<std::string()> yielded_to = {});
  ~PluginServer();
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;

  // Removes a stale socket and serves DevicePlugin on a new one. Throws std::runtime_error on failure.
  void serve();
  // Ends the ListAndWatch streams, stops the server and removes the socket.
  void stop();
  // Whether this server's own socket is at its path: false before serve(), and once the file is gone or
  // is another's (the kubelet removes every socket when it restarts; a killed plugin leaves its socket,
  // which nothing answers, for the next run to find).
  bool serving() const;
  const std::string& resource_name() const;
  // Registration.Register on the kubelet's socket, with this server's socket as the endpoint.
  void register_with_kubelet(const std::filesystem::path& kubelet_socket) const;

 private:
  class Service;
  Resource& resource_;
  std::filesystem::path socket_path_;
  std::function<std::string()> yielded_to_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::optional<std::uint64_t> socket_inode_;  // the file serve() bound, while served
};

}  // namespace gpuguard::deviceplugin

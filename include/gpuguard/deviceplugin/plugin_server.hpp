#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "gpuguard/deviceplugin/resource.hpp"

namespace grpc {
class Server;
}

namespace gpuguard::deviceplugin {

// One resource served on its own socket in the kubelet's plugin directory, and registered under it.
class PluginServer {
 public:
  PluginServer(Resource& resource, const std::filesystem::path& plugin_dir);
  ~PluginServer();
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;

  // Removes a stale socket and serves DevicePlugin on a new one. Throws std::runtime_error on failure.
  void serve();
  // Ends the ListAndWatch streams, stops the server and removes the socket.
  void stop();
  bool socket_exists() const;
  const std::string& resource_name() const;
  // Registration.Register on the kubelet's socket, with this server's socket as the endpoint.
  void register_with_kubelet(const std::filesystem::path& kubelet_socket) const;

 private:
  class Service;
  Resource& resource_;
  std::filesystem::path socket_path_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace gpuguard::deviceplugin

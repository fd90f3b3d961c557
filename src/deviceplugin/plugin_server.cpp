#include "gpuguard/deviceplugin/plugin_server.hpp"

#include <sys/stat.h>

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <stdexcept>
#include <system_error>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "gpuguard/log/log.hpp"

namespace gpuguard::deviceplugin {
namespace {

using namespace std::chrono_literals;

// The inode of the socket file at `path`, or none when there is no socket there.
std::optional<std::uint64_t> inode_of(const std::filesystem::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISSOCK(info.st_mode)) return std::nullopt;
  return info.st_ino;
}

v1beta1::ListAndWatchResponse device_list(const std::vector<Device>& devices) {
  v1beta1::ListAndWatchResponse response;
  for (const Device& device : devices) {
    auto* d = response.add_devices();
    d->set_id(device.id);
    d->set_health(device.healthy ? "Healthy" : "Unhealthy");
    if (device.numa_node) d->mutable_topology()->add_nodes()->set_id(*device.numa_node);
  }
  return response;
}

void to_proto(const Allocation& allocation, v1beta1::ContainerAllocateResponse& response) {
  for (const auto& [name, value] : allocation.envs) (*response.mutable_envs())[name] = value;
  for (const auto& mount : allocation.mounts) {
    auto* m = response.add_mounts();
    m->set_container_path(mount.container_path);
    m->set_host_path(mount.host_path);
    m->set_read_only(mount.read_only);
  }
  for (const auto& device : allocation.devices) {
    auto* d = response.add_devices();
    d->set_container_path(device.container_path);
    d->set_host_path(device.host_path);
    d->set_permissions(device.permissions);
  }
  for (const auto& [key, value] : allocation.annotations) (*response.mutable_annotations())[key] = value;
  for (const auto& name : allocation.cdi_devices) response.add_cdi_devices()->set_name(name);
}

}  // namespace

class PluginServer::Service final : public v1beta1::DevicePlugin::Service {
 public:
  Service(Resource& resource, std::function<std::string()> yielded_to)
      : resource_(resource), yielded_to_(std::move(yielded_to)) {}
  void stop() { stopping_ = true; }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* options) override {
    options->set_pre_start_required(false);
    options->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  // The whole list at once, and again on every change, until the kubelet hangs up or we stop.
  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    std::uint64_t sent = 0;
    bool yielded = false;
    auto next_look = std::chrono::steady_clock::now();
    while (!stopping_ && !context->IsCancelled()) {
      std::uint64_t version = 0;
      const auto devices = resource_.devices().snapshot(&version);
      // Before every list, and every 2 s while none is due: another plugin answering for this name. Then
      // nothing more is sent, and the stream is kept open: a kubelet before 1.37 keeps one client per name,
      // and a stream of ours that ended would close the other plugin's, whose registration replaced ours.
      if (!yielded && yielded_to_ && (version != sent || std::chrono::steady_clock::now() >= next_look)) {
        next_look = std::chrono::steady_clock::now() + 2s;
        if (std::string why = yielded_to_(); !why.empty()) {
          log::warn("no more device lists sent: another plugin serves the resource",
                    {{"resource", resource_.name()}, {"reason", why}});
          yielded = true;
        }
      }
      if (version != sent && !yielded && !writer->Write(device_list(devices))) break;
      sent = version;
      resource_.devices().wait_for_change(sent, 250ms);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override {
    for (const auto& container : request->container_requests()) {
      const std::vector<std::string> available(container.available_deviceids().begin(),
                                               container.available_deviceids().end());
      const std::vector<std::string> must(container.must_include_deviceids().begin(),
                                          container.must_include_deviceids().end());
      const auto size = static_cast<std::size_t>(std::max(0, container.allocation_size()));
      auto* preferred = response->add_container_responses();
      for (const std::string& id : resource_.preferred(available, must, size)) preferred->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    for (const auto& container : request->container_requests()) {
      const std::vector<std::string> ids(container.devices_ids().begin(), container.devices_ids().end());
      Allocation allocation;
      if (auto error = resource_.allocate(ids, allocation)) {
        log::error("allocation refused", {{"resource", resource_.name()}, {"reason", *error}});
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, *error);
      }
      to_proto(allocation, *response->add_container_responses());
      log::info("allocated", {{"resource", resource_.name()}, {"devices", ids}});
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  Resource& resource_;
  std::function<std::string()> yielded_to_;
  std::atomic<bool> stopping_{false};
};

PluginServer::PluginServer(Resource& resource, const std::filesystem::path& plugin_dir,
                           std::function<std::string()> yielded_to)
    : resource_(resource),
      socket_path_(plugin_dir / socket_name(resource.name())),
      yielded_to_(std::move(yielded_to)) {}

PluginServer::~PluginServer() { stop(); }

const std::string& PluginServer::resource_name() const { return resource_.name(); }

void PluginServer::serve() {
  stop();
  service_ = std::make_unique<Service>(resource_, yielded_to_);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + socket_path_.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_) throw std::runtime_error("cannot serve " + resource_.name() + " on " + socket_path_.string());
  socket_inode_ = inode_of(socket_path_);
  log::info("serving", {{"resource", resource_.name()}, {"socket", socket_path_.string()}});
}

void PluginServer::stop() {
  socket_inode_.reset();
  if (server_) {
    service_->stop();
    server_->Shutdown(std::chrono::system_clock::now() + 2s);
    server_->Wait();
    server_.reset();
  }
  std::error_code ignored;
  std::filesystem::remove(socket_path_, ignored);
}

bool PluginServer::serving() const { return server_ && socket_inode_ && inode_of(socket_path_) == socket_inode_; }

void PluginServer::register_with_kubelet(const std::filesystem::path& kubelet_socket) const {
  auto channel = grpc::CreateChannel("unix://" + kubelet_socket.string(), grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 5s);
  v1beta1::RegisterRequest request;
  request.set_version("v1beta1");
  request.set_endpoint(socket_path_.filename().string());
  request.set_resource_name(resource_.name());
  request.mutable_options()->set_get_preferred_allocation_available(true);
  v1beta1::Empty reply;
  const grpc::Status status = stub->Register(&context, request, &reply);
  if (!status.ok()) {
    throw std::runtime_error("cannot register " + resource_.name() + " with " + kubelet_socket.string() + ": " +
                             status.error_message());
  }
  log::info("registered", {{"resource", resource_.name()}, {"endpoint", request.endpoint()}});
}

}  // namespace gpuguard::deviceplugin

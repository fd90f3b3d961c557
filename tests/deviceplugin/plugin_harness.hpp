#pragma once
// What the device plugin's integration tests share: the real binary as a child process, a fake kubelet
// (a Registration server on a temporary kubelet.sock), DevicePlugin clients on the plugin's sockets, and
// a fake host tree.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <algorithm>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "child_process.hpp"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "eventually.hpp"
#include "fake_host.hpp"
#include "podresources/v1/api.grpc.pb.h"
#include "series.hpp"

namespace gpuguard::test {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

inline const std::string kGpu0 = "GPU-11111111-1111-1111-1111-111111111111";
inline const std::string kGpu1 = "GPU-22222222-2222-2222-2222-222222222222";

// The kubelet's pod-resources API, as far as the plugin asks it: GetAllocatableResources answers with what
// offer() last set, one entry per device as the kubelet lists them.
class FakePodResources final : public ::v1::PodResourcesLister::Service {
 public:
  explicit FakePodResources(const fs::path& socket) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix://" + socket.string(), grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakePodResources() override { server_->Shutdown(std::chrono::system_clock::now() + 1s); }

  void offer(std::map<std::string, std::vector<std::string>> resources) {
    std::lock_guard lock(mutex_);
    offered_ = std::move(resources);
  }
  int asked() {
    std::lock_guard lock(mutex_);
    return asked_;
  }
  // Pods holding devices: one pod, its one container holding what hold() last set.
  void hold(std::map<std::string, std::vector<std::string>> resources) {
    std::lock_guard lock(mutex_);
    held_ = std::move(resources);
  }
  // A device that container holds through a DRA claim, as the kubelet reports it from 1.34.
  struct Claimed {
    std::string driver, pool, device;
    std::vector<std::string> cdi_devices;
  };
  void hold_claimed(std::vector<Claimed> devices) {
    std::lock_guard lock(mutex_);
    claimed_ = std::move(devices);
  }
  // Another pod on the node, holding no device: its namespace, name and containers.
  void run_pod(const std::string& pod_namespace, const std::string& name, const std::vector<std::string>& containers) {
    std::lock_guard lock(mutex_);
    pods_.push_back({pod_namespace, name, containers});
  }
  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* response) override {
    std::lock_guard lock(mutex_);
    for (const Pod& running : pods_) {
      auto* pod = response->add_pod_resources();
      pod->set_namespace_(running.pod_namespace);
      pod->set_name(running.name);
      for (const std::string& name : running.containers) pod->add_containers()->set_name(name);
    }
    if (held_.empty() && claimed_.empty()) return grpc::Status::OK;
    auto* pod = response->add_pod_resources();
    pod->set_name("holder");
    pod->set_namespace_("default");
    auto* container = pod->add_containers();
    container->set_name("app");
    for (const auto& [name, ids] : held_) {
      auto* devices = container->add_devices();
      devices->set_resource_name(name);
      for (const std::string& id : ids) devices->add_device_ids(id);
    }
    if (!claimed_.empty()) {
      auto* claim = container->add_dynamic_resources();
      claim->set_claim_name("gpu");
      claim->set_claim_namespace("default");
      for (const Claimed& claimed : claimed_) {
        auto* device = claim->add_claim_resources();
        device->set_driver_name(claimed.driver);
        device->set_pool_name(claimed.pool);
        device->set_device_name(claimed.device);
        for (const std::string& name : claimed.cdi_devices) device->add_cdi_devices()->set_name(name);
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status GetAllocatableResources(grpc::ServerContext*, const ::v1::AllocatableResourcesRequest*,
                                       ::v1::AllocatableResourcesResponse* response) override {
    std::lock_guard lock(mutex_);
    ++asked_;
    for (const auto& [name, ids] : offered_) {
      for (const std::string& id : ids) {
        auto* devices = response->add_devices();
        devices->set_resource_name(name);
        devices->add_device_ids(id);
      }
    }
    return grpc::Status::OK;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::mutex mutex_;
  std::map<std::string, std::vector<std::string>> offered_, held_;
  std::vector<Claimed> claimed_;
  struct Pod {
    std::string pod_namespace, name;
    std::vector<std::string> containers;
  };
  std::vector<Pod> pods_;
  int asked_ = 0;
};

// The kubelet's side of registration: records every RegisterRequest.
class FakeKubelet final : public v1beta1::Registration::Service {
 public:
  explicit FakeKubelet(fs::path dir) : dir_(std::move(dir)) { start(); }
  ~FakeKubelet() override { stop(); }

  void start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix://" + (dir_ / "kubelet.sock").string(), grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  void stop() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + 1s);
    server_.reset();
  }

  // As the kubelet does since 1.3x, a registration is taken only once the plugin's endpoint answers,
  // within the registration's own call: a plugin that registers before it serves, or names a socket
  // nothing answers on, is refused.
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request, v1beta1::Empty*) override {
    auto endpoint = v1beta1::DevicePlugin::NewStub(
        grpc::CreateChannel("unix://" + (dir_ / request->endpoint()).string(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 2s);
    v1beta1::DevicePluginOptions options;
    if (const grpc::Status answered = endpoint->GetDevicePluginOptions(&context, v1beta1::Empty{}, &options);
        !answered.ok()) {
      return {grpc::StatusCode::UNAVAILABLE,
              "the endpoint " + request->endpoint() + " does not answer: " + answered.error_message()};
    }
    std::lock_guard lock(mutex_);
    registrations_.push_back(*request);
    changed_.notify_all();
    return grpc::Status::OK;
  }

  // Waits until `count` registrations in all have arrived; returns them.
  std::vector<v1beta1::RegisterRequest> wait_for(std::size_t count, std::chrono::milliseconds limit = 5s) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, limit, [&] { return registrations_.size() >= count; });
    return registrations_;
  }

 private:
  fs::path dir_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<v1beta1::RegisterRequest> registrations_;
};

inline std::vector<std::string> plugin_argv(const fs::path& plugin_dir, const fs::path& host_root,
                                            std::vector<std::string> extra) {
  std::vector<std::string> args = {
      GPUGUARD_DEVICE_PLUGIN_BIN, "--device-plugin-dir", plugin_dir.string(), "--host-root",
      host_root.string(),         "--metrics-address",   "127.0.0.1:0"};
  if (std::find(extra.begin(), extra.end(), "--discovery") == extra.end()) {
    args.insert(args.end(), {"--discovery", "procfs"});
  }
  // Not asked, unless the test gives a FakePodResources' socket: the other tests run without one.
  if (std::find(extra.begin(), extra.end(), "--pod-resources-socket") == extra.end()) {
    args.insert(args.end(), {"--pod-resources-socket", ""});
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The device plugin, its log in the plugin directory.
class PluginProcess : public ChildProcess {
 public:
  // `env`: NAME=value entries added to this process's environment (the stand-in NVML's, say).
  PluginProcess(const fs::path& plugin_dir, const fs::path& host_root, std::vector<std::string> extra,
                std::vector<std::string> env = {})
      : ChildProcess(plugin_argv(plugin_dir, host_root, std::move(extra)),
                     {.env = std::move(env), .log = plugin_dir / "plugin.log"}) {}
  int terminate() { return ChildProcess::terminate(5s); }
  // The port of its probe and metrics listener, from its start-up log line.
  int status_port() const { return logged_port("serving probes and metrics"); }
};

inline std::unique_ptr<v1beta1::DevicePlugin::Stub> plugin_client(const fs::path& dir, const std::string& endpoint) {
  return v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix://" + (dir / endpoint).string(), grpc::InsecureChannelCredentials()));
}

// The first response of a ListAndWatch stream, then each following one on demand.
class DeviceWatch {
 public:
  explicit DeviceWatch(v1beta1::DevicePlugin::Stub& stub) {
    context_.set_deadline(std::chrono::system_clock::now() + 60s);
    reader_ = stub.ListAndWatch(&context_, v1beta1::Empty{});
  }
  ~DeviceWatch() { context_.TryCancel(); }
  std::optional<v1beta1::ListAndWatchResponse> next() {
    v1beta1::ListAndWatchResponse response;
    if (!reader_->Read(&response)) return std::nullopt;
    return response;
  }
  // The next answer's devices, id to health: the first one of a new stream lists every device as it is now.
  std::map<std::string, std::string> health() {
    const auto response = next();
    REQUIRE(response);
    std::map<std::string, std::string> out;
    for (const auto& device : response->devices()) out[device.id()] = device.health();
    return out;
  }
  // Reads updates until `id` has `health`; false when the stream ends first.
  bool until(const std::string& id, const std::string& health) {
    while (auto response = next()) {
      for (const auto& d : response->devices()) {
        if (d.id() == id && d.health() == health) return true;
      }
    }
    return false;
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>> reader_;
};

// A plain HTTP/1.1 GET on 127.0.0.1: the status line and body, e.g. "200" and the metrics text.
inline std::pair<std::string, std::string> http_get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  REQUIRE(send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size()));
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof buffer, 0)) > 0;) response.append(buffer, static_cast<std::size_t>(n));
  close(fd);
  const auto body = response.find("\r\n\r\n");
  REQUIRE(response.size() > 12);
  return {response.substr(9, 3), body == std::string::npos ? std::string{} : response.substr(body + 4)};
}

// A series' whole value from the plugin's /metrics; -1 when it is not there.
inline long long plugin_series(int port, const std::string& name) {
  return series_value(http_get(port, "/metrics").second, name);
}

// Waits until the plugin has run `more` further passes over the kubelet's socket and its own (one a second):
// what it has not done by then (registered again, served again) it did not do on a pass, rather than had no
// pass to do it in. Fails the test when the passes stop.
inline void wait_for_passes(int port, long long more) {
  const auto passes = [&] { return plugin_series(port, "gpuguard_device_plugin_kubelet_passes_total"); };
  const long long from = passes();
  REQUIRE(from >= 0);
  long long now = from;
  const bool passed = eventually([&] { return (now = passes()) >= from + more; }, 5s);
  INFO("passes went from " << from << " to " << now << " in 5 s");
  REQUIRE(passed);
}

inline grpc::Status allocate(v1beta1::DevicePlugin::Stub& stub, const std::vector<std::string>& ids,
                             v1beta1::AllocateResponse& response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 5s);
  v1beta1::AllocateRequest request;
  auto* container = request.add_container_requests();
  for (const auto& id : ids) container->add_devices_ids(id);
  return stub.Allocate(&context, request, &response);
}

struct Node {
  FakeHost host{"plugin"};
  fs::path plugin_dir = host.root() / "var/lib/kubelet/device-plugins";
  Node() {
    fs::create_directories(plugin_dir);
    host.add_gpu("0000:18:00.0", kGpu0, 0, 0);
    host.add_gpu("0000:9a:00.0", kGpu1, 1, 1);
    host.add_device("/dev/nvidiactl");
    host.add_device("/dev/fuse");
  }
};

}  // namespace gpuguard::test

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
#include <spawn.h>
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

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "fake_host.hpp"

extern char** environ;

namespace gpuguard::test {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

inline const std::string kGpu0 = "GPU-11111111-1111-1111-1111-111111111111";
inline const std::string kGpu1 = "GPU-22222222-2222-2222-2222-222222222222";

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

class PluginProcess {
 public:
  // `env`: NAME=value entries added to this process's environment (the stand-in NVML's, say).
  PluginProcess(const fs::path& plugin_dir, const fs::path& host_root, std::vector<std::string> extra,
                std::vector<std::string> env = {}) {
    std::vector<std::string> args = {
        GPUGUARD_DEVICE_PLUGIN_BIN, "--device-plugin-dir", plugin_dir.string(), "--host-root",
        host_root.string(),         "--metrics-address",   "127.0.0.1:0"};
    if (std::find(extra.begin(), extra.end(), "--discovery") == extra.end()) {
      args.insert(args.end(), {"--discovery", "procfs"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    log_ = plugin_dir / "plugin.log";
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    REQUIRE(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data()) == 0);
    posix_spawn_file_actions_destroy(&actions);
  }
  ~PluginProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int terminate() {
    kill(pid_, SIGTERM);
    return wait_exit(5s, "of SIGTERM");
  }
  // Its exit status once it exits by itself; -1 when it did not within `limit`, or ended by a signal.
  int wait_exit(std::chrono::milliseconds limit, const char* what = "") {
    int status = 0;
    for (auto waited = 0ms; waited < limit; waited += 50ms) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        WARN("the plugin ended by signal " << WTERMSIG(status) << "; its log:\n" << log());
        return -1;
      }
      std::this_thread::sleep_for(50ms);
    }
    WARN("the plugin did not exit within " << limit.count() << " ms " << what << "; its log:\n" << log());
    return -1;
  }
  std::string log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // The port of its probe and metrics listener, from its start-up log line.
  int status_port() const {
    const std::string address = "\"address\":\"127.0.0.1:";
    for (int i = 0; i < 100; ++i) {
      std::istringstream lines(log());
      for (std::string line; std::getline(lines, line);) {
        const auto at = line.find(address);
        if (at != std::string::npos && line.find("serving probes and metrics") != std::string::npos) {
          return std::stoi(line.substr(at + address.size()));
        }
      }
      std::this_thread::sleep_for(50ms);
    }
    FAIL("no \"serving probes and metrics\" line in the plugin's log:\n" << log());
    return 0;
  }

 private:
  pid_t pid_ = -1;
  fs::path log_;
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
  const std::string page = http_get(port, "/metrics").second;
  const auto at = page.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stoll(page.substr(at + name.size() + 2));
}

// Waits until the plugin has run `more` further passes over the kubelet's socket and its own (one a second):
// what it has not done by then (registered again, served again) it did not do on a pass, rather than had no
// pass to do it in. Fails the test when the passes stop.
inline void wait_for_passes(int port, long long more) {
  const long long from = plugin_series(port, "gpuguard_device_plugin_kubelet_passes_total");
  REQUIRE(from >= 0);
  long long now = from;
  for (int i = 0; i < 100 && now < from + more; ++i) {
    std::this_thread::sleep_for(50ms);
    now = plugin_series(port, "gpuguard_device_plugin_kubelet_passes_total");
  }
  INFO("passes went from " << from << " to " << now << " in 5 s");
  REQUIRE(now >= from + more);
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

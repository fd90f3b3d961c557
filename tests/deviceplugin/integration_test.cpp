// The real gpuguard-device-plugin against a fake kubelet, over a fake host tree without NVML: registration,
// lists, allocation, health, probes and metrics, kubelet restarts, bad flags.
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>

#include "files.hpp"
#include "plugin_harness.hpp"
#include "promtool.hpp"
#include "server_process.hpp"

using namespace gpuguard::test;

TEST_CASE("registers each resource on its own socket, lists, allocates, refuses unknown IDs, stops on SIGTERM") {
  Node node;
  // A node whose containerd runs every container through NVIDIA's runtime, with no toolkit config and no
  // package database (mode auto, version unknown: jit-cdi on 1.18.0 and 1.18.1 read none as all, which
  // cannot be ruled out): the plugin's log carries the node report and what it warns about.
  node.host.write("etc/containerd/config.toml",
                  "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = \"nvidia\"\n"
                  "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n"
                  "BinaryName = \"/usr/bin/nvidia-container-runtime\"\n");
  FakeKubelet kubelet(node.plugin_dir);
  PluginProcess plugin(node.plugin_dir, node.host.root(),
                       {"--host-device", "github.com/fuse=/dev/fuse:4", "--pass-device-specs"});

  const auto registrations = kubelet.wait_for(2);
  REQUIRE(registrations.size() == 2);
  std::map<std::string, v1beta1::RegisterRequest> by_resource;
  for (const auto& r : registrations) by_resource[r.resource_name()] = r;
  REQUIRE(by_resource.count("nvidia.com/gpu"));
  REQUIRE(by_resource.count("github.com/fuse"));
  const auto& gpu_registration = by_resource["nvidia.com/gpu"];
  CHECK(gpu_registration.version() == "v1beta1");
  CHECK(gpu_registration.endpoint() == "gpuguard-nvidia-com-gpu.sock");
  CHECK(gpu_registration.options().get_preferred_allocation_available());
  CHECK(fs::is_socket(node.plugin_dir / gpu_registration.endpoint()));  // served before registering
  // SIGTERM and SIGINT are given to the status server's loop alone: gRPC's threads and the pollers block them
  // (a signal on one of gRPC's, asleep where ThreadSanitizer does not look, could wait there unseen).
  CHECK(eventually([&] { return plugin.main_thread_alone_takes(SIGTERM); }, 10s));
  CHECK(plugin.threads().size() >= 4);
  CHECK(plugin.main_thread_alone_takes(SIGINT));

  auto gpus = plugin_client(node.plugin_dir, gpu_registration.endpoint());
  {
    grpc::ClientContext context;
    v1beta1::DevicePluginOptions options;
    REQUIRE(gpus->GetDevicePluginOptions(&context, v1beta1::Empty{}, &options).ok());
    CHECK(options.get_preferred_allocation_available());
    CHECK_FALSE(options.pre_start_required());
  }
  DeviceWatch watch(*gpus);
  const auto list = watch.next();
  REQUIRE(list);
  REQUIRE(list->devices_size() == 2);
  CHECK(list->devices(0).id() == kGpu0);
  CHECK(list->devices(0).health() == "Healthy");
  REQUIRE(list->devices(1).topology().nodes_size() == 1);
  CHECK(list->devices(1).topology().nodes(0).id() == 1);

  v1beta1::AllocateResponse allocated;
  REQUIRE(allocate(*gpus, {kGpu1}, allocated).ok());
  CHECK(allocated.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES") == kGpu1);
  REQUIRE(allocated.container_responses(0).devices_size() == 2);  // /dev/nvidia1 and /dev/nvidiactl
  CHECK(allocated.container_responses(0).devices(0).host_path() == "/dev/nvidia1");

  v1beta1::AllocateResponse refused;
  const grpc::Status unknown = allocate(*gpus, {"GPU-does-not-exist"}, refused);
  CHECK(unknown.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(unknown.error_message(), Catch::Contains("GPU-does-not-exist"));
  v1beta1::AllocateResponse still_serving;
  CHECK(allocate(*gpus, {kGpu0}, still_serving).ok());

  {
    grpc::ClientContext context;
    v1beta1::PreferredAllocationRequest request;
    auto* container = request.add_container_requests();
    container->add_available_deviceids(kGpu1);
    container->add_available_deviceids(kGpu0);
    container->set_allocation_size(1);
    v1beta1::PreferredAllocationResponse preferred;
    REQUIRE(gpus->GetPreferredAllocation(&context, request, &preferred).ok());
    REQUIRE(preferred.container_responses(0).deviceids_size() == 1);
    CHECK(preferred.container_responses(0).deviceids(0) == kGpu0);
  }

  auto fuse = plugin_client(node.plugin_dir, by_resource["github.com/fuse"].endpoint());
  DeviceWatch fuse_watch(*fuse);
  const auto slots = fuse_watch.next();
  REQUIRE(slots);
  CHECK(slots->devices_size() == 4);
  v1beta1::AllocateResponse fuse_allocated;
  REQUIRE(allocate(*fuse, {"fuse-1", "fuse-3"}, fuse_allocated).ok());
  REQUIRE(fuse_allocated.container_responses(0).devices_size() == 1);
  CHECK(fuse_allocated.container_responses(0).devices(0).host_path() == "/dev/fuse");
  CHECK(fuse_allocated.container_responses(0).devices(0).permissions() == "rw");

  CHECK(plugin.terminate() == 0);
  CHECK_FALSE(fs::exists(node.plugin_dir / gpu_registration.endpoint()));
  CHECK_FALSE(fs::exists(node.plugin_dir / by_resource["github.com/fuse"].endpoint()));
  CHECK_THAT(plugin.log(), Catch::Contains(R"("msg":"node report","none":"leaks")"));
  CHECK_THAT(plugin.log(), Catch::Contains(R"("code":"envvar-when-unprivileged")"));
  CHECK_THAT(plugin.log(), Catch::Contains("node not hardened"));
}

TEST_CASE("volume-mounts and cdi strategies over the wire") {
  for (const std::string strategy : {"volume-mounts", "cdi"}) {
    DYNAMIC_SECTION(strategy) {
      Node node;
      FakeKubelet kubelet(node.plugin_dir);
      const fs::path cdi_root = node.host.root() / "var/run/cdi";
      PluginProcess plugin(node.plugin_dir, node.host.root(),
                           {"--device-list-strategy", strategy, "--cdi-root", "/var/run/cdi"});
      REQUIRE(kubelet.wait_for(1).size() == 1);
      auto gpus = plugin_client(node.plugin_dir, "gpuguard-nvidia-com-gpu.sock");
      v1beta1::AllocateResponse response;
      REQUIRE(allocate(*gpus, {kGpu0, kGpu1}, response).ok());
      const auto& container = response.container_responses(0);
      if (strategy == "cdi") {
        REQUIRE(container.cdi_devices_size() == 2);
        CHECK(container.cdi_devices(1).name() == "k8s.gpuguard.io/gpu=" + kGpu1);
        CHECK(container.envs().at("NVIDIA_VISIBLE_DEVICES") == "void");
        CHECK(fs::exists(cdi_root / "k8s.gpuguard.io-gpu.json"));
      } else {
        CHECK(container.envs().at("NVIDIA_VISIBLE_DEVICES") == "/var/run/nvidia-container-devices");
        REQUIRE(container.mounts_size() == 2);
        CHECK(container.mounts(0).container_path() == "/var/run/nvidia-container-devices/" + kGpu0);
        CHECK(container.mounts(0).host_path() == "/dev/null");
      }
      CHECK(plugin.terminate() == 0);
    }
  }
}

TEST_CASE("health: a vanished device node turns Unhealthy within 5 s, and Healthy again when it is back") {
  Node node;
  FakeKubelet kubelet(node.plugin_dir);
  PluginProcess plugin(node.plugin_dir, node.host.root(), {"--host-device", "github.com/fuse=/dev/fuse:2"});
  REQUIRE(kubelet.wait_for(2).size() == 2);
  auto gpus = plugin_client(node.plugin_dir, "gpuguard-nvidia-com-gpu.sock");
  DeviceWatch watch(*gpus);
  REQUIRE(watch.next());

  auto started = std::chrono::steady_clock::now();
  node.host.remove("/dev/nvidia1");
  REQUIRE(watch.until(kGpu1, "Unhealthy"));
  CHECK(std::chrono::steady_clock::now() - started < 5s);
  v1beta1::AllocateResponse refused;
  const grpc::Status status = allocate(*gpus, {kGpu1}, refused);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(), Catch::Contains(kGpu1) && Catch::Contains("unhealthy"));

  started = std::chrono::steady_clock::now();
  node.host.add_device("/dev/nvidia1");
  REQUIRE(watch.until(kGpu1, "Healthy"));
  CHECK(std::chrono::steady_clock::now() - started < 5s);

  // The information file counts too, and a host device is healthy while its path exists.
  node.host.remove("/proc/driver/nvidia/gpus/0000:18:00.0/information");
  REQUIRE(watch.until(kGpu0, "Unhealthy"));
  auto fuse = plugin_client(node.plugin_dir, "gpuguard-github-com-fuse.sock");
  DeviceWatch fuse_watch(*fuse);
  REQUIRE(fuse_watch.next());
  node.host.remove("/dev/fuse");
  REQUIRE(fuse_watch.until("fuse-1", "Unhealthy"));
  CHECK(plugin.terminate() == 0);
}

namespace {

// containerd runs every container through NVIDIA's runtime, in cdi mode.
void nvidia_cdi_mode_by_default(Node& node) {
  node.host.write("etc/containerd/config.toml",
                  "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\ndefault_runtime_name = 'nvidia'\n"
                  "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]\n"
                  "BinaryName = '/usr/bin/nvidia-container-runtime'\n");
  node.host.write("etc/nvidia-container-runtime/config.toml", "[nvidia-container-runtime]\nmode = 'cdi'\n");
}

}  // namespace

TEST_CASE("node report: the verdict for each value in /metrics, judged again when the node's files change") {
  Node node;
  // cdi mode with no CDI device named none: none breaks every GPU-less container, void is honoured.
  nvidia_cdi_mode_by_default(node);
  // No CDI root: the plugin writes no spec, so it cannot add the device none itself (the next test).
  PluginProcess plugin(node.plugin_dir, node.host.root(), {"--cdi-root", ""});
  const int port = plugin.status_port();
  const std::string before = http_get(port, "/metrics").second;
  CHECK_THAT(before, Catch::Contains(R"(gpuguard_device_plugin_value_honoured{value="none",verdict="breaks-pods"} 0)"));
  CHECK_THAT(before, Catch::Contains(R"(gpuguard_device_plugin_value_honoured{value="void",verdict="honoured"} 1)"));
  CHECK_THAT(before, Catch::Contains(R"(gpuguard_device_plugin_node_findings{severity="critical"} 1)"));
  // The admin adds the device none, as security.md says: within the re-read interval the series turn,
  // and the log says so.
  node.host.write("etc/cdi/none.yaml",
                  "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: none\n"
                  "  containerEdits: {env: [NO_GPU=]}\n");
  std::string after;
  eventually(
      [&] {
        after = http_get(port, "/metrics").second;
        return after.find(R"({value="none",verdict="honoured"} 1)") != std::string::npos;
      },
      15s);
  CHECK_THAT(after, Catch::Contains(R"(gpuguard_device_plugin_value_honoured{value="none",verdict="honoured"} 1)"));
  CHECK_THAT(after, Catch::Contains(R"(gpuguard_device_plugin_node_findings{severity="critical"} 0)"));
  CHECK_THAT(plugin.log(), Catch::Contains(R"("msg":"node report","none":"honoured")"));
  CHECK(plugin.terminate() == 0);
}

namespace {

// NVIDIA's device plugin (alone or under the GPU Operator) serving nvidia.com/gpu on nvidia-gpu.sock; its
// socket file stays when it is gone.
class NvidiaPluginSocket {
 public:
  explicit NvidiaPluginSocket(const fs::path& plugin_dir) : path_((plugin_dir / "nvidia-gpu.sock").string()) {
    fs::remove(path_);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path_.c_str(), path_.size() + 1);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::listen(fd_, 4) == 0);
  }
  ~NvidiaPluginSocket() { ::close(fd_); }
  NvidiaPluginSocket(const NvidiaPluginSocket&) = delete;
  NvidiaPluginSocket& operator=(const NvidiaPluginSocket&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

TEST_CASE(
    "gpus auto: where NVIDIA's plugin answers for the resource, the GPUs are reported, not served, and GPUs held "
    "twice still counted") {
  Node node;
  nvidia_cdi_mode_by_default(node);
  FakeKubelet kubelet(node.plugin_dir);
  auto nvidia = std::make_unique<NvidiaPluginSocket>(node.plugin_dir);
  // A pod still holds GPU 1 as gpuguard's plugin gave it before this start, and a replica of it from NVIDIA's
  // plugin (one pod is enough: two servers gave it).
  const fs::path socket = node.host.root() / "pod-resources.sock";
  FakePodResources offers(socket);
  offers.hold({{"nvidia.com/gpu.shared", {kGpu1 + "::3"}}, {"nvidia.com/gpu", {kGpu1}}});
  {
    PluginProcess plugin(node.plugin_dir, node.host.root(),
                         {"--gpus", "auto", "--cdi-root", "", "--host-device", "github.com/fuse=/dev/fuse",
                          "--pod-resources-socket", socket.string()});
    const int port = plugin.status_port();
    // The host device is still served; the GPUs are not registered, and no CDI spec is written for them.
    const auto registered = kubelet.wait_for(1);
    REQUIRE(registered.size() == 1);
    CHECK(registered[0].resource_name() == "github.com/fuse");
    std::string metrics;
    eventually([&] {
      metrics = http_get(port, "/metrics").second;
      return metrics.find("value_honoured") != std::string::npos;
    });
    CHECK_THAT(metrics, Catch::Contains("gpus=\"report-only\"} 1"));
    // The node is judged all the same: on a GPU Operator node the condition exists too.
    CHECK_THAT(metrics, Catch::Contains(R"(gpuguard_device_plugin_value_honoured{value="void",verdict="honoured"} 1)"));
    CHECK(http_get(port, "/readyz").first == "200");
    CHECK_THAT(plugin.log(), Catch::Contains("GPUs not served: the node is judged and reported only") &&
                                 Catch::Contains("nvidia-gpu.sock answers"));
    wait_for_passes(port, 2);
    CHECK(kubelet.wait_for(1, 0ms).size() == 1);  // nothing registered since
    // Nothing withheld, since nothing is served; the GPU held twice is counted and said.
    CHECK(eventually([&] { return plugin_series(port, "gpuguard_device_plugin_gpus_held_twice") == 1; }, 10s));
    CHECK(plugin_series(port, "gpuguard_device_plugin_gpus_served_elsewhere") == 0);
    CHECK_THAT(plugin.log(), Catch::Contains("GPU held twice") && !Catch::Contains("GPU withheld"));
    CHECK(plugin.terminate() == 0);
  }
}

TEST_CASE("gpus auto: served where NVIDIA's plugin never was, and once it is, left to it, also after it fails") {
  Node node;
  auto kubelet = std::make_unique<FakeKubelet>(node.plugin_dir);
  PluginProcess plugin(node.plugin_dir, node.host.root(),
                       {"--gpus", "auto", "--cdi-root", "", "--host-device", "github.com/fuse=/dev/fuse"});
  const int port = plugin.status_port();
  REQUIRE(kubelet->wait_for(2).size() == 2);
  // The kubelet restarts (it empties its plugin directory) and NVIDIA's plugin starts: both register, and
  // the kubelet would keep whichever came last; gpuguard's leaves the GPUs to it, the host device its own.
  const auto restart_kubelet = [&] {
    kubelet.reset();
    for (const auto& entry : fs::directory_iterator(node.plugin_dir)) {
      if (entry.is_socket() && entry.path().filename() != "nvidia-gpu.sock") fs::remove(entry.path());
    }
    kubelet = std::make_unique<FakeKubelet>(node.plugin_dir);
    const auto registered = kubelet->wait_for(1);
    REQUIRE(registered.size() == 1);
    CHECK(registered[0].resource_name() == "github.com/fuse");
    wait_for_passes(port, 2);
    CHECK(kubelet->wait_for(2, 0ms).size() == 1);
  };
  // NVIDIA's plugin starts beside it, on its own socket: gpuguard's leaves that file alone.
  auto nvidia = std::make_unique<NvidiaPluginSocket>(node.plugin_dir);
  struct stat nvidia_file {};
  REQUIRE(::stat(nvidia->path().c_str(), &nvidia_file) == 0);
  wait_for_passes(port, 2);
  struct stat after {};
  REQUIRE(::stat(nvidia->path().c_str(), &after) == 0);
  CHECK(after.st_ino == nvidia_file.st_ino);
  restart_kubelet();
  CHECK_THAT(plugin.log(), Catch::Contains("not registered: another plugin serves the resource"));
  // NVIDIA's plugin fails, its socket gone too, and the kubelet restarts: the GPUs stay NVIDIA's, since
  // its DaemonSet brings it back, and two plugins taking turns would hand the same GPUs out twice.
  const std::string path = nvidia->path();
  nvidia.reset();
  fs::remove(path);
  restart_kubelet();
  CHECK(plugin.terminate() == 0);
}

TEST_CASE(
    "NVIDIA's plugin answering for the same name: no list is sent to the kubelet after it, the stream kept open") {
  // Since Kubernetes 1.37 the kubelet keeps both endpoints under one name and takes the last list sent as
  // the resource's devices: gpuguard's list withholding every GPU (the same-name check), sent after
  // NVIDIA's, left the node offering none of them (e2e:node/nvidia-device-plugin, on the real kubelet).
  // Ending the stream instead would close NVIDIA's client on a kubelet before 1.37 (one client per name).
  for (const char* gpus : {"serve", "auto"}) {
    INFO(gpus);
    Node node;
    FakeKubelet kubelet(node.plugin_dir);
    const fs::path socket = node.host.root() / "pod-resources.sock";
    FakePodResources offers(socket);
    auto plugin = std::make_unique<PluginProcess>(
        node.plugin_dir, node.host.root(),
        std::vector<std::string>{"--gpus", gpus, "--cdi-root", "", "--pod-resources-socket", socket.string()});
    const auto registered = kubelet.wait_for(1);
    REQUIRE(registered.size() == 1);
    auto client = plugin_client(node.plugin_dir, registered[0].endpoint());
    DeviceWatch watch(*client);
    REQUIRE(watch.until(kGpu0, "Healthy"));  // served while no other plugin answers for the name
    NvidiaPluginSocket nvidia(node.plugin_dir);
    // The same-name check withholds every GPU within a check or two, which would send a list marking them
    // unhealthy; none reaches the kubelet, and the stream stays open until the plugin stops.
    auto next = std::async(std::launch::async, [&watch] { return watch.next(); });
    eventually([&] { return plugin->log().find("no more device lists sent") != std::string::npos; });
    const int port = plugin->status_port();
    eventually([&] { return plugin_series(port, "gpuguard_device_plugin_gpus_served_elsewhere") == 2; });
    CHECK_THAT(http_get(port, "/metrics").second,
               Catch::Contains(R"(gpuguard_device_plugin_devices{resource="nvidia.com/gpu",health="unhealthy"} 2)"));
    CHECK(next.wait_for(3s) == std::future_status::timeout);  // nothing sent, the stream still open
    CHECK(kubelet.wait_for(2, 0ms).size() == 1);              // nor registered again
    CHECK_THAT(plugin->log(), Catch::Contains("nvidia-gpu.sock answers"));
    CHECK(plugin->terminate() == 0);
    CHECK_FALSE(next.get());  // the stream ended with the plugin, no list in between
  }
}

TEST_CASE("gpus auto: GPUs left to NVIDIA's plugin at start stay withheld at the next start, its socket gone") {
  // The kubelet's start removes NVIDIA's socket; until NVIDIA's plugin registers again, the pods it gave the
  // GPUs to still hold them. A start of gpuguard's in that window must not serve them (issue 51).
  Node node;
  FakeKubelet kubelet(node.plugin_dir);
  const fs::path socket = node.host.root() / "pod-resources.sock";
  FakePodResources offers(socket);
  const std::vector<std::string> flags = {"--gpus",       "auto", "--cdi-root", "", "--pod-resources-socket",
                                          socket.string()};
  const fs::path record = node.plugin_dir / "gpuguard" / "served-elsewhere";
  {
    NvidiaPluginSocket nvidia(node.plugin_dir);
    PluginProcess plugin(node.plugin_dir, node.host.root(), flags);
    CHECK(eventually([&] { return http_get(plugin.status_port(), "/readyz").first == "200"; }));
    CHECK(plugin.terminate() == 0);
    CHECK(kubelet.wait_for(1, 0ms).empty());
    CHECK_THAT(plugin.log(), Catch::Contains("GPUs recorded as served elsewhere"));
    fs::remove(nvidia.path());
  }
  REQUIRE(fs::exists(record));
  CHECK_THAT(read_file(record), Catch::Contains(kGpu0 + " left to another plugin at start: NVIDIA's") &&
                                    Catch::Contains(kGpu1 + " left to another plugin at start"));

  PluginProcess plugin(node.plugin_dir, node.host.root(), flags);
  const auto registered = kubelet.wait_for(1);
  REQUIRE(registered.size() == 1);
  CHECK(registered[0].resource_name() == "nvidia.com/gpu");
  const int port = plugin.status_port();
  CHECK(eventually([&] { return http_get(port, "/readyz").first == "200"; }));
  CHECK(plugin_series(port, "gpuguard_device_plugin_kubelet_offers_read") == 1);
  CHECK(plugin_series(port, "gpuguard_device_plugin_gpus_served_elsewhere") == 2);
  CHECK_THAT(http_get(port, "/metrics").second,
             Catch::Contains(R"(gpuguard_device_plugin_devices{resource="nvidia.com/gpu",health="unhealthy"} 2)"));
  CHECK_THAT(plugin.log(), Catch::Contains("withheld since an earlier start"));
  CHECK(plugin.terminate() == 0);
}

TEST_CASE("gpus auto: a socket NVIDIA's plugin left when it failed leaves the GPUs to it from the start") {
  Node node;
  nvidia_cdi_mode_by_default(node);
  FakeKubelet kubelet(node.plugin_dir);
  auto nvidia = std::make_unique<NvidiaPluginSocket>(node.plugin_dir);
  nvidia.reset();  // the file stays: a plugin that stops removes it, one that fails does not
  PluginProcess plugin(node.plugin_dir, node.host.root(), {"--gpus", "auto", "--cdi-root", ""});
  const int port = plugin.status_port();
  CHECK(eventually([&] { return http_get(port, "/readyz").first == "200"; }));
  wait_for_passes(port, 2);
  CHECK(kubelet.wait_for(1, 0ms).empty());
  CHECK_THAT(plugin.log(), Catch::Contains("is there and does not answer"));
  CHECK(plugin.terminate() == 0);
}

TEST_CASE(
    "other plugins: every GPU withheld until the kubelet says what it offers, then those it offers under "
    "another resource, for good") {
  Node node;
  FakeKubelet kubelet(node.plugin_dir);
  const fs::path socket = node.host.root() / "pod-resources.sock";
  PluginProcess plugin(node.plugin_dir, node.host.root(),
                       {"--cdi-root", "", "--pod-resources-socket", socket.string()});
  const int port = plugin.status_port();
  const auto registered = kubelet.wait_for(1);
  REQUIRE(registered.size() == 1);
  auto gpus = plugin_client(node.plugin_dir, registered[0].endpoint());
  DeviceWatch watch(*gpus);
  // No pod-resources socket yet: registered, every GPU Unhealthy.
  const auto first = watch.next();
  REQUIRE(first);
  REQUIRE(first->devices_size() == 2);
  CHECK(first->devices(0).health() == "Unhealthy");
  CHECK(first->devices(1).health() == "Unhealthy");
  CHECK(eventually([&] { return plugin_series(port, "gpuguard_device_plugin_kubelet_offers_errors_total") >= 1; }));
  CHECK(plugin_series(port, "gpuguard_device_plugin_kubelet_offers_read") == 0);
  CHECK(http_get(port, "/readyz").first == "503");  // registered, the GPUs not yet checked
  // The kubelet answers: NVIDIA's renamed time-slicing serves GPU 1 as nvidia.com/gpu.shared.
  auto offers = std::make_unique<FakePodResources>(socket);
  offers->offer({{"nvidia.com/gpu", {kGpu0, kGpu1}}, {"nvidia.com/gpu.shared", {kGpu1 + "::0", kGpu1 + "::1"}}});
  REQUIRE(watch.until(kGpu0, "Healthy"));
  CHECK(eventually([&] { return plugin_series(port, "gpuguard_device_plugin_gpus_served_elsewhere") == 1; }));
  CHECK(plugin_series(port, "gpuguard_device_plugin_kubelet_offers_read") == 1);
  CHECK(eventually([&] { return http_get(port, "/readyz").first == "200"; }));
  v1beta1::AllocateResponse allocated;
  CHECK(allocate(*gpus, {kGpu0}, allocated).ok());
  CHECK_THAT(plugin.log(), Catch::Contains("GPU withheld: another plugin serves it here") &&
                               Catch::Contains("the kubelet offers it as nvidia.com/gpu.shared"));
  // That plugin gone, and the kubelet's socket too for a while: GPU 1 stays withheld.
  offers->offer({{"nvidia.com/gpu", {kGpu0, kGpu1}}});
  const int asked = offers->asked();
  CHECK(eventually([&] { return offers->asked() >= asked + 2; }, 10s));
  offers.reset();
  fs::remove(socket);
  CHECK(
      eventually([&] { return plugin_series(port, "gpuguard_device_plugin_kubelet_offers_errors_total") >= 2; }, 10s));
  const auto metrics = http_get(port, "/metrics").second;
  CHECK_THAT(metrics,
             Catch::Contains(R"(gpuguard_device_plugin_devices{resource="nvidia.com/gpu",health="healthy"} 1)"));
  CHECK_THAT(metrics,
             Catch::Contains(R"(gpuguard_device_plugin_devices{resource="nvidia.com/gpu",health="unhealthy"} 1)"));
  CHECK(plugin.terminate() == 0);
}

TEST_CASE(
    "other plugins: a GPU a pod holds under another resource is withheld, though no plugin offers it now, and held "
    "twice while a pod holds it through gpuguard's too") {
  Node node;
  FakeKubelet kubelet(node.plugin_dir);
  const fs::path socket = node.host.root() / "pod-resources.sock";
  // After a reboot: the kubelet still knows the pod NVIDIA's plugin gave a replica of GPU 1, and that
  // plugin has not registered again.
  FakePodResources offers(socket);
  offers.hold({{"nvidia.com/gpu.shared", {kGpu1 + "::3"}}});
  PluginProcess plugin(node.plugin_dir, node.host.root(),
                       {"--cdi-root", "", "--pod-resources-socket", socket.string()});
  const auto registered = kubelet.wait_for(1);
  REQUIRE(registered.size() == 1);
  auto gpus = plugin_client(node.plugin_dir, registered[0].endpoint());
  DeviceWatch watch(*gpus);
  REQUIRE(watch.until(kGpu0, "Healthy"));
  const int port = plugin.status_port();
  CHECK(plugin_series(port, "gpuguard_device_plugin_gpus_served_elsewhere") == 1);
  CHECK_THAT(http_get(port, "/metrics").second,
             Catch::Contains(R"(gpuguard_device_plugin_devices{resource="nvidia.com/gpu",health="unhealthy"} 1)"));
  CHECK_THAT(plugin.log(), Catch::Contains("the kubelet offers it as nvidia.com/gpu.shared"));
  CHECK(plugin_series(port, "gpuguard_device_plugin_gpus_held_twice") == 0);
  // A pod holding GPU 1 through gpuguard's resource too (given before the other plugin served it): held
  // twice, read from the kubelet's List over gRPC at the next check, and said in the log.
  offers.hold({{"nvidia.com/gpu.shared", {kGpu1 + "::3"}}, {"nvidia.com/gpu", {kGpu1}}});
  const auto held_twice = [&](int want) {
    for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;
         std::this_thread::sleep_for(100ms)) {
      if (plugin_series(port, "gpuguard_device_plugin_gpus_held_twice") == want) return true;
    }
    return false;
  };
  CHECK(held_twice(1));
  CHECK_THAT(plugin.log(), Catch::Contains("GPU held twice") && Catch::Contains("/holder (nvidia.com/gpu)") &&
                               Catch::Contains("/holder (nvidia.com/gpu.shared)"));
  offers.hold({{"nvidia.com/gpu", {kGpu1}}});
  CHECK(held_twice(0));
  CHECK(plugin.terminate() == 0);
}

TEST_CASE(
    "other plugins: a GPU a pod holds through a DRA claim is withheld, by its minor or its UUID, though no slice "
    "publishes it") {
  Node node;
  FakeKubelet kubelet(node.plugin_dir);
  const fs::path socket = node.host.root() / "pod-resources.sock";
  // DRA drivers gone (or their slices not read: no API here), a pod still holding what they gave: NVIDIA's
  // GPU by its name, gpu-<minor> (GPU 1's minor is 1), its CDI device a claim's; another driver's device
  // whose CDI device names GPU 0 by UUID.
  FakePodResources offers(socket);
  offers.hold_claimed(
      {{"gpu.nvidia.com", "node-a", "gpu-1", {"k8s.gpu.nvidia.com/claim=6f1c2e0a-7d4b-4c1e-9a55-2f3b8c9d0e11-gpu-1"}},
       {"gpu.example.com", "node-a", "dev-0", {"example.com/gpu=" + kGpu0}}});
  PluginProcess plugin(node.plugin_dir, node.host.root(),
                       {"--cdi-root", "", "--pod-resources-socket", socket.string()});
  const auto registered = kubelet.wait_for(1);
  REQUIRE(registered.size() == 1);
  // Withheld for those reasons, not only until the kubelet's first answer.
  // The log line that withholds the GPU, with the reason.
  const auto withheld = [&](const std::string& gpu, const std::string& reason) {
    std::istringstream lines(plugin.log());
    for (std::string line; std::getline(lines, line);) {
      if (line.find(R"("gpu":")" + gpu + '"') != std::string::npos &&
          line.find(R"("reason":")" + reason + '"') != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  CHECK(eventually([&] {
    return withheld(kGpu1, "a pod holds it through DRA driver gpu.nvidia.com") &&
           withheld(kGpu0, "a pod holds it through DRA driver gpu.example.com");
  }));
  CHECK(plugin.log().find("names no GPU of this node") == std::string::npos);
  auto gpus = plugin_client(node.plugin_dir, registered[0].endpoint());
  DeviceWatch watch(*gpus);
  CHECK(watch.health() == std::map<std::string, std::string>{{kGpu0, "Unhealthy"}, {kGpu1, "Unhealthy"}});
  CHECK(plugin_series(plugin.status_port(), "gpuguard_device_plugin_gpus_served_elsewhere") == 2);
  CHECK(plugin.terminate() == 0);
}

namespace {

// What a fresh node's plugin makes of one pod on it that has registered and published nothing (its image
// still pulling, say), beside one of NVIDIA's that serves no GPUs, with the GPU infrastructure's namespaces
// as the chart passes its built-in ones: each GPU's health, the withheld count, and the plugin's log.
struct PodJudged {
  std::map<std::string, std::string> health;
  long long served_elsewhere;
  std::string log;
};

PodJudged judged_with_pod(const std::string& pod_namespace, const std::string& name,
                          const std::vector<std::string>& containers) {
  Node node;
  FakeKubelet kubelet(node.plugin_dir);
  const fs::path socket = node.host.root() / "pod-resources.sock";
  FakePodResources offers(socket);
  offers.run_pod(pod_namespace, name, containers);
  offers.run_pod("gpu-operator", "gpu-feature-discovery-4wq9z", {"gpu-feature-discovery"});
  PluginProcess plugin(node.plugin_dir, node.host.root(),
                       {"--cdi-root", "", "--pod-resources-socket", socket.string(), "--infrastructure-namespaces",
                        "gpu-operator,kube-system,nvidia-device-plugin"});
  const auto registered = kubelet.wait_for(1);
  REQUIRE(registered.size() == 1);
  const int port = plugin.status_port();
  // Judged: the kubelet has answered and the plugin is ready.
  CHECK(eventually([&] { return http_get(port, "/readyz").first == "200"; }));
  auto gpus = plugin_client(node.plugin_dir, registered[0].endpoint());
  DeviceWatch watch(*gpus);
  PodJudged judged{watch.health(), plugin_series(port, "gpuguard_device_plugin_gpus_served_elsewhere"), plugin.log()};
  CHECK(plugin.terminate() == 0);
  return judged;
}

std::map<std::string, std::string> both_gpus(const std::string& health) { return {{kGpu0, health}, {kGpu1, health}}; }

}  // namespace

TEST_CASE(
    "other plugins: NVIDIA's plugin's pod in a GPU-infrastructure namespace withholds every GPU before it registers, a "
    "tenant's pod of that name none") {
  for (const std::string pod_namespace : {"nvidia-device-plugin", "team-a"}) {
    DYNAMIC_SECTION("NVIDIA's plugin's pod in " << pod_namespace) {
      const PodJudged judged =
          judged_with_pod(pod_namespace, "nvdp-nvidia-device-plugin-x7k2p", {"nvidia-device-plugin-ctr"});
      const bool infrastructure = pod_namespace == "nvidia-device-plugin";
      CHECK(judged.health == both_gpus(infrastructure ? "Unhealthy" : "Healthy"));
      CHECK(judged.served_elsewhere == (infrastructure ? 2 : 0));
      CHECK((judged.log.find("NVIDIA's device plugin runs on this node (pod nvidia-device-plugin/"
                             "nvdp-nvidia-device-plugin-x7k2p, container nvidia-device-plugin-ctr)") !=
             std::string::npos) == infrastructure);
    }
  }
}

TEST_CASE(
    "other plugins: NVIDIA's DRA kubelet plugin's pod in a GPU-infrastructure namespace withholds every GPU before it "
    "publishes, one for compute domains alone or a tenant's none") {
  // The GPU Operator's DRA mode: its kubelet plugin's pod, both containers, before any ResourceSlice; with
  // its GPUs off (compute domains alone); a tenant's pod of that shape.
  struct Case {
    std::string pod_namespace;
    std::vector<std::string> containers;
    bool withheld;
  };
  for (const Case& c :
       {Case{"gpu-operator", {"gpus", "compute-domains"}, true}, Case{"gpu-operator", {"compute-domains"}, false},
        Case{"team-a", {"gpus", "compute-domains"}, false}}) {
    DYNAMIC_SECTION("the kubelet plugin's pod in " << c.pod_namespace << " with " << c.containers.size()
                                                   << " containers") {
      const PodJudged judged = judged_with_pod(c.pod_namespace, "nvidia-dra-driver-kubelet-plugin-7x2kq", c.containers);
      CHECK(judged.health == both_gpus(c.withheld ? "Unhealthy" : "Healthy"));
      CHECK(judged.served_elsewhere == (c.withheld ? 2 : 0));
      CHECK((judged.log.find("NVIDIA's DRA driver runs on this node (pod gpu-operator/"
                             "nvidia-dra-driver-kubelet-plugin-7x2kq, container gpus)") != std::string::npos) ==
            c.withheld);
    }
  }
}

TEST_CASE("gpus report-only: nothing registered for the GPUs, ready once the node is judged") {
  Node node;
  nvidia_cdi_mode_by_default(node);
  // No kubelet at all: the smaller DaemonSet on GPU Operator nodes mounts no device plugin directory.
  // The kubelet's offers named too: only `auto` leaving the GPUs to another plugin records them.
  PluginProcess plugin(node.plugin_dir, node.host.root(),
                       {"--gpus", "report-only", "--cdi-root", "", "--pod-resources-socket",
                        (node.host.root() / "pod-resources.sock").string()});
  const int port = plugin.status_port();
  CHECK(eventually([&] { return http_get(port, "/readyz").first == "200"; }));
  CHECK_FALSE(fs::exists(node.plugin_dir / "gpuguard"));
  CHECK_THAT(http_get(port, "/metrics").second,
             Catch::Contains(R"(gpuguard_device_plugin_value_honoured{value="none",verdict="breaks-pods"} 0)"));
  CHECK_THAT(plugin.log(), Catch::Contains("--gpus report-only"));
  CHECK_THAT(http_get(port, "/metrics").second, Catch::Contains("gpuguard_device_plugin_gpus_held_twice 0"));
  CHECK(plugin.terminate() == 0);
  // As that DaemonSet runs it, with no pod-resources socket (it mounts none): what pods hold is not read.
  PluginProcess unread(node.plugin_dir, node.host.root(),
                       {"--gpus", "report-only", "--cdi-root", "", "--pod-resources-socket", ""});
  const int unread_port = unread.status_port();
  CHECK(eventually([&] { return http_get(unread_port, "/readyz").first == "200"; }));
  CHECK_THAT(http_get(unread_port, "/metrics").second, !Catch::Contains("gpuguard_device_plugin_kubelet_offers") &&
                                                           !Catch::Contains("gpuguard_device_plugin_gpus_held_twice"));
  CHECK(unread.terminate() == 0);
}

TEST_CASE("SIGTERM during the start-up ends in the orderly stop, not in death by the signal") {
  Node node;
  FakeKubelet kubelet(node.plugin_dir);
  PluginProcess plugin(node.plugin_dir, node.host.root(), {"--host-device", "github.com/fuse=/dev/fuse:4"});
  // Its first line comes from discovery, before its files, its sockets and its status server: the signal
  // is sent while it is still starting.
  // Looked at every millisecond: the signal must come while it is still starting.
  eventually([&] { return plugin.log().find("GPUs found") != std::string::npos; }, 5s, 1ms);
  REQUIRE_THAT(plugin.log(), Catch::Contains("GPUs found"));
  CHECK(plugin.terminate() == 0);
  CHECK_THAT(plugin.log(), Catch::Contains("serving probes and metrics"));
}

TEST_CASE("cdi mode without a device none: the plugin adds one, a spec the CDI reference implementation reads") {
  Node node;
  nvidia_cdi_mode_by_default(node);
  node.host.write("etc/cdi/nvidia.yaml",
                  "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n"
                  "  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}\n");
  PluginProcess plugin(node.plugin_dir, node.host.root(), {});
  const int port = plugin.status_port();
  CHECK_THAT(http_get(port, "/metrics").second,
             Catch::Contains(R"(gpuguard_device_plugin_value_honoured{value="none",verdict="honoured"} 1)"));
  const fs::path spec_file = node.host.root() / "var/run/cdi/gpuguard-none-nvidia.com-gpu.json";
  std::ifstream in(spec_file);
  REQUIRE(in);
  CHECK(nlohmann::json::parse(in) == nlohmann::json::parse(R"({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
    "devices": [{"name": "none", "containerEdits": {"env": ["GPUGUARD_EMPTY_DEVICE="]}}]})"));
  const std::string validate = std::string(GPUGUARD_CDI_VALIDATE) + " " + spec_file.string();
  CHECK(WEXITSTATUS(std::system(validate.c_str())) == 0);
  CHECK(plugin.terminate() == 0);
  // Started again, it finds the device and writes nothing more.
  PluginProcess again(node.plugin_dir, node.host.root(), {});
  again.status_port();
  CHECK_THAT(again.log(), !Catch::Contains("CDI device none written"));
  CHECK(again.terminate() == 0);
}

TEST_CASE("probes and metrics: ready once registered, the discovery and health source, devices by health") {
  Node node;
  PluginProcess plugin(node.plugin_dir, node.host.root(), {"--host-device", "github.com/fuse=/dev/fuse:2"});
  const int port = plugin.status_port();
  CHECK(http_get(port, "/healthz").first == "200");
  CHECK(http_get(port, "/readyz").first == "503");  // no kubelet yet
  CHECK(http_get(port, "/mutate").first == "404");

  FakeKubelet kubelet(node.plugin_dir);
  REQUIRE(kubelet.wait_for(2).size() == 2);
  CHECK(eventually([&] { return http_get(port, "/readyz").first == "200"; }));
  const std::string metrics = http_get(port, "/metrics").second;
  check_promtool_clean(metrics);
  CHECK_THAT(metrics, Catch::Contains("gpuguard_device_plugin_info{version=\"") &&
                          Catch::Contains("\",discovery=\"procfs\",health=\"presence\",gpus=\"served\"} 1"));
  CHECK_THAT(metrics,
             Catch::Contains("gpuguard_device_plugin_devices{resource=\"nvidia.com/gpu\",health=\"healthy\"} 2"));
  CHECK_THAT(metrics,
             Catch::Contains("gpuguard_device_plugin_devices{resource=\"github.com/fuse\",health=\"healthy\"} 2"));
  CHECK_THAT(metrics, Catch::Contains("gpuguard_device_plugin_registered 1"));

  auto gpus = plugin_client(node.plugin_dir, "gpuguard-nvidia-com-gpu.sock");
  DeviceWatch watch(*gpus);
  node.host.remove("/dev/nvidia1");
  REQUIRE(watch.until(kGpu1, "Unhealthy"));
  CHECK_THAT(http_get(port, "/metrics").second,
             Catch::Contains("gpuguard_device_plugin_devices{resource=\"nvidia.com/gpu\",health=\"unhealthy\"} 1"));
  // Without NVML (no NVIDIA driver on this machine), auto falls back to procfs and says so at warn level.
  CHECK(plugin.terminate() == 0);
  PluginProcess automatic(node.plugin_dir, node.host.root(), {"--discovery", "auto"});
  const std::string source = http_get(automatic.status_port(), "/metrics").second;
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml == nullptr) {
    CHECK_THAT(automatic.log(),
               Catch::Contains("\"level\":\"warn\",\"msg\":\"NVML not available: GPUs discovered through procfs"));
    CHECK_THAT(source, Catch::Contains("discovery=\"procfs\",health=\"presence\",gpus=\"served\"} 1"));
  } else {
    dlclose(nvml);
    CHECK_THAT(source, Catch::Contains("discovery=\"nvml\",health=\"nvml\",gpus=\"served\"} 1"));
  }
}

TEST_CASE(
    "discovery none serves host devices only, even on a GPU node, and --health-checks=false keeps devices Healthy") {
  Node node;
  FakeKubelet kubelet(node.plugin_dir);
  PluginProcess plugin(
      node.plugin_dir, node.host.root(),
      {"--discovery", "none", "--host-device", "github.com/fuse=/dev/fuse", "--health-checks", "false"});
  const auto registrations = kubelet.wait_for(1);
  REQUIRE(registrations.size() == 1);
  CHECK(registrations[0].resource_name() == "github.com/fuse");
  const std::string metrics = http_get(plugin.status_port(), "/metrics").second;
  CHECK_THAT(metrics, Catch::Contains("discovery=\"none\",health=\"off\",gpus=\"none\"} 1"));
  CHECK_THAT(metrics, Catch::Contains("github.com/fuse\",health=\"healthy\"} 1"));
  CHECK_FALSE(fs::exists(node.plugin_dir / "gpuguard-nvidia-com-gpu.sock"));
  CHECK(plugin.terminate() == 0);
}

TEST_CASE("kubelet restart: sockets deleted and kubelet.sock re-created, every resource back within 5 s") {
  Node node;
  auto kubelet = std::make_unique<FakeKubelet>(node.plugin_dir);
  PluginProcess plugin(node.plugin_dir, node.host.root(), {"--host-device", "github.com/fuse=/dev/fuse"});
  const int port = plugin.status_port();
  REQUIRE(kubelet->wait_for(2).size() == 2);

  // What the kubelet does on restart: remove every socket in the directory, then serve a new kubelet.sock.
  kubelet.reset();
  for (const auto& entry : fs::directory_iterator(node.plugin_dir)) {
    if (entry.is_socket()) fs::remove(entry.path());
  }
  SECTION("the plugin sees the kubelet gone, and its own sockets too, before the new kubelet is there") {
    REQUIRE(eventually([&] { return plugin_series(port, "gpuguard_device_plugin_registered") == 0; }, 5s));
  }
  SECTION("the new kubelet is there at once: the plugin finds both in one pass") {
    // A new kubelet.sock may take the old one's inode number: only a registration after serving again counts.
  }
  const auto restarted = std::chrono::steady_clock::now();
  kubelet = std::make_unique<FakeKubelet>(node.plugin_dir);
  REQUIRE(kubelet->wait_for(2).size() == 2);
  CHECK(std::chrono::steady_clock::now() - restarted < 5s);
  CHECK(fs::is_socket(node.plugin_dir / "gpuguard-nvidia-com-gpu.sock"));
  CHECK(fs::is_socket(node.plugin_dir / "gpuguard-github-com-fuse.sock"));
  v1beta1::AllocateResponse response;
  CHECK(allocate(*plugin_client(node.plugin_dir, "gpuguard-nvidia-com-gpu.sock"), {kGpu0}, response).ok());
  CHECK(plugin.terminate() == 0);
}

// The kubelet restarts a crashed plugin's container: the new process finds the socket the killed one left
// in the plugin directory, which nothing answers. Taking it for its own, it registered an endpoint that
// the kubelet could not reach, again and again, until the kubelet itself restarted (found on the real
// node, node/plugin-killed).
TEST_CASE("a plugin killed with SIGKILL and started again serves a new socket and registers it") {
  Node node;
  FakeKubelet kubelet(node.plugin_dir);
  {
    PluginProcess killed(node.plugin_dir, node.host.root(), {"--host-device", "github.com/fuse=/dev/fuse"});
    REQUIRE(kubelet.wait_for(2).size() == 2);
  }  // SIGKILL: its sockets stay
  REQUIRE(fs::is_socket(node.plugin_dir / "gpuguard-nvidia-com-gpu.sock"));
  PluginProcess plugin(node.plugin_dir, node.host.root(), {"--host-device", "github.com/fuse=/dev/fuse"});
  CHECK(kubelet.wait_for(4).size() == 4);  // each taken only once its endpoint answered
  v1beta1::AllocateResponse response;
  CHECK(allocate(*plugin_client(node.plugin_dir, "gpuguard-nvidia-com-gpu.sock"), {kGpu0}, response).ok());
  CHECK(plugin.terminate() == 0);
}

TEST_CASE("a node without GPUs serves its host devices and keeps running") {
  FakeHost host("no-gpu");
  host.add_device("/dev/fuse");
  const fs::path dir = host.root() / "plugins";
  fs::create_directories(dir);
  FakeKubelet kubelet(dir);
  PluginProcess plugin(dir, host.root(), {"--host-device", "github.com/fuse=/dev/fuse:16"});
  const auto registrations = kubelet.wait_for(1);
  REQUIRE(registrations.size() == 1);
  CHECK(registrations[0].resource_name() == "github.com/fuse");
  wait_for_passes(plugin.status_port(), 2);
  CHECK(kubelet.wait_for(1, 0ms).size() == 1);  // no crash loop, no second registration
  CHECK(plugin.terminate() == 0);
  CHECK_THAT(plugin.log(), Catch::Contains("no NVIDIA GPU found"));
}

TEST_CASE("forget-node: what the plugin wrote on the node is removed after an uninstall, and nothing else") {
  Node node;
  nvidia_cdi_mode_by_default(node);  // so that the plugin also writes its spec of the device none
  const std::string features = "/etc/kubernetes/node-feature-discovery/features.d/gpuguard";
  const std::vector<std::string> flags = {"--cdi-root", "/var/run/cdi", "--nfd-feature-file",
                                          features,     "--mps-root",   "/run/gpuguard/mps"};
  const fs::path cdi = node.host.root() / "var/run/cdi";
  {
    FakeKubelet kubelet(node.plugin_dir);
    PluginProcess plugin(node.plugin_dir, node.host.root(), flags);
    REQUIRE(kubelet.wait_for(1).size() == 1);
    CHECK(plugin.terminate() == 0);
  }
  std::vector<std::string> written;
  for (const auto& entry : fs::directory_iterator(cdi)) written.push_back(entry.path().filename().string());
  std::sort(written.begin(), written.end());
  REQUIRE(written == std::vector<std::string>{"gpuguard-none-nvidia.com-gpu.json", "k8s.gpuguard.io-gpu.json"});
  REQUIRE(fs::exists(node.host.root() / features.substr(1)));
  // What is not the plugin's: another vendor's CDI spec, NFD's other feature files, and (an MPS daemon's
  // leftovers) files under the MPS root, which is gpuguard's.
  node.host.write("var/run/cdi/nvidia.yaml", "cdiVersion: 0.5.0\n");
  node.host.write("etc/kubernetes/node-feature-discovery/features.d/other", "x=y\n");
  node.host.write("run/gpuguard/mps/" + kGpu0 + "/log/control.log", "");
  // The record of the GPUs it withheld as served elsewhere, beside the kubelet's own checkpoint.
  node.host.write("var/lib/kubelet/device-plugins/gpuguard/served-elsewhere", kGpu1 + " the kubelet offers it\n");
  node.host.write("var/lib/kubelet/device-plugins/kubelet_internal_checkpoint", "{}");
  // The node enforcer's mask check, copied where the chart has it, and a copy cut short under the name of its
  // own an enforcer writes it by; another file in /var/lib stays.
  node.host.write("var/lib/gpuguard/bin/gpuguard-mask-check", "ELF");
  node.host.write("var/lib/gpuguard/bin/.gpuguard-mask-check.Ab12Cd", "EL");
  node.host.write("var/lib/other/keep", "");

  std::string args = "forget-node --host-root " + node.host.root().string();
  for (const std::string& flag : flags) args += " " + flag;
  const ExitResult result = run_binary(GPUGUARD_DEVICE_PLUGIN_BIN, args);
  INFO(result.output);
  CHECK(result.status == 0);
  CHECK_FALSE(fs::exists(cdi / "k8s.gpuguard.io-gpu.json"));
  CHECK_FALSE(fs::exists(cdi / "gpuguard-none-nvidia.com-gpu.json"));
  CHECK_FALSE(fs::exists(node.host.root() / features.substr(1)));
  CHECK_FALSE(fs::exists(node.host.root() / "run/gpuguard"));
  CHECK_FALSE(fs::exists(node.plugin_dir / "gpuguard"));
  CHECK_FALSE(fs::exists(node.host.root() / "var/lib/gpuguard"));
  CHECK(fs::exists(node.host.root() / "var/lib/other/keep"));
  CHECK(fs::exists(node.plugin_dir / "kubelet_internal_checkpoint"));
  CHECK(fs::exists(cdi / "nvidia.yaml"));
  CHECK(fs::exists(node.host.root() / "etc/kubernetes/node-feature-discovery/features.d/other"));
  // Again, with nothing left to remove: done all the same.
  CHECK(run_binary(GPUGUARD_DEVICE_PLUGIN_BIN, args).status == 0);
  CHECK(run_binary(GPUGUARD_DEVICE_PLUGIN_BIN, "forget-node --no-such-flag").status == 2);
}

TEST_CASE("bad flags are refused with a reason, before anything is served") {
  const std::string bin = GPUGUARD_DEVICE_PLUGIN_BIN;
  CHECK(WEXITSTATUS(std::system((bin + " --host-device fuse=/dev/fuse 2>/dev/null").c_str())) == 2);
  CHECK(WEXITSTATUS(std::system((bin + " --device-list-strategy mounts 2>/dev/null").c_str())) == 2);
  CHECK(WEXITSTATUS(std::system((bin + " --discovery guess 2>/dev/null").c_str())) == 2);
  CHECK(WEXITSTATUS(std::system((bin + " --health-reset-xids 48,x 2>/dev/null").c_str())) == 2);
  CHECK(WEXITSTATUS(std::system((bin + " --health-checks maybe 2>/dev/null").c_str())) == 2);
  CHECK(WEXITSTATUS(std::system((bin + " --discovery nvml --device-plugin-dir /nonexistent 2>/dev/null").c_str())) ==
        1);
}

TEST_CASE(
    "time-slicing some GPUs: the rest stay whole, GPU feature discovery's labels for NFD, and a device not on the node "
    "stops the plugin") {
  Node node;
  node.host.write("plugin.yaml",
                  "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
                  "      rename: nvidia.com/gpu.shared\n      devices: [1]\n      replicas: 3\n");
  const std::string features = "/etc/kubernetes/node-feature-discovery/features.d/gpuguard";
  FakeKubelet kubelet(node.plugin_dir);
  {
    PluginProcess plugin(
        node.plugin_dir, node.host.root(),
        {"--config-file", (node.host.root() / "plugin.yaml").string(), "--nfd-feature-file", features});
    const auto registrations = kubelet.wait_for(2);
    REQUIRE(registrations.size() == 2);
    std::map<std::string, std::string> endpoints;
    for (const auto& r : registrations) endpoints[r.resource_name()] = r.endpoint();
    REQUIRE(endpoints.size() == 2);
    const auto ids = [&](const std::string& resource) {
      const auto client = plugin_client(node.plugin_dir, endpoints.at(resource));
      DeviceWatch watch(*client);
      const auto first = watch.next();
      REQUIRE(first);
      std::vector<std::string> found;
      for (const auto& device : first->devices()) found.push_back(device.id());
      std::sort(found.begin(), found.end());
      return found;
    };
    CHECK(ids("nvidia.com/gpu") == std::vector<std::string>{kGpu0});
    CHECK(ids("nvidia.com/gpu.shared") == std::vector<std::string>{kGpu1 + "::0", kGpu1 + "::1", kGpu1 + "::2"});
    // Written before registering: keyed by the name before the rename, as GFD keys them.
    CHECK(read_file(node.host.root() / features.substr(1)) ==
          "# Written by gpuguard-device-plugin: the labels GPU feature discovery sets for its resources.\n"
          "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\n"
          "nvidia.com/gpu.replicas=3\n"
          "nvidia.com/gpu.sharing-strategy=time-slicing\n");
    CHECK(plugin.terminate() == 0);
  }
  {
    // Serving no GPU, it takes the labels away.
    PluginProcess report_only(node.plugin_dir, node.host.root(),
                              {"--gpus", "report-only", "--cdi-root", "", "--nfd-feature-file", features});
    CHECK(eventually([&] { return !std::filesystem::exists(node.host.root() / features.substr(1)); }, 5s));
    CHECK(report_only.terminate() == 0);
  }
  node.host.write("plugin.yaml",
                  "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
                  "      rename: nvidia.com/gpu.shared\n      devices: [0, 5]\n      replicas: 3\n");
  PluginProcess wrong(node.plugin_dir, node.host.root(),
                      {"--config-file", (node.host.root() / "plugin.yaml").string()});
  CHECK(wrong.wait_exit(5s) == 1);
  CHECK_THAT(wrong.log(),
             Catch::Contains("sharing.timeSlicing.resources[0].devices[1]: nvidia.com/gpu has no device \\\"5\\\""));
}

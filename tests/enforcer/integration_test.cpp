// The real gpuguard-node-enforcer against the runtime's side of NRI as containerd and CRI-O run it
// (e2e/cmd/nri-runtime: NRI's own adaptation library, v0.12.3) over a real unix socket, with a fake
// kubelet serving the pod-resources API over real unix-socket gRPC: every fixture of
// tests/fixtures/enforcer sent through it, registration and reconnection, fail-closed with NRI's default
// validator, garbage and half frames from the runtime, a slow kubelet, and the report of running
// containers.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "../deviceplugin/fake_host.hpp"
#include "child_process.hpp"
#include "eventually.hpp"
#include "fake_apiserver.hpp"
#include "files.hpp"
#include "fixture.hpp"
#include "http_client.hpp"
#include "podresources/v1/api.grpc.pb.h"
#include "promtool.hpp"
#include "property.hpp"
#include "series.hpp"

using namespace gpuguard;
using namespace gpuguard::test;
using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

const fs::path kFixtures = fs::path(GPUGUARD_SOURCE_DIR) / "tests/fixtures/enforcer";

// The kubelet's pod-resources API: List answers the pods set, after `delay`.
class FakeKubelet final : public v1::PodResourcesLister::Service {
 public:
  explicit FakeKubelet(const fs::path& socket) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix://" + socket.string(), grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakeKubelet() override {
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
    server_->Wait();
    // Cleared under the lock the handlers took: gRPC's own ordering of its threads is not visible to
    // ThreadSanitizer, this lock is.
    const std::lock_guard lock(mutex_);
    pods_.clear();
  }
  void set(const std::string& pod_namespace, const std::string& name, const enforcement::PodResources& pod) {
    v1::PodResources converted;
    converted.set_namespace_(pod_namespace);
    converted.set_name(name);
    for (const auto& container : pod.containers) {
      auto* c = converted.add_containers();
      c->set_name(container.name);
      for (const auto& devices : container.devices) {
        for (const auto& id : devices.ids) {  // one entry per device, as the kubelet sends them
          auto* d = c->add_devices();
          d->set_resource_name(devices.resource);
          d->add_device_ids(id);
        }
      }
      if (!container.cdi_devices.empty()) {
        auto* claim = c->add_dynamic_resources()->add_claim_resources();
        for (const auto& device : container.cdi_devices) claim->add_cdi_devices()->set_name(device);
      }
    }
    const std::lock_guard lock(mutex_);
    pods_.push_back(std::move(converted));
  }
  void set_delay(std::chrono::milliseconds delay) { delay_ = delay; }
  // Pads every answer with a pod of `containers` containers with long names: an answer past the enforcer's
  // receive limit, as thousands of containers on a node make one.
  void set_padding(std::size_t containers) {
    v1::PodResources padding;
    padding.set_namespace_("padding");
    padding.set_name("many-containers");
    for (std::size_t i = 0; i < containers; ++i)
      padding.add_containers()->set_name(std::string(200, 'c') + std::to_string(i));
    const std::lock_guard lock(mutex_);
    pods_.push_back(std::move(padding));
  }
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* out) override {
    std::this_thread::sleep_for(delay_.load());
    const std::lock_guard lock(mutex_);
    for (const auto& pod : pods_) *out->add_pod_resources() = pod;
    ++calls_;
    return grpc::Status::OK;
  }
  // Get as the kubelet serves it from 1.34 (KubeletPodResourcesGet on), or refuses it before, as the kubelet
  // says so: code Unknown, "PodResources API Get method disabled".
  void serve_get(bool served) { get_served_ = served; }
  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* in,
                   v1::GetPodResourcesResponse* out) override {
    if (!get_served_) return {grpc::StatusCode::UNKNOWN, "PodResources API Get method disabled"};
    std::this_thread::sleep_for(delay_.load());
    const std::lock_guard lock(mutex_);
    ++calls_;
    for (const auto& pod : pods_) {
      if (pod.namespace_() == in->pod_namespace() && pod.name() == in->pod_name()) {
        *out->mutable_pod_resources() = pod;
        return grpc::Status::OK;
      }
    }
    return {grpc::StatusCode::UNKNOWN, "pod " + in->pod_name() + " in namespace " + in->pod_namespace() + " not found"};
  }
  int calls() {
    const std::lock_guard lock(mutex_);
    return calls_;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::mutex mutex_;
  std::vector<v1::PodResources> pods_;
  std::atomic<std::chrono::milliseconds> delay_{0ms};
  std::atomic<bool> get_served_{false};
  int calls_ = 0;
};

// A node: its host root (GPUs in procfs, CDI specs), its NRI and pod-resources sockets, a policy.
struct Node {
  FakeHost host{"enforcer"};
  fs::path dir = host.root() / "run";
  fs::path nri_socket = dir / "nri.sock";
  fs::path kubelet_socket = dir / "kubelet.sock";
  fs::path policy = dir / "policy";
  Node() {
    fs::create_directories(policy);
    for (const auto& gpu : default_node()) host.add_gpu(gpu.pci_address, gpu.uuid, gpu.minor, 0);
    // As on most hosts, /var/run is a link to the absolute /run: read from inside a pod's view of the host,
    // that is the host's /run, not the pod's (nothing here writes through it).
    fs::create_directories(host.root() / "var");
    fs::create_directory_symlink("/run", host.root() / "var" / "run");
  }
};

std::vector<std::string> enforcer_argv(const Node& node, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {GPUGUARD_NODE_ENFORCER_BIN,
                                   "--nri-socket",
                                   node.nri_socket.string(),
                                   "--pod-resources-socket",
                                   node.kubelet_socket.string(),
                                   "--host-root",
                                   node.host.root().string(),
                                   "--policy-dir",
                                   node.policy.string(),
                                   "--metrics-address",
                                   "127.0.0.1:0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The enforcer, its log in the test's directory.
class EnforcerProcess : public ChildProcess {
 public:
  EnforcerProcess(const Node& node, std::vector<std::string> extra = {}, const fs::path& cgroup = {})
      : ChildProcess(enforcer_argv(node, std::move(extra)), {.log = node.dir / "enforcer.log", .cgroup = cgroup}) {}
  unsigned short port() const { return logged_port("serving probes and metrics"); }
  // The value of one series on /metrics, or -1.
  long long series(const std::string& name) const {
    return series_value(http_request(port(), "GET", "/metrics").body, name);
  }
};

// Runs nri-runtime with `script`. No assertion here: Catch's macros are for the test's own thread only, and
// this runs in another while the test watches the enforcer.
ExitResult run_runtime_process(const Node& node, const json& script, const std::string& flags = "") {
  const fs::path file = node.dir / "script.json";
  std::ofstream(file) << script.dump();
  return run_binary(GPUGUARD_NRI_RUNTIME_BIN, "--socket " + node.nri_socket.string() + " --script " + file.string() +
                                                  " " + flags + " 2>/dev/null");
}

// One step's output as nri-runtime printed it. A field it did not print reads as null, so that a wrong answer
// fails the CHECK that reads it: nlohmann's operator[] on a const object asserts on a missing key, which aborts
// the whole test binary under the sanitizers' builds and leaves the enforcer it started running.
struct Step {
  json fields;
  json operator[](const std::string& key) const { return value(key, json()); }
  json value(const std::string& key, const json& otherwise) const { return contains(key) ? fields[key] : otherwise; }
  bool contains(const std::string& key) const { return fields.is_object() && fields.contains(key); }
  std::string dump() const { return fields.dump(); }
};

// The runtime's output, one JSON object per step of `script`.
std::vector<Step> runtime_steps(const ExitResult& result, const json& script) {
  INFO(result.output);
  REQUIRE(result.status == 0);
  std::vector<Step> steps;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) steps.push_back({json::parse(line)});
  }
  REQUIRE(steps.size() == script["steps"].size());
  return steps;
}

// Runs nri-runtime with `script` and returns its output, one JSON object per step.
std::vector<Step> run_runtime(const Node& node, const json& script, const std::string& flags = "") {
  return runtime_steps(run_runtime_process(node, script, flags), script);
}

// A point where the runtime waits for the test (nri-runtime's wait_file step): the test sees it arrive there,
// does what it must while the runtime is held, then lets it go on.
struct Hold {
  fs::path path;
  json step() const { return {{"wait_file", path.string()}}; }
  bool reached() const {
    return eventually([&] { return fs::exists(path.string() + ".reached"); }, 30s);
  }
  void release() const { std::ofstream(path).flush(); }
};

// Another NRI plugin, after the enforcer (e2e/cmd/nri-injector), adding what `flags` say to each container.
class InjectorProcess : public ChildProcess {
 public:
  InjectorProcess(const Node& node, const std::vector<std::string>& flags)
      : ChildProcess(argv(node, flags), {.log = node.dir / "injector.log"}) {}

 private:
  static std::vector<std::string> argv(const Node& node, const std::vector<std::string>& flags) {
    std::vector<std::string> args = {GPUGUARD_NRI_INJECTOR_BIN, "--socket", node.nri_socket.string()};
    args.insert(args.end(), flags.begin(), flags.end());
    return args;
  }
};

// A binary carrying Go's build information as NVIDIA's release build stamps it (-X
// github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=<version>): the format of Go's
// debug/buildinfo, a 32-byte header, then the Go version and the module information, each a varint length
// and its bytes.
std::string stamped_go_binary(const std::string& version) {
  const auto with_length = [](const std::string& text) {
    std::string out;
    for (std::size_t n = text.size();; n >>= 7) {
      out.push_back(static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
      if (n <= 0x7f) break;
    }
    return out + text;
  };
  const std::string sentinel(16, '\x5a');
  const std::string info =
      sentinel +
      "path\tgithub.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime\n"
      "mod\tgithub.com/NVIDIA/nvidia-container-toolkit\t(devel)\t\n"
      "build\t-ldflags=\"-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=" +
      version + "\"\n" + sentinel;
  std::string header = "\xff Go buildinf:";
  header.push_back(8);  // pointer size
  header.push_back(2);  // the strings follow inline (Go 1.18 and later)
  header.append(16, '\0');
  return std::string(
             "\x7f"
             "ELF") +
         std::string(4092, '\0') + header + with_length("go1.24.6") + with_length(info);
}

// NVIDIA's toolkit on the node as the GPU Operator installs it: containerd's default handler runs its wrapper
// script, which starts the real binary with the configuration it names. The binary is NVIDIA's own
// nvidia-container-runtime, built from e2e/go.mod (1.20.1), where the fixture's toolkit is that or unsaid;
// else one carrying Go's build information stamped with the fixture's version, or none where the fixture's
// version is not known. A package database says 1.17.8 throughout: what runs decides, not what a package
// installed. "toolkit": {} is a toolkit whose mode cannot be read.
void install_toolkit(Node& node, const EnforcerFixture& f) {
  const std::string dir = "usr/local/nvidia/toolkit";
  const bool current = !f.raw.contains("toolkit");
  const json toolkit = f.raw.value("toolkit", json::object());
  node.host.write("etc/containerd/config.toml",
                  "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd]\n  default_runtime_name = "
                  "\"nvidia\"\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia.options]\n"
                  "  BinaryName = \"/" +
                      dir + "/nvidia-container-runtime\"\n");
  node.host.write(dir + "/nvidia-container-runtime", "#! /bin/sh\nPATH=/" + dir +
                                                         ":$PATH \\\nNVIDIA_CTK_CONFIG_FILE_PATH=/" + dir +
                                                         "/.config/nvidia-container-runtime/config.toml \\\n\t/" + dir +
                                                         "/nvidia-container-runtime.real \\\n\t\t\"$@\"\n");
  const fs::path real = node.host.root() / dir / "nvidia-container-runtime.real";
  if (current || toolkit.value("version", json::array()) == json::array({1, 20, 1})) {
    fs::copy_file(GPUGUARD_NVIDIA_RUNTIME_BIN, real, fs::copy_options::overwrite_existing);
  } else if (toolkit.contains("version")) {
    const auto v = toolkit["version"].get<std::vector<int>>();
    node.host.write(dir + "/nvidia-container-runtime.real",
                    stamped_go_binary(std::to_string(v[0]) + "." + std::to_string(v[1]) + "." + std::to_string(v[2])));
  } else {
    node.host.write(dir + "/nvidia-container-runtime.real", "not a Go binary");
  }
  std::string config;
  if (toolkit.contains("swarm_variables")) {
    std::string names;
    for (const auto& name : toolkit["swarm_variables"]) names += (names.empty() ? "" : ",") + name.get<std::string>();
    config += "swarm-resource = \"" + names + "\"\n";
  }
  const std::string mode = current ? "auto" : toolkit.value("mode", std::string("unknown-to-the-enforcer"));
  config += "[nvidia-container-runtime]\nmode = \"" + mode + "\"\n";
  node.host.write(dir + "/.config/nvidia-container-runtime/config.toml", config);
  node.host.write("var/lib/dpkg/status",
                  "Package: nvidia-container-toolkit-base\nStatus: install ok installed\nVersion: 1.17.8-1\n\n");
  if (toolkit.value("tegra", false)) node.host.write("etc/nv_tegra_release", "# R36 (release)\n");
}

json create_step(const json& pod, const json& container) {
  return {{"create", {{"pod", pod}, {"container", container}}}};
}

json gpu_less_pod(const std::string& name) {
  return {{"id", "sandbox-" + name}, {"name", name}, {"namespace", "team-a"}, {"uid", "uid-" + name}};
}
json cuda_container(const std::string& id) {
  return {{"id", id}, {"name", "app"}, {"env", json::array({"NVIDIA_VISIBLE_DEVICES=all"})}};
}

}  // namespace

TEST_CASE("every fixture, sent through NRI's own runtime to the real enforcer, gets its decision") {
  // Grouped by what the node needs to be: the policy, whether the kubelet answers, whether an API
  // server tells service accounts, the toolkit's mode and version (its config and package database on the
  // node), an MPS root of its own, the node's CDI specs, the runtime's name (CRI-O's or containerd's). Fixtures with
  // GPUs of their own (MIG devices, which only NVML lists, or none) are decided by the unit test alone: this node's
  // GPUs come from procfs.
  std::map<std::string, std::vector<EnforcerFixture>> groups;
  std::size_t sent = 0;
  for (auto& f : enforcer_fixtures(kFixtures)) {
    if (f.raw.contains("node")) continue;
    const std::string key =
        json(f.policy_files).dump() + (f.kubelet.answered ? "+kubelet" : "-kubelet") +
        (f.raw.contains("service_account") ? "+api" : "") + f.raw.value("toolkit", json::object()).dump() +
        f.raw.value("mps_roots", json::array()).dump() + f.raw.value("mps_roots_present", json::array()).dump() +
        f.raw.value("cdi_specs", json::object()).dump() + f.raw.value("host_paths", json::object()).dump() +
        (f.raw.contains("toolkit") ? "" : "(current toolkit)") + " runtime " + f.raw.value("runtime", "containerd") +
        (f.raw.value("mask_hook", false) ? " +mask-hook" : "");
    groups[key].push_back(std::move(f));
  }
  for (auto& [key, fixtures] : groups) {
    INFO("group " << key);
    Node node;
    for (const auto& [name, value] : fixtures.front().policy_files) std::ofstream(node.policy / name) << value;
    std::unique_ptr<FakeKubelet> kubelet;
    if (fixtures.front().kubelet.answered) kubelet = std::make_unique<FakeKubelet>(node.kubelet_socket);
    FakeApiserver apiserver("enforcer-token");
    std::vector<std::string> flags;
    install_toolkit(node, fixtures.front());
    for (const auto& [path, where] : fixtures.front().host_paths) {
      if (where.path.empty()) continue;  // a doubt the enforcer finds by the path alone
      fs::create_directories((node.host.root() / path.substr(1)).parent_path());
      fs::create_symlink(where.path, node.host.root() / path.substr(1));
    }
    for (const auto& root : fixtures.front().raw.value("mps_roots_present", json::array()))
      fs::create_directories(node.host.root() / root.get<std::string>().substr(1));
    const json mps_roots = fixtures.front().raw.value("mps_roots", json::array());
    for (const auto& root : mps_roots) {
      if (root != "/run/gpuguard" && root != "/run/nvidia/mps") {
        flags.push_back("--mps-root");
        flags.push_back(root);
      }
    }
    if (key.find("+api") != std::string::npos) {
      std::ofstream(node.dir / "token") << "enforcer-token";
      flags = {"--apiserver-url", apiserver.url(),        "--token-file", (node.dir / "token").string(),
               "--ca-file",       certs_dir() + "/ca.crt"};
    }
    // The mask check copied where the runtime runs it from: the program beside the enforcer, whole.
    const fs::path hook_dir = node.dir / "hooks";
    const bool mask_hook = fixtures.front().raw.value("mask_hook", false);
    if (mask_hook) {
      // The host's directory at the same path: the host root shows it there (a link to it, here).
      fs::create_directories(hook_dir);
      const fs::path on_host = node.host.root() / hook_dir.relative_path();
      fs::create_directories(on_host.parent_path());
      fs::create_directory_symlink(hook_dir, on_host);
      flags.push_back("--mask-hook-dir");
      flags.push_back(hook_dir.string());
    }
    json steps = json::array({{{"wait_plugin", 10}}});
    // Every other fixture has its sandbox made first, as a runtime does: its container is decided on the
    // kubelet's answer fetched then; the others, on the answer asked for at the create.
    std::vector<std::size_t> create_steps;
    std::size_t spec_index = 0;
    for (const auto& f : fixtures) {
      const json& pod = f.raw["pod"];
      const bool sandbox_first = create_steps.size() % 2 == 1;
      if (kubelet && f.kubelet.pod) kubelet->set(pod["namespace"], pod["name"], *f.kubelet.pod);
      if (f.raw.contains("service_account")) {
        apiserver.put_at(
            "/api/v1/namespaces/" + pod["namespace"].get<std::string>() + "/pods/" + pod["name"].get<std::string>(),
            {{"metadata", {{"uid", f.raw.value("api_uid", pod["uid"].get<std::string>())}}},
             {"spec", {{"serviceAccountName", f.raw["service_account"]}}}});
      }
      // The node's own specs in /etc/cdi, as nvidia-ctk writes them; a claim's in /var/run/cdi, as DRA
      // drivers and device plugins write theirs: the host's /run/cdi, through the host's link.
      const auto write_specs = [&](const std::string& dir,
                                   const std::map<std::string, std::vector<std::string>>& specs) {
        for (const auto& [name, paths] : specs) {
          const auto equals = name.find('=');
          json nodes = json::array();
          for (const auto& path : paths) nodes.push_back({{"path", path}});
          node.host.write(
              dir + f.name + "-" + std::to_string(spec_index++) + ".json",
              json{{"cdiVersion", "0.6.0"},
                   {"kind", name.substr(0, equals)},
                   {"devices",
                    json::array({{{"name", name.substr(equals + 1)}, {"containerEdits", {{"deviceNodes", nodes}}}}})}}
                  .dump());
        }
      };
      write_specs("run/cdi/", f.cdi_nodes);
      write_specs("etc/cdi/",
                  f.raw.value("cdi_specs", json::object()).get<std::map<std::string, std::vector<std::string>>>());
      if (sandbox_first) steps.push_back({{"run_pod", pod}});
      create_steps.push_back(steps.size());
      steps.push_back(create_step(pod, f.raw["container"]));
    }
    EnforcerProcess enforcer(node, flags);
    const auto out =
        run_runtime(node, {{"steps", steps}}, "--runtime-name " + fixtures.front().raw.value("runtime", "containerd"));
    REQUIRE(out[0]["synced"] == 1);
    // The mode it runs in, as GPUGuardNodeEnforcementNotEnforcing reads it: the policy's, enforce by default.
    const auto mode = fixtures.front().policy_files.find("nodeEnforcement");
    CHECK_THAT(http_request(enforcer.port(), "GET", "/metrics").body,
               Catch::Contains("\ngpuguard_node_enforcer_mode{mode=\"" +
                               (mode != fixtures.front().policy_files.end() ? mode->second : std::string("enforce")) +
                               "\"} 1\n"));
    if (mask_hook) {
      const fs::path beside = fs::path(GPUGUARD_NODE_ENFORCER_BIN).parent_path() / "gpuguard-mask-check";
      REQUIRE(fs::exists(hook_dir / "gpuguard-mask-check"));
      CHECK(gpuguard::test::read_file(hook_dir / "gpuguard-mask-check") == gpuguard::test::read_file(beside));
      CHECK((fs::status(hook_dir / "gpuguard-mask-check").permissions() & fs::perms::owner_exec) != fs::perms::none);
    }
    for (std::size_t i = 0; i < fixtures.size(); ++i) {
      const auto& f = fixtures[i];
      const json& expect = f.raw["expect"];
      const Step& got = out[create_steps[i]];
      INFO(f.name << ": " << got.dump() << "\n" << enforcer.log());
      const std::string action = expect["action"];
      if (action == "refuse") {
        REQUIRE(got.contains("error"));
        // What the kubelet shows: the runtime keeps gpuguard's status code and message.
        CHECK_THAT(got["error"].get<std::string>(),
                   Catch::Contains("code = PermissionDenied desc = gpuguard: container"));
        if (expect.contains("message"))
          CHECK_THAT(got["error"].get<std::string>(), Catch::Contains(expect["message"].get<std::string>()));
      } else {
        REQUIRE_FALSE(got.contains("error"));
        json want = json::array();
        if (action == "adjust") {
          std::map<std::string, std::string> set = expect.value("set_env", std::map<std::string, std::string>{});
          if (expect.contains("visible_devices")) set["NVIDIA_VISIBLE_DEVICES"] = expect["visible_devices"];
          for (const auto& [name, value] : set) want.push_back(std::string(name).append("=").append(value));
        }
        CHECK(got["env"] == want);
        // The masks, as NRI passes them on (the removal that makes gpuguard each destination's owner is
        // folded into the mount that follows it); NRI's validation, the enforcer's own among them, accepted
        // the container with them.
        json masks = json::array();
        for (const auto& at : expect.value("masks", json::array()))
          masks.push_back(at.get<std::string>() + " tmpfs ro,nosuid,nodev,noexec,size=4k,mode=0555");
        CHECK(got["mounts"] == masks);
        // On CRI-O with the mask check, a container given masks gets it as a createRuntime hook, told the MPS
        // roots' places; nowhere else does the enforcer add a hook.
        json hooks = json::array();
        if (mask_hook && !masks.empty()) hooks.push_back((hook_dir / "gpuguard-mask-check").string() + " --");
        std::vector<std::string> got_hooks;
        for (const auto& hook : got.value("create_runtime_hooks", json::array())) {
          const std::string text = hook;
          got_hooks.push_back(text.substr(0, text.find(" -- ") + 3));
          CHECK_THAT(text, Catch::Contains(" /run/gpuguard ") && Catch::Contains(" /run/nvidia/mps "));
          CHECK_THAT(text, Catch::EndsWith("timeout 10"));
        }
        CHECK(json(got_hooks) == hooks);
        // What the container gets once NRI's own generator applied the adjustment as containerd does: the
        // last NVIDIA_VISIBLE_DEVICES, which NVIDIA's runtime reads, is the decision's, or the container's
        // own where it was left alone.
        std::optional<std::string> before, after;
        for (const auto& entry : f.raw["container"].value("env", json::array()))
          if (entry.get<std::string>().starts_with("NVIDIA_VISIBLE_DEVICES=")) before = entry.get<std::string>();
        for (const auto& entry : got["final_env"])
          if (entry.get<std::string>().starts_with("NVIDIA_VISIBLE_DEVICES=")) after = entry.get<std::string>();
        // The model of NRI's generator the property test applies adjustments with (property.hpp) gives what
        // NRI's own generator gave.
        std::map<std::string, std::string> set_env;
        for (const auto& entry : want) {
          const std::string text = entry;
          set_env[text.substr(0, text.find('='))] = text.substr(text.find('=') + 1);
        }
        CHECK(got["final_env"] ==
              json(property::apply_env(f.raw["container"].value("env", std::vector<std::string>{}), set_env)));
        const auto wanted =
            expect.contains("visible_devices")
                ? std::optional<std::string>("NVIDIA_VISIBLE_DEVICES=" + expect["visible_devices"].get<std::string>())
                : before;
        CHECK(after == wanted);
      }
      // Each answered well inside the runtime's 2 s.
      CHECK(got["micros"].get<long long>() < 1'000'000);
      ++sent;
    }
    std::size_t masks = 0;
    for (const auto& f : fixtures) masks += f.raw["expect"].value("masks", json::array()).size();
    CHECK(enforcer.series("gpuguard_node_enforcer_mps_masks_total") == static_cast<long long>(masks));
    CHECK(enforcer.terminate() == 0);
  }
  CHECK(sent >= 30);
}

TEST_CASE("registration and reconnection: a runtime that restarts finds the enforcer registered again") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  EnforcerProcess enforcer(node);
  const json first = {
      {"steps", json::array({{{"wait_plugin", 10}}, create_step(gpu_less_pod("one"), cuda_container("c1"))})}};
  auto out = run_runtime(node, first);
  CHECK(out[0]["synced"] == 1);
  CHECK(out[1]["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=void"}));
  // The runtime goes away and comes back (containerd restarted): the enforcer connects again with backoff.
  const auto restarted = std::chrono::steady_clock::now();
  const json second = {
      {"steps", json::array({{{"wait_plugin", 10}}, create_step(gpu_less_pod("two"), cuda_container("c2"))})}};
  out = run_runtime(node, second);
  CHECK(out[0]["synced"] == 1);
  CHECK(std::chrono::steady_clock::now() - restarted < 5s);
  CHECK(out[1]["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=void"}));
  CHECK(enforcer.series("gpuguard_node_enforcer_connections_total{event=\"registered\"}") == 2);
  CHECK(enforcer.series("gpuguard_node_enforcer_decisions_total{action=\"adjust\",why=\"enforced\"}") == 2);
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("registration: registered and ready only once the runtime has synchronized the enforcer") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  EnforcerProcess enforcer(node);
  const Hold sync{node.dir / "sync"}, synced{node.dir / "synced"};
  const json script = {
      {"hold_sync", sync.path.string()},
      {"steps",
       json::array({{{"wait_plugin", 10}}, synced.step(), create_step(gpu_less_pod("one"), cuda_container("c1"))})}};
  std::future<ExitResult> out = std::async(std::launch::async, [&] { return run_runtime_process(node, script); });
  // Configured, and no Synchronize sent yet: NRI would create containers without it if this one failed.
  REQUIRE(sync.reached());
  CHECK(enforcer.series("gpuguard_node_enforcer_connections_total{event=\"registered\"}") == 1);
  CHECK(enforcer.series("gpuguard_node_enforcer_registered") == 0);
  CHECK(http_request(enforcer.port(), "GET", "/readyz").status == 503);
  sync.release();
  REQUIRE(synced.reached());
  CHECK(enforcer.series("gpuguard_node_enforcer_registered") == 1);
  CHECK(http_request(enforcer.port(), "GET", "/readyz").status == 200);
  synced.release();
  const auto steps = runtime_steps(out.get(), script);
  CHECK(steps[0]["synced"] == 1);
  CHECK(steps[2]["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=void"}));
  // The runtime gone again: not registered.
  REQUIRE(eventually([&] { return enforcer.series("gpuguard_node_enforcer_registered") == 0; }));
  // Its log says whose the time was: its own part, and of it the node read, the kubelet's List and the
  // containers' reading.
  const std::string log = enforcer.log();
  const auto line = log.substr(log.find("synchronized with the runtime") == std::string::npos
                                   ? log.size()
                                   : log.rfind('{', log.find("synchronized with the runtime")));
  INFO(log);
  for (const char* part : {"\"enforcer_ms\":", "\"elapsed_ms\":", "\"node_ms\":", "\"kubelet_ms\":",
                           "\"containers_ms\":", "\"messages\":1,"}) {
    CHECK_THAT(line.substr(0, line.find('\n')), Catch::Contains(part));
  }
  // The node was read at the Configure, and its time said there (the log's keys come sorted).
  CHECK_THAT(log, Catch::Contains("\"msg\":\"registered with the container runtime over NRI\",\"node_ms\":"));
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("a runtime that serves no NRI: the enforcer is ready and says the node is not enforced, until it does") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  EnforcerProcess enforcer(node, {"--nri-unserved-after", "2"});
  // No socket yet, and within --nri-unserved-after: a runtime restarting, waited for.
  const auto ready = [&] { return http_request(enforcer.port(), "GET", "/readyz"); };
  CHECK(ready().status == 503);
  CHECK(enforcer.series("gpuguard_node_enforcer_nri_served") == 1);
  // Past it (seen at the next try, the backoff's 250 ms doubling): ready (an install waiting on the
  // DaemonSet goes on), the node reported not enforced.
  eventually([&] { return ready().status == 200; }, 15s);
  const auto unserved = ready();
  CHECK(unserved.status == 200);
  CHECK_THAT(unserved.body, Catch::Contains("not enforced: the container runtime serves no NRI socket"));
  CHECK(enforcer.series("gpuguard_node_enforcer_nri_served") == 0);
  CHECK(enforcer.series("gpuguard_node_enforcer_registered") == 0);
  CHECK_THAT(enforcer.log(), Catch::Contains("the runtime does not serve NRI"));
  // NRI switched on: registered, served, and ready for that reason.
  const json steps = {
      {"steps", json::array({{{"wait_plugin", 15}}, create_step(gpu_less_pod("one"), cuda_container("c1"))})}};
  const auto out = run_runtime(node, steps);
  CHECK(out[1]["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=void"}));
  CHECK(enforcer.series("gpuguard_node_enforcer_connections_total{event=\"registered\"}") == 1);
  CHECK(enforcer.terminate() == 0);
  CHECK_THAT(enforcer.log(), Catch::Contains("the runtime serves NRI again"));
}

TEST_CASE("sandboxes made at once are fetched in one List, and their containers created without asking again") {
  const std::string first_gpu = default_node()[0].uuid;
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  for (const std::string name : {"a", "b", "c"}) {
    enforcement::PodResources pod;
    pod.containers.push_back({"app", {{"nvidia.com/gpu", {first_gpu}}}, {}});
    kubelet.set("team-a", name, pod);
  }
  EnforcerProcess enforcer(node);
  json steps = json::array({{{"wait_plugin", 10}}});
  for (const std::string name : {"a", "b", "c"}) steps.push_back({{"run_pod", gpu_less_pod(name)}});
  // The creates wait for the fetch: on a loaded machine a create that waited 400 ms for it asks the kubelet
  // itself (as it must), which is another call, and not what this test is about.
  const Hold fetched{node.dir / "fetched"};
  steps.push_back(fetched.step());
  for (const std::string name : {"a", "b", "c"}) {
    steps.push_back(create_step(gpu_less_pod(name), cuda_container("app")));
    steps.push_back(create_step(gpu_less_pod(name), cuda_container("app")));  // a restart of the same container
  }
  const json script = {{"steps", steps}};
  std::future<ExitResult> running = std::async(std::launch::async, [&] { return run_runtime_process(node, script); });
  REQUIRE(fetched.reached());
  // The List at registration, and the sandboxes' fetch answered (the kubelet answers at once).
  CHECK(eventually([&] { return kubelet.calls() >= 2; }));
  fetched.release();
  const auto out = runtime_steps(running.get(), script);
  INFO(enforcer.log());
  CHECK(out[4]["released"] == true);
  for (std::size_t i = 5; i < 11; ++i) {
    INFO(out[i].dump());
    CHECK(out[i]["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=" + first_gpu}));
  }
  // One List at registration (Synchronize's report of the running containers), then three sandboxes:
  // one List for all, or on a loaded machine one for each that came after the last List ended. The six
  // creates ask nothing: without the fetch it would be 1 + 6, without the batching up to 1 + 3 + 6.
  CHECK(kubelet.calls() >= 2);
  CHECK(kubelet.calls() <= 4);
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("fail-closed: with NRI's validator requiring gpuguard, creates fail until the enforcer is back") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  const json script = {{"steps", json::array({create_step(gpu_less_pod("early"), cuda_container("c1"))})}};
  auto out = run_runtime(node, script, "--required-plugins gpuguard");
  REQUIRE(out[0].contains("error"));
  CHECK_THAT(out[0]["error"].get<std::string>(), Catch::Contains("required plugin \"gpuguard\" not present"));
  // Fail-open without the validator: the same create goes ahead unadjusted.
  out = run_runtime(node, script);
  CHECK(out[0]["env"] == json::array());
  EnforcerProcess enforcer(node);
  const json with_enforcer = {
      {"steps", json::array({{{"wait_plugin", 10}}, create_step(gpu_less_pod("later"), cuda_container("c2"))})}};
  out = run_runtime(node, with_enforcer, "--required-plugins gpuguard");
  CHECK(out[1]["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=void"}));
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE(
    "a slow kubelet: answered within the runtime's timeout, a container that reaches GPUs refused and one that reaches "
    "none created") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  kubelet.set_delay(3s);
  EnforcerProcess enforcer(node);
  json without_gpu = cuda_container("c2");
  without_gpu["env"] = json::array({"NVIDIA_VISIBLE_DEVICES=void"});
  const json script = {{"steps", json::array({{{"wait_plugin", 10}},
                                              create_step(gpu_less_pod("slow"), cuda_container("c1")),
                                              create_step(gpu_less_pod("slow-void"), without_gpu)})}};
  const auto started = std::chrono::steady_clock::now();
  const auto out = run_runtime(node, script);
  INFO(enforcer.log());
  REQUIRE(out[1].contains("error"));
  CHECK_THAT(out[1]["error"].get<std::string>(),
             Catch::Contains("would reach GPUs while its allocation cannot be read: NVIDIA_VISIBLE_DEVICES=all"));
  REQUIRE_FALSE(out[2].contains("error"));
  CHECK(out[2]["env"] == json::array());
  CHECK(out[1]["micros"].get<long long>() < 1'500'000);
  CHECK(out[2]["micros"].get<long long>() < 1'500'000);
  CHECK(std::chrono::steady_clock::now() - started < 10s);
  CHECK(enforcer.series("gpuguard_node_enforcer_kubelet_errors_total") >= 1);
  CHECK(enforcer.series("gpuguard_node_enforcer_decisions_total{action=\"refuse\",why=\"cannot-judge\"}") == 1);
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("garbage, or a frame cut off, from the runtime: the enforcer drops the connection and connects again") {
  Node node;
  const int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, node.nri_socket.c_str(), node.nri_socket.string().size() + 1);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(listener, 8) == 0);
  EnforcerProcess enforcer(node);
  const std::string payloads[] = {
      std::string("\xff\xff\xff\xff\xff\xff\xff\xff garbage", 16),  // connection ~0: not the multiplexer
      std::string("\x00\x00\x00\x01\x00\x50\x00\x00", 8),           // a 5 MiB frame: over the limit
      std::string("\x00\x00\x00\x01\x00\x00\x00\x20"
                  "abc",
                  11),  // half a frame, then the runtime closes
  };
  for (const std::string& bytes : payloads) {
    const int connection = ::accept(listener, nullptr, nullptr);
    REQUIRE(connection >= 0);
    char registration[4096];
    CHECK(::read(connection, registration, sizeof registration) > 0);  // it registers first
    CHECK(::write(connection, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    if (&bytes == &payloads[2]) ::shutdown(connection, SHUT_WR);
    // It drops this connection (EOF on our side) and comes back.
    pollfd readable{connection, POLLIN, 0};
    REQUIRE(::poll(&readable, 1, 5000) == 1);
    CHECK(::read(connection, registration, sizeof registration) == 0);
    ::close(connection);
  }
  const int again = ::accept(listener, nullptr, nullptr);  // a fourth time: never stuck
  CHECK(again >= 0);
  ::close(again);
  ::close(listener);
  CHECK(http_request(enforcer.port(), "GET", "/healthz").status == 200);
  CHECK(enforcer.series("gpuguard_node_enforcer_protocol_errors_total") == 2);
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE(
    "the status port: clients that declare a body and never send it are answered at once, and the probe gets in") {
  // Any pod reaches this port. Were such requests held for their bodies, 64 of them would keep the kubelet's
  // liveness probe out until the enforcer was restarted, and the node ran without it.
  Node node;
  EnforcerProcess enforcer(node);
  const auto open_holding = [&enforcer] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(enforcer.port());
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
    const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 7000000\r\n\r\n";
    REQUIRE(::write(fd, head.data(), head.size()) == static_cast<ssize_t>(head.size()));
    return fd;
  };
  std::vector<int> held;
  held.reserve(200);
  for (int i = 0; i < 200; ++i) held.push_back(open_holding());
  std::size_t refused_at_once = 0;
  for (const int fd : held) {
    std::string answer;
    char chunk[512];
    bool closed = false;
    pollfd readable{fd, POLLIN, 0};
    while (!closed && ::poll(&readable, 1, 2000) == 1) {
      const ssize_t n = ::read(fd, chunk, sizeof chunk);
      closed = n <= 0;  // the server closed it after its answer (or at the connection limit, unanswered)
      if (n > 0) answer.append(chunk, static_cast<std::size_t>(n));
    }
    // 413 (the status port takes no body at all) or 400 (probes take none), then closed; or closed unanswered
    // at the connection limit.
    if (closed && (answer.starts_with("HTTP/1.1 4") || answer.empty())) ++refused_at_once;
    ::close(fd);
  }
  CHECK(refused_at_once == held.size());
  CHECK(http_request(enforcer.port(), "GET", "/healthz").status == 200);
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("running containers beyond their allocation are reported at registration, and no longer once removed") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  kubelet.set("team-a", "old", {{{"app", {}, {}}}, {}});
  FakeApiserver apiserver("enforcer-token");
  apiserver.collect_posts("/api/v1/namespaces/default/events");
  std::ofstream(node.dir / "token") << "enforcer-token";
  EnforcerProcess enforcer(node, {"--node-name", "gpu-node-1", "--apiserver-url", apiserver.url(), "--token-file",
                                  (node.dir / "token").string(), "--ca-file", certs_dir() + "/ca.crt"});
  const json old_pod = gpu_less_pod("old");
  json running = cuda_container("c-old");
  running["podSandboxId"] = "sandbox-old";
  running["state"] = "CONTAINER_RUNNING";
  json privileged = running;
  privileged["id"] = "c-priv";
  privileged["name"] = "agent";
  privileged["linux"] = {{"resources", {{"devices", json::array({{{"allow", true}, {"access", "rwm"}}})}}}};
  const Hold registered{node.dir / "registered"}, removed{node.dir / "removed"};
  const json script = {
      {"existing", {{"pods", json::array({old_pod})}, {"containers", json::array({running, privileged})}}},
      {"steps", json::array({{{"wait_plugin", 10}},
                             registered.step(),
                             {{"remove", {{"pod", old_pod}, {"container", running}}}},
                             removed.step()})}};
  std::future<ExitResult> out = std::async(std::launch::async, [&] { return run_runtime_process(node, script); });
  // Read while the runtime is still connected: after its registration, and again after the removal.
  REQUIRE(registered.reached());
  CHECK(enforcer.series("gpuguard_node_enforcer_running_containers{state=\"beyond\"}") == 1);
  CHECK(enforcer.series("gpuguard_node_enforcer_running_containers{state=\"privileged\"}") == 1);
  registered.release();
  REQUIRE(removed.reached());
  CHECK(enforcer.series("gpuguard_node_enforcer_running_containers{state=\"beyond\"}") == 0);
  removed.release();
  const auto steps = runtime_steps(out.get(), script);
  CHECK(steps[1]["released"] == true);
  CHECK(steps[3]["released"] == true);
  // The event is posted from a thread of its own, over a connection of its own.
  REQUIRE(eventually([&] { return apiserver.posts("/api/v1/namespaces/default/events").size() == 1; }));
  const auto events = apiserver.posts("/api/v1/namespaces/default/events");
  CHECK(events[0]["involvedObject"]["name"] == "gpu-node-1");
  // Its UID is the node's name, as the kubelet's are: `kubectl describe node` looks for both.
  CHECK(events[0]["involvedObject"]["uid"] == "gpu-node-1");
  CHECK(events[0]["reason"] == "GPUsBeyondAllocation");
  CHECK_THAT(events[0]["message"].get<std::string>(), Catch::Contains("team-a/old/app"));
  CHECK_THAT(enforcer.log(), Catch::Contains("running container sees GPUs beyond its allocation"));
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE(
    "break glass: while its ConfigMap exists every container is created as it is, within seconds of each change") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  kubelet.set("team-a", "pod", {{{"app", {}, {}}}, {}});
  FakeApiserver apiserver("enforcer-token");
  std::ofstream(node.dir / "token") << "enforcer-token";
  // Another ConfigMap of the namespace is not the break glass: only the one named is.
  apiserver.put("configmaps", {{"metadata", {{"name", "gpuguard-policy"}, {"namespace", "gpuguard-system"}}}});
  EnforcerProcess enforcer(
      node, {"--break-glass-configmap", "gpuguard-system/gpuguard-break-glass", "--apiserver-url", apiserver.url(),
             "--token-file", (node.dir / "token").string(), "--ca-file", certs_dir() + "/ca.crt"});
  const auto create = [&node](const std::string& id) {
    return run_runtime(
        node,
        {{"steps", json::array({{{"wait_plugin", 10}}, create_step(gpu_less_pod("pod"), cuda_container(id))})}})[1];
  };
  const auto wait_for = [&enforcer](long long engaged) {
    const auto started = std::chrono::steady_clock::now();
    eventually([&] { return enforcer.series("gpuguard_node_enforcer_break_glass") == engaged; });
    return std::chrono::steady_clock::now() - started;
  };
  CHECK(create("c1")["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=void"}));
  CHECK(enforcer.series("gpuguard_node_enforcer_break_glass") == 0);

  apiserver.put("configmaps", {{"metadata", {{"name", "gpuguard-break-glass"}, {"namespace", "gpuguard-system"}}}});
  CHECK(wait_for(1) < 3s);
  const Step broken = create("c2");
  INFO(enforcer.log());
  CHECK(broken["env"] == json::array());
  CHECK_FALSE(broken.contains("error"));
  CHECK_THAT(enforcer.log(), Catch::Contains("break glass engaged"));

  apiserver.remove("configmaps", "gpuguard-break-glass");
  CHECK(wait_for(0) < 3s);
  CHECK(create("c3")["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=void"}));
  CHECK_THAT(enforcer.log(), Catch::Contains("break glass released"));
  // One object read, by name: the Role grants that one alone.
  bool by_name = false;
  for (const auto& request : apiserver.requests()) {
    if (request.path == "/api/v1/namespaces/gpuguard-system/configmaps") {
      CHECK_THAT(request.query, Catch::Contains("fieldSelector=metadata.name%3Dgpuguard-break-glass"));
      by_name = true;
    }
  }
  CHECK(by_name);
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("bad flags are refused with a reason, before anything is served") {
  for (const std::string flags :
       {"--plugin-index 5", "--plugin-index ab", "--plugin-name 'a b'", "--no-such-flag", "--nri-unserved-after 0",
        "--nri-unserved-after 3601", "--exempt-service-accounts=no-slash", "--exempt-service-accounts=Bad_NS/x",
        "--break-glass-configmap=no-slash", "--break-glass-configmap=/x", "--break-glass-configmap=a/b/c",
        "--break-glass-configmap=ns/name"}) {
    INFO(flags);
    const ExitResult result = run_binary(GPUGUARD_NODE_ENFORCER_BIN, flags);
    CHECK(result.status == 2);
    CHECK_FALSE(result.output.empty());
  }
  CHECK(run_binary(GPUGUARD_NODE_ENFORCER_BIN, "--help").status == 0);
}

TEST_CASE("validation: devices another NRI plugin adds beyond the allocation are rejected, and within it accepted") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  const std::string gpu0 = default_node()[0].uuid;
  kubelet.set("team-a", "holder", {{{"app", {{"nvidia.com/gpu", {gpu0}}}, {}}}, {}});
  EnforcerProcess enforcer(node);
  json gpu_container = cuda_container("c3");
  gpu_container["env"] = json::array({"NVIDIA_VISIBLE_DEVICES=" + gpu0});
  // A GPU-less container given every GPU by a later plugin's CDI device (what NVIDIA's NRI plugin does with a
  // nvidia.cdi.k8s.io/ annotation), and a GPU container given its own GPU's.
  {
    InjectorProcess injector(node, {"--cdi-device", "nvidia.com/gpu=all", "--only-container", "app"});
    const json script = {{"steps", json::array({{{"wait_plugin", 10}, {"count", 2}},
                                                create_step(gpu_less_pod("injected"), cuda_container("c1"))})}};
    const auto out = run_runtime(node, script);
    INFO(out[1].dump() << "\n" << enforcer.log());
    REQUIRE(out[0]["synced"] == 2);
    REQUIRE(out[1].contains("error"));
    CHECK_THAT(out[1]["error"].get<std::string>(),
               Catch::Contains("validator \"50-gpuguard\" rejected container adjustment"));
    CHECK_THAT(out[1]["error"].get<std::string>(),
               Catch::Contains("CDI device nvidia.com/gpu=all, not a device of the allocation"));
  }
  {
    InjectorProcess injector(node, {"--cdi-device", "nvidia.com/gpu=" + gpu0});
    const json script = {{"steps", json::array({{{"wait_plugin", 10}, {"count", 2}},
                                                create_step(gpu_less_pod("holder"), gpu_container)})}};
    const auto out = run_runtime(node, script);
    INFO(out[1].dump() << "\n" << enforcer.log());
    REQUIRE(out[0]["synced"] == 2);
    CHECK_FALSE(out[1].contains("error"));
  }
  // A later plugin that takes NVIDIA_VISIBLE_DEVICES over (removes it, then sets all): NRI lets it, and
  // only the validation sees the result.
  {
    InjectorProcess injector(node, {"--override-env", "NVIDIA_VISIBLE_DEVICES=all"});
    const json script = {{"steps", json::array({{{"wait_plugin", 10}, {"count", 2}},
                                                create_step(gpu_less_pod("overridden"), cuda_container("c4"))})}};
    const auto out = run_runtime(node, script);
    INFO(out[1].dump() << "\n" << enforcer.log());
    REQUIRE(out[1].contains("error"));
    CHECK_THAT(out[1]["error"].get<std::string>(), Catch::Contains("after every NRI plugin's adjustment"));
  }
  CHECK_THAT(enforcer.log(), Catch::Contains("\"validating\":true"));  // each registration said so
  CHECK(enforcer.series("gpuguard_node_enforcer_validations_total{result=\"rejected\"}") == 2);
  CHECK(enforcer.series("gpuguard_node_enforcer_validations_total{result=\"accepted\"}") >= 1);
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE(
    "running containers too large for NRI's Synchronize keep every plugin out: such a container is refused at "
    "its create, and validation stays on once registering works again") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  EnforcerProcess enforcer(node);
  // What NRI v0.12.3 does with them (no fix of the enforcer's can change it): three running containers of
  // 1.5 MiB, each one small enough for a create of its own, are never sent whole to a plugin that registers:
  // it splits no finer than four containers to a message, and closes the connection. The enforcer
  // connects again and again meanwhile.
  const auto filled = [](const std::string& id, std::size_t bytes) {
    return json{{"id", id},
                {"podSandboxId", "sandbox-big"},
                {"name", "app"},
                {"env", json::array({"PATH=/usr/bin", "FILLER=" + std::string(bytes, 'f')})}};
  };
  json running = json::array();
  for (const char* id : {"big-1", "big-2", "big-3"}) running.push_back(filled(id, std::size_t{1536} << 10));
  const json locked = {{"existing", {{"pods", json::array({gpu_less_pod("big")})}, {"containers", running}}},
                       {"steps", json::array({{{"wait_plugin", 3}}})}};
  const auto out_locked = run_runtime(node, locked);
  CHECK(out_locked[0]["synced"] == 0);
  // The enforcer refuses to make such a container, and makes one within the bound.
  kubelet.set("team-a", "big", {{{"app", {}, {}}}, {}});
  const json script = {
      {"steps", json::array({{{"wait_plugin", 10}},
                             create_step(gpu_less_pod("big"), filled("over", std::size_t{700} << 10)),
                             create_step(gpu_less_pod("big"), filled("within", std::size_t{600} << 10))})}};
  const auto out = run_runtime(node, script);
  INFO(enforcer.log().substr(0, 6000));
  CHECK(out[0]["synced"] == 1);
  REQUIRE(out[1].contains("error"));
  CHECK_THAT(out[1]["error"].get<std::string>(),
             Catch::Contains("is larger than the container runtime can show its NRI plugins at their registration") &&
                 Catch::Contains("its NRI message is 700 KiB, over 640 KiB"));
  CHECK_FALSE(out[2].contains("error"));
  CHECK(enforcer.series("gpuguard_node_enforcer_decisions_total{action=\"refuse\",why=\"oversized\"}") == 1);
  // The syncs the runtime ended did not turn validation off: it says its NRI version, v0.12.3, which knows it.
  // Every registration, those whose sync failed and the last, asked for validation.
  CHECK_THAT(enforcer.log(), Catch::Contains("\"validating\":true") && !Catch::Contains("\"validating\":false") &&
                                 !Catch::Contains("connecting again without"));
  CHECK(enforcer.terminate() == 0);
}

// What keeps a stop from getting lost: a signal the kernel gives to one of gRPC's threads, asleep in a library
// ThreadSanitizer does not instrument, waited there unseen (an enforcer under make test-tsan ran on 30 s after
// SIGTERM in 3 of 15 runs). Every thread started before the signal loop runs blocks both.
TEST_CASE(
    "SIGTERM and SIGINT reach the signal loop's thread alone: every other thread, gRPC's among them, blocks them") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  EnforcerProcess enforcer(node);
  // Released in the main thread just before its loop runs, which is after its last start-up line.
  enforcer.logged_port("serving probes and metrics");
  const bool released = eventually([&] { return enforcer.main_thread_alone_takes(SIGTERM); }, 10s);
  const std::vector<std::string> threads = enforcer.threads();
  std::ostringstream all;
  for (const std::string& thread : threads) all << thread << "\n";
  INFO(all.str());
  CHECK(released);
  CHECK(threads.size() >= 4);  // the NRI client's, the pollers', gRPC's: there is something to block
  CHECK(enforcer.main_thread_alone_takes(SIGINT));
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("validation: a Synchronize the runtime gave up on does not turn it off, where NRI says no version") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  EnforcerProcess enforcer(node);
  // Running containers large enough that NRI splits the Synchronize; the runtime gives up on the first one
  // after its first message, as its request timeout does, and synchronizes the next connection.
  const std::string big(300 << 10, '7');
  json pods = json::array(), containers = json::array();
  for (int p = 0; p < 16; ++p) {
    const std::string name = std::string("heavy-").append(std::to_string(p));
    pods.push_back(gpu_less_pod(name));
    containers.push_back({{"id", name + "-c"},
                          {"podSandboxId", "sandbox-" + name},
                          {"name", "app"},
                          {"state", "CONTAINER_RUNNING"},
                          {"env", json::array({"CUDA_VERSION=" + big})}});
  }
  const Hold held{node.dir / "held"};
  const json script = {{"existing", {{"pods", pods}, {"containers", containers}}},
                       {"steps", json::array({{{"wait_plugin", 20}}, held.step()})}};
  // containerd 2.2: NRI v0.10.0, which has the validation phase and says no version. A request timeout that
  // a loaded machine's marshalling stays within: the one Synchronize given up on is the runtime's choice.
  std::future<ExitResult> out = std::async(std::launch::async, [&] {
    return run_runtime_process(
        node, script,
        "--runtime-name containerd --runtime-version 2.2.0 --hide-nri-version --cut-sync --request-timeout 30s");
  });
  REQUIRE(held.reached());
  CHECK(enforcer.series("gpuguard_node_enforcer_connections_total{event=\"registered\"}") == 2);
  CHECK(enforcer.series("gpuguard_node_enforcer_registered") == 1);
  CHECK(enforcer.series("gpuguard_node_enforcer_validating") == 1);
  held.release();
  const auto steps = runtime_steps(out.get(), script);
  CHECK(steps[0]["synced"] == 1);
  CHECK_THAT(enforcer.log(), Catch::Contains("\"synchronized\":false"));
  CHECK_THAT(enforcer.log(), !Catch::Contains("connecting again without"));
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("an enforcer that stops in the middle of a request: with validation, that very create fails") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  EnforcerProcess enforcer(node);
  // The runtime's timeout is short here, so that the stop is met within the test. Without the validation
  // phase NRI would create this container unjudged.
  const Hold synchronized{node.dir / "synchronized"};
  const json script = {{"steps", json::array({{{"wait_plugin", 10}},
                                              synchronized.step(),
                                              create_step(gpu_less_pod("stalled"), cuda_container("c1"))})}};
  auto runtime =
      std::async(std::launch::async, [&] { return run_runtime_process(node, script, "--request-timeout 500ms"); });
  // Stopped once registered and synchronized (the runtime is past wait_plugin), before the create. A fixed
  // wait stopped it in the middle of registering on a loaded machine, and NRI waited for it.
  REQUIRE(synchronized.reached());
  enforcer.signal(SIGSTOP);
  synchronized.release();
  const bool returned = runtime.wait_for(60s) == std::future_status::ready;
  enforcer.signal(SIGCONT);
  REQUIRE(returned);
  const ExitResult stopped = runtime.get();
  const auto out = runtime_steps(stopped, script);
  INFO(out[2].dump() << "\n" << enforcer.log());
  CHECK(out[0]["synced"] == 1);  // stopped after its registration, not during it
  CHECK(out[1]["released"] == true);
  REQUIRE(out[2].contains("error"));
  CHECK_THAT(out[2]["error"].get<std::string>(), Catch::Contains("validator plugin"));
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("the largest request an attacker can make: answered with a bounded refusal, the connection kept") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  EnforcerProcess enforcer(node);
  // The review's attack: a GPU container with hundreds of long image volumes under the device-list path and
  // NVIDIA_VISIBLE_DEVICES twice (envFrom), near ttrpc's 4 MiB. A refusal naming every mount was over 4 MiB,
  // the enforcer dropped the connection, and NRI created the container with all.
  json container = cuda_container("huge");
  container["env"] = json::array({"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"});
  json mounts = json::array();
  for (int i = 0; i < 700; ++i) {
    mounts.push_back(
        {{"destination", "/var/run/nvidia-container-devices/" + std::string(5000, 'a') + std::to_string(i)},
         {"source", "/var/lib/containerd/volume-" + std::to_string(i)},
         {"type", "bind"},
         {"options", json::array({"rbind"})}});
  }
  container["mounts"] = mounts;
  const json script = {{"steps", json::array({{{"wait_plugin", 10}},
                                              create_step(gpu_less_pod("huge"), container),
                                              create_step(gpu_less_pod("after"), cuda_container("c2"))})}};
  const auto out = run_runtime(node, script);
  INFO(enforcer.log().substr(0, 4000));
  REQUIRE(out[1].contains("error"));
  const std::string error = out[1]["error"];
  CHECK(error.size() < 5000);
  CHECK_THAT(error, Catch::Contains("code = PermissionDenied desc = gpuguard: container"));
  // The connection stayed: the next container is judged on it, with no registration between (the one
  // connection ended when the runtime's process did).
  CHECK(out[2]["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=void"}));
  CHECK(enforcer.series("gpuguard_node_enforcer_connections_total{event=\"registered\"}") == 1);
  CHECK(enforcer.series("gpuguard_node_enforcer_oversized_answers_total") == 0);
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("a kubelet that answers too much: a container that reaches GPUs is refused, never let through") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  kubelet.set("team-a", "big", {{{"app", {}, {}}}, {}});
  kubelet.set_padding(100'000);  // about 21 MB, over the enforcer's 8 MiB
  EnforcerProcess enforcer(node);
  json without_gpu = cuda_container("c2");
  without_gpu["env"] = json::array({"NVIDIA_VISIBLE_DEVICES=void"});
  const json script = {{"steps", json::array({{{"wait_plugin", 10}},
                                              create_step(gpu_less_pod("big"), cuda_container("c1")),
                                              create_step(gpu_less_pod("big"), without_gpu)})}};
  const auto out = run_runtime(node, script);
  INFO(enforcer.log().substr(0, 3000));
  CHECK(out[0]["synced"] == 1);
  REQUIRE(out[1].contains("error"));
  CHECK_THAT(out[1]["error"].get<std::string>(), Catch::Contains("while its allocation cannot be read"));
  CHECK_FALSE(out[2].contains("error"));  // one that reaches no GPU is created all the same
  CHECK(enforcer.series("gpuguard_node_enforcer_kubelet_errors_total") >= 1);
  // An answer over the receive limit is not tried again until the deadline: one List at the registration,
  // one per create.
  CHECK(kubelet.calls() <= 3);
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("a kubelet whose List is too large but that serves Get: each pod read alone, and judged") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  kubelet.set("team-a", "big", {{{"app", {{"nvidia.com/gpu", {default_node()[1].uuid}}}, {}}}, {}});
  kubelet.set_padding(100'000);  // about 21 MB, over the enforcer's 8 MiB
  kubelet.serve_get(true);
  EnforcerProcess enforcer(node);
  const auto out =
      run_runtime(node, {{"steps", json::array({{{"wait_plugin", 10}},
                                                create_step(gpu_less_pod("big"), cuda_container("c1")),
                                                create_step(gpu_less_pod("gone"), cuda_container("c2"))})}});
  INFO(enforcer.log().substr(0, 3000));
  CHECK(out[1]["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=" + default_node()[1].uuid}));
  CHECK(out[2]["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=void"}));  // a pod the kubelet does not know: none
  // The registration's List, over the limit, is the one error: every create was answered by Get.
  CHECK(enforcer.series("gpuguard_node_enforcer_kubelet_errors_total") == 1);
  CHECK(enforcer.terminate() == 0);
}

namespace {

// The memory limit the chart gives the enforcer's container (charts/gpuguard/values.yaml,
// nodeEnforcer.resources.limits.memory), in bytes.
std::size_t chart_memory_limit() {
  std::ifstream in(fs::path(GPUGUARD_SOURCE_DIR) / "charts/gpuguard/values.yaml");
  bool enforcer = false, limits = false;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("nodeEnforcer:")) enforcer = true;
    if (enforcer && line.find_first_not_of(' ') != std::string::npos &&
        line.substr(line.find_first_not_of(' ')) == "limits:") {
      limits = true;
    }
    if (limits && line.find("memory:") != std::string::npos && line.ends_with("Mi")) {
      const auto colon = line.find(':');
      return std::stoul(line.substr(colon + 1, line.size() - colon - 3)) << 20;
    }
  }
  FAIL("no nodeEnforcer.resources.limits.memory in the chart's values");
  return 0;
}

// A memory cgroup (v1, as the e2e node's and CI's kernels have it) with a limit, removed with what ran in it.
class MemoryCgroup {
 public:
  explicit MemoryCgroup(std::size_t limit)
      : dir_(fs::path("/sys/fs/cgroup/memory") / ("gpuguard-test-" + std::to_string(::getpid()))) {
    std::error_code ec;
    fs::create_directory(dir_, ec);
    INFO("a memory cgroup is needed to hold the enforcer to its chart's limit: " << ec.message());
    REQUIRE_FALSE(ec);
    std::ofstream(dir_ / "memory.limit_in_bytes") << limit;
    std::ofstream(dir_ / "memory.memsw.limit_in_bytes") << limit;  // no swap to spill into, where it is counted
  }
  ~MemoryCgroup() {
    std::error_code ec;
    fs::remove(dir_, ec);
  }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;
  const fs::path& dir() const { return dir_; }
  long long value(const std::string& name) const {
    std::ifstream in(dir_ / name);
    long long v = -1;
    in >> v;
    return v;
  }
  // memory.oom_control's oom_kill count (kernels from 4.13 say it), or -1.
  long long oom_kills() const {
    std::ifstream in(dir_ / "memory.oom_control");
    for (std::string key; in >> key;) {
      long long v = 0;
      in >> v;
      if (key == "oom_kill") return v;
    }
    return -1;
  }

 private:
  fs::path dir_;
};

}  // namespace

TEST_CASE(
    "under the chart's memory limit, 200 running containers of large values and a 1 MB mount path leave "
    "the enforcer answering everyone, within its bound") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  // Under AddressSanitizer (make test-sanitize) the heap is the sanitizer's: frees held in its quarantine
  // (256 MiB by default) and redzones around every block. There this test looks for memory errors on the
  // path, with room for the sanitizer; the bound itself is held by make test's build, at the chart's limit.
#if defined(__SANITIZE_ADDRESS__)
  constexpr bool kAddressSanitizer = true;
#else
  constexpr bool kAddressSanitizer = false;
#endif
  const std::size_t limit = chart_memory_limit();
  MemoryCgroup cgroup(kAddressSanitizer ? limit * 16 : limit);
  // Running containers as an ordinary user makes them, 200 of them, two to a pod. In 75 pods, the red team's:
  // their image sets the four variables the enforcer reads to 64 KiB each, and a volume is mounted at a path
  // of 64 KiB (before the enforcer bounded what it reads, a registration held all of it, and the kernel
  // killed it under this limit: docs/benchmarks.md). In 25 more, containers whose every door the view keeps
  // is full, each entry as long as it may be: the largest views there are. Every pod comes after its
  // containers, so that NRI's split Synchronize keeps the views waiting for their pods, within their budget.
  // (Two to a pod: NRI v0.12.3 splits a Synchronize by scaling its pods and containers per message alike,
  // and fewer pods than that scale starve, docs/node-enforcer.md#running-containers.)
  const std::string big(64 << 10, '7');
  json pods = json::array(), containers = json::array();
  for (int p = 0; p < 100; ++p) {
    const std::string name = std::string("heavy-").append(std::to_string(p));
    kubelet.set("team-a", name, {{{"app", {}, {}}}, {}});
    pods.insert(pods.begin(), gpu_less_pod(name));
    for (int c = 0; c < 2; ++c) {
      json container = {{"id", name + "-c" + std::to_string(c)},
                        {"podSandboxId", "sandbox-" + name},
                        {"name", "app"},
                        {"state", "CONTAINER_RUNNING"}};
      if (p < 75) {
        container["env"] = json::array({"NVIDIA_VISIBLE_DEVICES=" + big, "NVIDIA_IMEX_CHANNELS=" + big,
                                        "CUDA_VERSION=" + big, "NVIDIA_REQUIRE_CUDA=" + big});
        container["mounts"] = json::array(
            {{{"destination", "/var/run/nvidia-container-devices/" + big}, {"source", "/dev/null"}, {"type", "bind"}}});
      } else {
        json mounts = json::array(), devices = json::array(), cdi = json::array();
        for (std::size_t m = 0; m < enforcement::kMountsMax; ++m) {
          mounts.push_back(
              {{"destination", "/var/run/nvidia-container-devices/" + std::string(4000, 'm') + std::to_string(m)},
               {"source", "/dev/nvidia0"},
               {"type", "bind"}});
        }
        for (std::size_t d = 0; d < enforcement::kListMax; ++d) {
          devices.push_back({{"path", "/dev/nvidia" + std::string(240, '0')}, {"type", "c"}, {"major", 195}});
          cdi.push_back({{"name", "nvidia.com/gpu=" + std::string(240, 'g')}});
        }
        container["env"] = json::array(
            {"NVIDIA_VISIBLE_DEVICES=" + std::string(4000, '1'), "NVIDIA_IMEX_CHANNELS=" + std::string(4000, '2')});
        container["mounts"] = mounts;
        container["linux"] = {{"devices", devices}};
        container["CDI_devices"] = cdi;
      }
      containers.push_back(container);
    }
  }
  json path_pod = gpu_less_pod("long-path");
  json path_container = {
      {"id", "c-long"},
      {"name", "app"},
      {"mounts", json::array({{{"destination", "/var/run/nvidia-container-devices/" + std::string(1 << 20, 'p')},
                               {"source", "/dev/null"},
                               {"type", "bind"}}})}};
  kubelet.set("team-a", "long-path", {{{"app", {}, {}}}, {}});
  kubelet.set("team-a", "after", {{{"app", {{"nvidia.com/gpu", {default_node()[0].uuid}}}, {}}}, {}});
  // Started inside the cgroup: the child joins it before it executes the binary.
  EnforcerProcess enforcer(node, {}, cgroup.dir());
  const json script = {{"existing", {{"pods", pods}, {"containers", containers}}},
                       {"steps", json::array({{{"wait_plugin", 30}},
                                              create_step(path_pod, path_container),
                                              create_step(gpu_less_pod("after"), cuda_container("c-after"))})}};
  // NRI gives a Synchronize its request timeout in all, and marshalling some 60 MB in Go takes this machine
  // longer than the 2 s default: this is about memory, not time.
  const auto out = run_runtime(node, script, "--request-timeout 60s");
  INFO(enforcer.log().substr(0, 4000));
  // Alive, never killed, and registered once: the runtime synchronized it and it answered every call.
  CHECK(enforcer.running());
  CHECK(cgroup.oom_kills() <= 0);
  CHECK(out[0]["synced"] == 1);
  REQUIRE(out[1].contains("error"));
  // Read within the view's bounds, and refused by its size alone (fixture mount-path-over-path-max has the
  // path's own refusal).
  CHECK_THAT(out[1]["error"].get<std::string>(), Catch::Contains("its NRI message is 1024 KiB, over 640 KiB"));
  CHECK(out[2]["env"] == json::array({"NVIDIA_VISIBLE_DEVICES=" + default_node()[0].uuid}));
  // Every running container reported, judged or counted as not judged within the pending budget.
  CHECK(enforcer.series("gpuguard_node_enforcer_running_containers{state=\"beyond\"}") +
            enforcer.series("gpuguard_node_enforcer_running_containers{state=\"unjudged\"}") ==
        200);
  // The bound docs/node-enforcer.md#memory states: at rest, the one request held, its answer, and the
  // Synchronize's pending views within their budget (4 MiB), whatever the containers hold.
  const std::size_t peak = enforcer.status_kib("VmHWM") << 10;
  INFO("peak resident " << (peak >> 10) << " KiB; cgroup peak " << (cgroup.value("memory.max_usage_in_bytes") >> 10)
                        << " KiB; limit " << (limit >> 10) << " KiB");
  if (!kAddressSanitizer) {
    CHECK(peak < std::size_t{40} << 20);
    CHECK(peak < limit / 3 * 2);
  }
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE("the toolkit's configuration changed on the node: the next create is judged under it, without a restart") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  EnforcerFixture legacy;
  legacy.raw = {{"toolkit", {{"mode", "legacy"}, {"version", {1, 20, 1}}}}};
  install_toolkit(node, legacy);
  // No driver yet: /proc/driver/nvidia is made when it loads.
  fs::remove_all(node.host.root() / "proc/driver/nvidia");
  EnforcerProcess enforcer(node);
  const auto none_twice = [](const std::string& id) {
    json c = cuda_container(id);
    c["env"] = json::array({"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=none"});
    return c;
  };
  json device = cuda_container("c-device");
  device["env"] = json::array({"NVIDIA_VISIBLE_DEVICES=void"});
  device["linux"] = {
      {"devices", json::array({{{"path", "/dev/nvidia1"}, {"type", "c"}, {"major", 195}, {"minor", 1}}})}};
  for (const char* name : {"one", "two", "three", "four"}) kubelet.set("team-a", name, {{{"app", {}, {}}}, {}});
  // One connection throughout (a registration reads the node anew anyway): two creates, a hold in which the
  // node changes, two more.
  const Hold changed{node.dir / "changed"};
  const json script = {{"steps", json::array({{{"wait_plugin", 10}},
                                              create_step(gpu_less_pod("one"), none_twice("c1")),
                                              create_step(gpu_less_pod("two"), device),
                                              changed.step(),
                                              create_step(gpu_less_pod("three"), none_twice("c3")),
                                              create_step(gpu_less_pod("four"), device)})}};
  std::future<ExitResult> running = std::async(std::launch::async, [&] { return run_runtime_process(node, script); });
  const auto decided = [&] {
    const std::string page = http_request(enforcer.port(), "GET", "/metrics").body;
    long long count = 0;
    for (std::size_t at = page.find("\ngpuguard_node_enforcer_decisions_total{"); at != std::string::npos;
         at = page.find("\ngpuguard_node_enforcer_decisions_total{", at + 1)) {
      count += std::stoll(page.substr(page.find("} ", at) + 2));
    }
    return count;
  };
  REQUIRE(changed.reached());
  REQUIRE(decided() == 2);
  check_promtool_clean(http_request(enforcer.port(), "GET", "/metrics").body);
  // The toolkit becomes 1.18.1 in auto mode (jit-cdi, which reads none as all), and the driver loads.
  EnforcerFixture upgraded;
  upgraded.raw = {{"toolkit", {{"mode", "auto"}, {"version", {1, 18, 1}}}}};
  install_toolkit(node, upgraded);
  node.host.write("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n");
  for (const auto& gpu : default_node()) node.host.add_gpu(gpu.pci_address, gpu.uuid, gpu.minor, 0);
  changed.release();
  const auto out = runtime_steps(running.get(), script);
  CHECK(out[3]["released"] == true);
  INFO(enforcer.log());
  // Legacy: none is no GPU, left as it is; a GPU's node with no driver cannot be named.
  CHECK(out[1]["env"] == json::array());
  REQUIRE(out[2].contains("error"));
  CHECK_THAT(out[2]["error"].get<std::string>(), Catch::Contains("cannot be named: no driver is loaded"));
  // Read again at the next create, not at the next minute or registration.
  REQUIRE(out[4].contains("error"));
  CHECK_THAT(out[4]["error"].get<std::string>(), Catch::Contains("NVIDIA_VISIBLE_DEVICES=none"));
  REQUIRE(out[5].contains("error"));
  CHECK_THAT(out[5]["error"].get<std::string>(), Catch::Contains("/dev/nvidia1 reaches " + default_node()[1].uuid));
  CHECK_THAT(enforcer.log(), Catch::Contains("node read again, as what it is read from changed"));
  CHECK(enforcer.terminate() == 0);
}

TEST_CASE(
    "a CRI-O drop-in that does not parse: the toolkit's mode is not guessed, and the next create after a fix reads "
    "it") {
  Node node;
  FakeKubelet kubelet(node.kubelet_socket);
  // No handler runs NVIDIA's runtime: read whole, no variable selects anything, and a create that sets none
  // after all is left as it is. With a drop-in cut short, which handlers there are is not known.
  node.host.write("etc/crio/crio.conf", "[crio.runtime]\ndefault_runtime = \"crun\"\n");
  node.host.write("etc/crio/crio.conf.d/50-edit.conf", "[crio.runtime.runtimes.nvidia\nruntime_path = \"x\"\n");
  EnforcerProcess enforcer(node);
  const auto none_twice = [](const std::string& id) {
    json c = cuda_container(id);
    c["env"] = json::array({"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=none"});
    return c;
  };
  for (const char* name : {"one", "two"}) kubelet.set("team-a", name, {{{"app", {}, {}}}, {}});
  const Hold fixed{node.dir / "fixed"};
  const json script = {{"steps", json::array({{{"wait_plugin", 10}},
                                              create_step(gpu_less_pod("one"), none_twice("c1")),
                                              fixed.step(),
                                              create_step(gpu_less_pod("two"), none_twice("c2"))})}};
  std::future<ExitResult> running = std::async(std::launch::async, [&] { return run_runtime_process(node, script); });
  REQUIRE(fixed.reached());
  node.host.write("etc/crio/crio.conf.d/50-edit.conf", "[crio.runtime]\nlog_level = \"info\"\n");
  fixed.release();
  const auto out = runtime_steps(running.get(), script);
  INFO(enforcer.log());
  REQUIRE(out[1].contains("error"));
  CHECK_THAT(out[1]["error"].get<std::string>(), Catch::Contains("NVIDIA_VISIBLE_DEVICES=none"));
  CHECK_THAT(enforcer.log(), Catch::Contains("cannot judge the container runtime's configuration"));
  CHECK_THAT(enforcer.log(), Catch::Contains("/etc/crio/crio.conf.d/50-edit.conf: "));
  CHECK_FALSE(out[3].contains("error"));
  CHECK(out[3]["env"] == json::array());
  CHECK(enforcer.terminate() == 0);
}

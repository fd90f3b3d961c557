// The real gpuguard-device-plugin with NVML from the stand-in libnvidia-ml.so.1 (tests/support/fake_nvml.cpp),
// through the fake kubelet: every MIG strategy with every device list strategy, with and without
// time-slicing (register, list, allocate, preferred allocation), the CDI spec it writes as the CDI
// reference implementation reads it, and XID events from NVML.
#include "plugin_harness.hpp"

#include <nlohmann/json.hpp>

using namespace gpuguard::test;

namespace {

// Two GPUs: GPU 0 in MIG mode with two 1g.10gb+me devices (profile index 7, 1_SLICE_REV1) and a 3g.40gb
// one, GPU 1 whole; or both in MIG mode with 1g.10gb+me devices only (`all_mig`, for single).
nlohmann::json nvml_gpus(bool all_mig) {
  const auto mig = [](const std::string& uuid, unsigned gi, unsigned slices, unsigned memory) {
    return nlohmann::json{
        {"uuid", uuid},       {"gi", gi},           {"ci", 0}, {"profile", slices == 1 ? 7 : 2}, {"giSlices", slices},
        {"ciSlices", slices}, {"memoryMiB", memory}};
  };
  nlohmann::json gpu0 = {{"uuid", kGpu0},
                         {"minor", 0},
                         {"memoryMiB", 81559},
                         {"mig", {mig("MIG-aaaa", 7, 1, 9856), mig("MIG-bbbb", 8, 1, 9856)}}};
  if (!all_mig) gpu0["mig"].push_back(mig("MIG-cccc", 2, 3, 40192));
  nlohmann::json gpu1 = {{"uuid", kGpu1}, {"minor", 1}, {"memoryMiB", 81559}};
  if (all_mig) gpu1["mig"] = {mig("MIG-dddd", 7, 1, 9856)};
  return {{"gpus", {gpu0, gpu1}}};
}

struct NvmlNode : Node {
  fs::path nvml_file = host.root() / "nvml.json";
  explicit NvmlNode(bool all_mig) {
    std::ofstream(nvml_file) << nvml_gpus(all_mig).dump();
    host.add_mig(0, 7, 0, 70, 71);
    host.add_mig(0, 8, 0, 80, 81);
    host.add_mig(0, 2, 0, 20, 21);
    host.add_mig(1, 7, 0, 170, 171);
    host.add_device("/dev/nvidia-uvm");
  }
  std::vector<std::string> env() const {
    return {"LD_LIBRARY_PATH=" GPUGUARD_FAKE_NVML_DIR, "GPUGUARD_FAKE_NVML=" + nvml_file.string()};
  }
};

std::vector<std::string> listed_ids(v1beta1::DevicePlugin::Stub& stub) {
  DeviceWatch watch(stub);
  const auto list = watch.next();
  REQUIRE(list);
  std::vector<std::string> ids;
  for (const auto& device : list->devices()) ids.push_back(device.id());
  return ids;
}

std::vector<std::string> replicas(const std::vector<std::string>& uuids, unsigned count) {
  std::vector<std::string> ids;
  for (const auto& uuid : uuids) {
    for (unsigned n = 0; n < count; ++n) ids.push_back(uuid + "::" + std::to_string(n));
  }
  return ids;
}

std::vector<std::string> preferred(v1beta1::DevicePlugin::Stub& stub, const std::vector<std::string>& available,
                                   int size) {
  grpc::ClientContext context;
  v1beta1::PreferredAllocationRequest request;
  auto* container = request.add_container_requests();
  for (const auto& id : available) container->add_available_deviceids(id);
  container->set_allocation_size(size);
  v1beta1::PreferredAllocationResponse response;
  REQUIRE(stub.GetPreferredAllocation(&context, request, &response).ok());
  return {response.container_responses(0).deviceids().begin(), response.container_responses(0).deviceids().end()};
}

}  // namespace

TEST_CASE("every MIG strategy, device list strategy and time-slicing, through the fake kubelet") {
  struct Expected {
    std::map<std::string, std::vector<std::string>> units;  // resource -> GPU or MIG UUIDs
  };
  const std::map<std::string, Expected> by_mig = {
      {"none", {{{"nvidia.com/gpu", {kGpu0, kGpu1}}}}},
      {"single", {{{"nvidia.com/gpu", {"MIG-aaaa", "MIG-bbbb", "MIG-dddd"}}}}},
      {"mixed",
       {{{"nvidia.com/gpu", {kGpu1}},
         {"nvidia.com/mig-1g.10gb.me", {"MIG-aaaa", "MIG-bbbb"}},
         {"nvidia.com/mig-3g.40gb", {"MIG-cccc"}}}}},
  };
  for (const auto& [mig_strategy, expected] : by_mig) {
    for (const std::string list_strategy : {"envvar", "volume-mounts", "cdi-cri", "cdi-annotations"}) {
      for (const unsigned shared : {1U, 2U}) {
        DYNAMIC_SECTION(mig_strategy << " " << list_strategy << (shared > 1 ? " time-sliced" : "")) {
          NvmlNode node(mig_strategy == "single");
          const fs::path config = node.host.root() / "plugin.yaml";
          std::ofstream(config) << "version: v1\nflags:\n  migStrategy: " << mig_strategy
                                << "\n  plugin:\n    deviceListStrategy: " << list_strategy << "\n"
                                << (shared > 1 ? "sharing:\n  timeSlicing:\n    resources:\n"
                                                 "    - {name: nvidia.com/gpu, replicas: 2}\n"
                                                 "    - {name: mig-1g.10gb.me, replicas: 2}\n"
                                               : "");
          FakeKubelet kubelet(node.plugin_dir);
          const fs::path cdi_root = node.host.root() / "var/run/cdi";
          PluginProcess plugin(node.plugin_dir, node.host.root(),
                               {"--discovery", "nvml", "--config-file", config.string(), "--cdi-root", "/var/run/cdi"},
                               node.env());
          const auto registrations = kubelet.wait_for(expected.units.size());
          INFO(plugin.log());
          REQUIRE(registrations.size() == expected.units.size());
          for (const auto& [resource, uuids] : expected.units) {
            INFO(resource);
            const std::string& name = resource;  // a structured binding cannot be captured before C++20's fix
            const auto registration = std::find_if(registrations.begin(), registrations.end(),
                                                   [&](const auto& r) { return r.resource_name() == name; });
            REQUIRE(registration != registrations.end());
            auto stub = plugin_client(node.plugin_dir, registration->endpoint());
            const bool sliced = shared > 1 && resource != "nvidia.com/mig-3g.40gb";  // the config shares the others
            const auto ids = listed_ids(*stub);
            CHECK(ids == (sliced ? replicas(uuids, 2) : uuids));

            // Two devices of the resource: with replicas, preferred allocation puts them on two GPUs.
            const auto picked = preferred(*stub, ids, 2);
            REQUIRE(picked.size() == std::min<std::size_t>(2, ids.size()));
            if (sliced && uuids.size() > 1) CHECK(picked == std::vector<std::string>{ids[0], ids[2]});
            v1beta1::AllocateResponse response;
            REQUIRE(allocate(*stub, picked, response).ok());
            const auto& container = response.container_responses(0);
            std::vector<std::string> given;
            for (const auto& id : picked) {
              const std::string uuid = id.substr(0, id.find("::"));
              if (std::find(given.begin(), given.end(), uuid) == given.end()) given.push_back(uuid);
            }
            std::string joined, cdi_names;
            for (const auto& uuid : given) {
              if (!joined.empty()) {
                joined.append(",");
                cdi_names.append(",");
              }
              joined.append(uuid);
              cdi_names.append("k8s.gpuguard.io/gpu=").append(uuid);
            }
            // Every strategy: the allocated GPUs, for gpuguard-node-enforcer, on the container.
            CHECK(container.annotations().at("gpuguard.io/allocated-gpus") == joined);
            if (list_strategy == "envvar") {
              CHECK(container.envs().at("NVIDIA_VISIBLE_DEVICES") == joined);
            } else if (list_strategy == "volume-mounts") {
              CHECK(container.envs().at("NVIDIA_VISIBLE_DEVICES") == "/var/run/nvidia-container-devices");
              REQUIRE(container.mounts_size() == static_cast<int>(given.size()));
              CHECK(container.mounts(0).container_path() == "/var/run/nvidia-container-devices/" + given[0]);
            } else if (list_strategy == "cdi-cri") {
              CHECK(container.envs().at("NVIDIA_VISIBLE_DEVICES") == "void");
              REQUIRE(container.cdi_devices_size() == static_cast<int>(given.size()));
              CHECK(container.cdi_devices(0).name() == "k8s.gpuguard.io/gpu=" + given[0]);
            } else {
              CHECK(container.envs().at("NVIDIA_VISIBLE_DEVICES") == "void");
              std::string key = "cdi.k8s.io/gpuguard_" + resource;
              std::replace(key.begin() + 11, key.end(), '/', '_');
              CHECK(container.annotations().at(key) == cdi_names);
            }
          }
          CHECK(fs::exists(cdi_root / "k8s.gpuguard.io-gpu.json"));  // NVIDIA's runtime in cdi mode reads it too
          CHECK(plugin.terminate() == 0);
        }
      }
    }
  }
}

TEST_CASE("CDI spec: MIG devices with their capability nodes, as the CDI reference implementation reads it") {
  NvmlNode node(false);
  FakeKubelet kubelet(node.plugin_dir);
  const fs::path cdi_root = node.host.root() / "var/run/cdi";
  PluginProcess plugin(node.plugin_dir, node.host.root(),
                       {"--discovery", "nvml", "--mig-strategy", "mixed", "--device-list-strategy", "cdi-cri",
                        "--cdi-root", "/var/run/cdi"},
                       node.env());
  REQUIRE(kubelet.wait_for(3).size() == 3);
  const fs::path spec_file = cdi_root / "k8s.gpuguard.io-gpu.json";
  std::ifstream in(spec_file);
  const auto spec = nlohmann::json::parse(in);
  CHECK(spec["kind"] == "k8s.gpuguard.io/gpu");
  REQUIRE(spec["devices"].size() == 6);  // GPU 1 whole, three MIG devices of GPU 0, all, none
  CHECK(spec["devices"][0]["name"] == kGpu1);
  const auto mig = std::find_if(spec["devices"].begin(), spec["devices"].end(),
                                [](const auto& d) { return d["name"] == "MIG-cccc"; });
  REQUIRE(mig != spec["devices"].end());
  CHECK((*mig)["containerEdits"]["deviceNodes"] ==
        nlohmann::json::parse(R"([{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia-caps/nvidia-cap20"},
                                  {"path": "/dev/nvidia-caps/nvidia-cap21"}])"));
  CHECK(spec["containerEdits"]["deviceNodes"] ==
        nlohmann::json::parse(R"([{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}])"));
  const std::string validate = std::string(GPUGUARD_CDI_VALIDATE) + " " + spec_file.string();
  CHECK(WEXITSTATUS(std::system(validate.c_str())) == 0);
  CHECK(plugin.terminate() == 0);
}

TEST_CASE("cdi-cri with no CDI root names nvidia-ctk's devices and writes no spec") {
  NvmlNode node(false);
  FakeKubelet kubelet(node.plugin_dir);
  PluginProcess plugin(node.plugin_dir, node.host.root(),
                       {"--discovery", "nvml", "--device-list-strategy", "cdi-cri", "--cdi-root", ""}, node.env());
  REQUIRE(kubelet.wait_for(1).size() == 1);
  v1beta1::AllocateResponse response;
  REQUIRE(allocate(*plugin_client(node.plugin_dir, "gpuguard-nvidia-com-gpu.sock"), {kGpu1}, response).ok());
  CHECK(response.container_responses(0).cdi_devices(0).name() == "nvidia.com/gpu=" + kGpu1);
  CHECK_FALSE(fs::exists(node.host.root() / "var/run/cdi"));
  CHECK(plugin.terminate() == 0);
}

TEST_CASE("NVML health: an XID turns a GPU and its replicas Unhealthy, and single refuses what it cannot serve") {
  NvmlNode node(false);
  FakeKubelet kubelet(node.plugin_dir);
  const fs::path config = node.host.root() / "plugin.yaml";
  std::ofstream(config) << "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}\n";
  PluginProcess plugin(node.plugin_dir, node.host.root(), {"--discovery", "nvml", "--config-file", config.string()},
                       node.env());
  REQUIRE(kubelet.wait_for(1).size() == 1);
  auto gpus = plugin_client(node.plugin_dir, "gpuguard-nvidia-com-gpu.sock");
  DeviceWatch watch(*gpus);
  REQUIRE(watch.next());
  std::ofstream(node.nvml_file.string() + ".xids") << kGpu1 << " 79\n";  // fallen off the bus
  REQUIRE(watch.until(kGpu1 + "::1", "Unhealthy"));
  CHECK(plugin.terminate() == 0);
  CHECK_THAT(plugin.log(), Catch::Contains("XID 79, which needs a GPU reset"));

  PluginProcess single(node.plugin_dir, node.host.root(),
                       {"--discovery", "nvml", "--mig-strategy", "single", "--fail-on-init-error"}, node.env());
  CHECK(single.wait_exit(30s) == 1);  // it refuses to start by itself, however slowly (sanitizers)
  CHECK_THAT(single.log(), Catch::Contains("GPU " + kGpu0 + " is in MIG mode and GPU " + kGpu1 + " is not"));
}

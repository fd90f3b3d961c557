#pragma once
// Which of this node's GPUs something else already serves, judged from what the kubelet offers under every
// resource name (its pod-resources GetAllocatableResources), and what pods hold, through device plugins and
// DRA claims (its List): gpuguard's plugin serves a GPU only where no
// other plugin does, whatever name that one registered and whichever of the two started first. Pure: the
// kubelet's answer in, the GPUs to withhold out; kubelet_offers.hpp asks the kubelet.
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/discovery/discovery.hpp"

namespace gpuguard::deviceplugin {

// One resource the kubelet offers: the IDs of its healthy devices, as their plugin named them.
struct OfferedResource {
  std::string name;
  std::vector<std::string> device_ids;
};

// Every UUID of this node's GPUs and their MIG devices, found in any text, case aside: an ID a plugin
// made around one (UUID::n, MIG-GPU-…/gi/ci), or a ResourceSlice's whole JSON.
class GpuUuids {
 public:
  explicit GpuUuids(const std::vector<discovery::Gpu>& gpus);
  // Adds to `out` the GPU (its UUID as discovered) of each UUID the text holds: at each "gpu-" or "mig-",
  // the text as long as a known UUID is looked up. Linear in the text's length (times the few lengths
  // UUIDs have), whatever it holds.
  void find(std::string_view text, std::set<std::string>& out) const;

 private:
  void add(const std::string& uuid, const std::string& gpu);

  std::map<std::string, std::string, std::less<>> gpu_of_;  // lower-case UUID: its GPU's UUID
  std::vector<std::size_t> lengths_;
};

// A device a pod holds through a DRA claim (pod-resources List's dynamic_resources) is judged as a resource
// named "dra:" and its driver's name: no extended resource name has a ':', so it is never gpuguard's own,
// and every device of one driver is judged together, as a resource's are.
inline constexpr std::string_view kDraPrefix = "dra:";

// A pod the kubelet runs on this node (pod-resources List lists every one, devices or not): its namespace,
// name and containers' names.
struct PodOnNode {
  std::string pod_namespace;
  std::string name;
  std::vector<std::string> containers;
};

// Which of NVIDIA's GPU servers a pod is, and by which of its containers; empty where it is none.
struct NvidiaGpuServer {
  std::string server;  // "NVIDIA's device plugin" or "NVIDIA's DRA driver"
  std::string container;
  bool empty() const { return container.empty(); }
};

// The server by which a pod is one of NVIDIA's GPU servers, whatever its release is called, or none:
// NVIDIA's device plugin's (nvidia-device-plugin-ctr in its Helm chart and its static manifests,
// nvidia-device-plugin in the GPU Operator's DaemonSet), or the GPUs container (gpus) of NVIDIA's DRA
// driver's kubelet plugin, whose pods are named after its DaemonSet: <name>-kubelet-plugin-<five random
// characters>, the name holding dra-driver (nvidia-dra-driver-kubelet-plugin in the GPU Operator, its own
// chart's dra-driver-nvidia-gpu-kubelet-plugin, before that nvidia-dra-driver-gpu-kubelet-plugin).
NvidiaGpuServer nvidia_gpu_server(const PodOnNode& pod);

// Every GPU, where a pod of one of `infrastructure` (the GPU infrastructure's namespaces, which tenants
// cannot create pods in: --infrastructure-namespaces) runs NVIDIA's device plugin or its DRA driver's
// kubelet plugin for GPUs on this node, whether it has registered or published yet or not: on a fresh
// node they and gpuguard's plugin start together, and whichever is first must not decide.
// Each GPU with why.
std::map<std::string, std::string> nvidia_plugin_on_node(const std::vector<PodOnNode>& pods,
                                                         const std::set<std::string>& infrastructure,
                                                         const std::vector<discovery::Gpu>& gpus);

// Whether a resource name is one NVIDIA's plugin gives GPUs (nvidia.com/gpu, gpu.<anything> such as
// gpu.shared, mig-<profile>), or NVIDIA's DRA driver for GPUs (dra:gpu.nvidia.com): such a resource with an
// ID that names none of this node's GPUs (NVIDIA's deviceIDStrategy=index, a MIG device made after
// discovery, a DRA device neither gpu-<minor> nor gpu-<minor>-mig-… of a minor here) may serve any of them.
bool names_gpus(std::string_view resource);

// The GPUs (by UUID) that a resource other than own_resources serves, each with why. A device ID serves a
// GPU when it holds that GPU's UUID or one of its MIG devices' (UUID, UUID::n, MIG-…, MIG-GPU-…/gi/ci:
// whatever a plugin adds around it), case aside; a device of NVIDIA's DRA driver for GPUs serves the GPU of
// the minor its name gives (gpu-<minor>, gpu-<minor>-mig-…). A GPU resource (names_gpus) with an ID that
// does neither may serve them all.
std::map<std::string, std::string> served_elsewhere(const std::vector<OfferedResource>& offered,
                                                    const std::set<std::string>& own_resources,
                                                    const std::vector<discovery::Gpu>& gpus);

// One container's devices of one resource, as the kubelet's List gives them (a DRA claim's as served_elsewhere
// reads them, under kDraPrefix), and the pod that holds them, as namespace/name.
struct HeldDevices {
  std::string pod;
  OfferedResource devices;
};

// The GPUs given twice. Either a pod holds one through one of own_resources while a pod holds it through
// another resource or a DRA claim (judged as served_elsewhere judges an offer, so an ID of a GPU resource
// that names no GPU here may be any of them, under gpuguard's own names too); or a pod holds it whole
// through a device plugin while another pod holds it in any form through one (another plugin under
// gpuguard's own name, which the kubelet lists as one resource; pods sharing a DRA claim are not counted).
// Withholding keeps a GPU from pods to come, not from those that hold it: where gpuguard's plugin gave a
// GPU before another server began to serve it, both pods run on it. Each GPU with a few of its holders.
std::map<std::string, std::string> held_twice(const std::vector<HeldDevices>& held,
                                              const std::set<std::string>& own_resources,
                                              const std::vector<discovery::Gpu>& gpus);

}  // namespace gpuguard::deviceplugin

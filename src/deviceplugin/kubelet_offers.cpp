// The kubelet's offers over its pod-resources socket (include/gpuguard/deviceplugin/kubelet_offers.hpp).
#include "gpuguard/deviceplugin/kubelet_offers.hpp"

#include <grpcpp/grpcpp.h>

#include "podresources/v1/api.grpc.pb.h"

namespace gpuguard::deviceplugin {

struct KubeletOffers::Impl {
  std::unique_ptr<::v1::PodResourcesLister::Stub> stub;
};

KubeletOffers::KubeletOffers(const std::filesystem::path& socket) : impl_(std::make_unique<Impl>()) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxReceive);
  // A kubelet that restarts makes its socket anew: asked again within seconds, not after gRPC's 2-minute backoff.
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  impl_->stub = ::v1::PodResourcesLister::NewStub(
      grpc::CreateCustomChannel("unix://" + socket.string(), grpc::InsecureChannelCredentials(), arguments));
}

KubeletOffers::~KubeletOffers() = default;

KubeletOffers::Answer KubeletOffers::read(std::chrono::milliseconds deadline) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  ::v1::AllocatableResourcesResponse response;
  const grpc::Status status = impl_->stub->GetAllocatableResources(&context, {}, &response);
  Answer answer;
  if (!status.ok()) {
    answer.error =
        "GetAllocatableResources: " + status.error_message() + " (code " + std::to_string(status.error_code()) + ")";
    return answer;
  }
  for (const ::v1::ContainerDevices& devices : response.devices()) {
    answer.resources.push_back({devices.resource_name(), {devices.device_ids().begin(), devices.device_ids().end()}});
  }
  // What pods hold, too: the kubelet keeps their devices across its restarts, while the plugin that gave
  // them has not registered again (after a node's reboot, or while it crash-loops) and offers nothing.
  grpc::ClientContext listing;
  listing.set_deadline(std::chrono::system_clock::now() + deadline);
  ::v1::ListPodResourcesResponse pods;
  if (const grpc::Status listed = impl_->stub->List(&listing, {}, &pods); !listed.ok()) {
    answer.resources.clear();
    answer.error = "List: " + listed.error_message() + " (code " + std::to_string(listed.error_code()) + ")";
    return answer;
  }
  for (const ::v1::PodResources& pod : pods.pod_resources()) {
    PodOnNode& on_node = answer.pods.emplace_back(PodOnNode{pod.namespace_(), pod.name(), {}});
    for (const ::v1::ContainerResources& container : pod.containers()) {
      on_node.containers.push_back(container.name());
      const std::string holder = pod.namespace_() + "/" + pod.name();
      for (const ::v1::ContainerDevices& devices : container.devices()) {
        answer.resources.push_back(
            {devices.resource_name(), {devices.device_ids().begin(), devices.device_ids().end()}});
        answer.held.push_back({holder, answer.resources.back()});
      }
      // A device given through a DRA claim (the kubelet reports them from 1.34, by default): its driver's,
      // under kDraPrefix, one ID of its name, its pool and its CDI devices' names, where a UUID may be.
      for (const ::v1::DynamicResource& claim : container.dynamic_resources()) {
        for (const ::v1::ClaimResource& device : claim.claim_resources()) {
          std::string id = device.device_name() + " " + device.pool_name();
          for (const ::v1::CDIDevice& cdi : device.cdi_devices()) id += " " + cdi.name();
          answer.resources.push_back({std::string(kDraPrefix) + device.driver_name(), {std::move(id)}});
          answer.held.push_back({holder, answer.resources.back()});
        }
      }
    }
  }
  return answer;
}

}  // namespace gpuguard::deviceplugin

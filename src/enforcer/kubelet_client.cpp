// The kubelet's pod-resources API over gRPC (include/gpuguard/enforcer/kubelet_client.hpp).
#include "gpuguard/enforcer/kubelet_client.hpp"

#include <grpcpp/grpcpp.h>

#include <thread>

#include "podresources/v1/api.grpc.pb.h"

namespace gpuguard::enforcer {
namespace {

using Clock = std::chrono::steady_clock;

// A pod with a hundred containers and devices is tens of KB; a node's List, a few MB at most.
constexpr int kMaxReceive = 16 << 20;
constexpr auto kRateLimitPause = std::chrono::milliseconds(15);  // a token every 10 ms at 100 a second

PodResources convert(const ::v1::PodResources& pod) {
  PodResources out;
  for (const ::v1::ContainerResources& container : pod.containers()) {
    PodResources::Container converted;
    converted.name = container.name();
    for (const ::v1::ContainerDevices& devices : container.devices()) {
      // The kubelet sends one entry per device (and NUMA node): grouped by resource here.
      auto same = std::find_if(converted.devices.begin(), converted.devices.end(),
                               [&](const PodResources::Devices& d) { return d.resource == devices.resource_name(); });
      if (same == converted.devices.end()) {
        converted.devices.push_back({devices.resource_name(), {}});
        same = converted.devices.end() - 1;
      }
      same->ids.insert(same->ids.end(), devices.device_ids().begin(), devices.device_ids().end());
    }
    for (const ::v1::DynamicResource& claim : container.dynamic_resources()) {
      for (const ::v1::ClaimResource& resource : claim.claim_resources()) {
        for (const ::v1::CDIDevice& device : resource.cdi_devices()) {
          // The kubelet repeats a driver's earlier devices in each later entry: kept once.
          if (std::find(converted.cdi_devices.begin(), converted.cdi_devices.end(), device.name()) ==
              converted.cdi_devices.end()) {
            converted.cdi_devices.push_back(device.name());
          }
        }
      }
    }
    out.containers.push_back(std::move(converted));
  }
  return out;
}

}  // namespace

struct KubeletClient::Impl {
  std::unique_ptr<::v1::PodResourcesLister::Stub> stub;

  // List, tried again while the kubelet's rate limit turns it away, until the deadline.
  grpc::Status list(::v1::ListPodResourcesResponse& response, std::chrono::milliseconds deadline) {
    const auto until = Clock::now() + deadline;
    for (;;) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::duration_cast<std::chrono::system_clock::duration>(until - Clock::now()));
      grpc::Status status = stub->List(&context, ::v1::ListPodResourcesRequest(), &response);
      if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED || Clock::now() + kRateLimitPause >= until) {
        return status;
      }
      std::this_thread::sleep_for(kRateLimitPause);
    }
  }
};

KubeletClient::KubeletClient(const std::filesystem::path& socket) : impl_(std::make_unique<Impl>()) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxReceive);
  impl_->stub = ::v1::PodResourcesLister::NewStub(
      grpc::CreateCustomChannel("unix://" + socket.string(), grpc::InsecureChannelCredentials(), arguments));
}

KubeletClient::~KubeletClient() = default;

KubeletAnswer KubeletClient::pod(const std::string& pod_namespace, const std::string& pod_name,
                                 std::chrono::milliseconds deadline) {
  ::v1::ListPodResourcesResponse response;
  const grpc::Status status = impl_->list(response, deadline);
  KubeletAnswer answer;
  if (!status.ok()) {
    answer.error = "List: " + status.error_message() + " (code " + std::to_string(status.error_code()) + ")";
    return answer;
  }
  answer.answered = true;
  for (const ::v1::PodResources& pod : response.pod_resources()) {
    if (pod.namespace_() == pod_namespace && pod.name() == pod_name) {
      answer.pod = convert(pod);
      break;
    }
  }
  return answer;
}

std::map<std::string, PodResources> KubeletClient::all(std::chrono::milliseconds deadline, std::string& error) {
  ::v1::ListPodResourcesResponse response;
  const grpc::Status status = impl_->list(response, deadline);
  std::map<std::string, PodResources> pods;
  if (!status.ok()) {
    error = "List: " + status.error_message() + " (code " + std::to_string(status.error_code()) + ")";
    return pods;
  }
  for (const ::v1::PodResources& pod : response.pod_resources())
    pods[pod.namespace_() + "/" + pod.name()] = convert(pod);
  return pods;
}

}  // namespace gpuguard::enforcer

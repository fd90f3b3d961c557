// The kubelet's pod-resources API for bench/enforcer_request.sh, which has no kubelet: List (and Get) answer
// the pods of a JSON file ({"pod_resources": [{"name", "namespace", "containers": [{"name"}]}]}), so that the
// node enforcer reads and judges every running container at a registration, as on a node.
//   gpuguard_fake_kubelet --socket PATH --pods FILE
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "podresources/v1/api.grpc.pb.h"

namespace {

class Kubelet final : public v1::PodResourcesLister::Service {
 public:
  explicit Kubelet(const nlohmann::json& pods) {
    for (const auto& pod : pods.value("pod_resources", nlohmann::json::array())) {
      v1::PodResources& out = *list_.add_pod_resources();
      out.set_name(pod.value("name", ""));
      out.set_namespace_(pod.value("namespace", ""));
      for (const auto& container : pod.value("containers", nlohmann::json::array())) {
        out.add_containers()->set_name(container.value("name", ""));
      }
    }
  }
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* out) override {
    *out = list_;
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* in,
                   v1::GetPodResourcesResponse* out) override {
    for (const auto& pod : list_.pod_resources()) {
      if (pod.name() == in->pod_name() && pod.namespace_() == in->pod_namespace()) {
        *out->mutable_pod_resources() = pod;
        return grpc::Status::OK;
      }
    }
    return {grpc::StatusCode::UNKNOWN, "pod " + in->pod_name() + " in namespace " + in->pod_namespace() + " not found"};
  }

 private:
  v1::ListPodResourcesResponse list_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string socket, pods;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--socket") socket = argv[i + 1];
    if (flag == "--pods") pods = argv[i + 1];
  }
  if (socket.empty() || pods.empty()) {
    std::cerr << "usage: gpuguard_fake_kubelet --socket PATH --pods FILE\n";
    return 2;
  }
  std::ifstream in(pods);
  const auto parsed = nlohmann::json::parse(in, nullptr, false);
  if (parsed.is_discarded()) {
    std::cerr << "gpuguard_fake_kubelet: " << pods << " is not JSON\n";
    return 2;
  }
  // The stop signals are waited for below, by this thread alone: blocked before gRPC starts its threads.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  Kubelet kubelet(parsed);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&kubelet);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return 1;
  int signal = 0;
  sigwait(&stop, &signal);
  server->Shutdown();
  return 0;
}

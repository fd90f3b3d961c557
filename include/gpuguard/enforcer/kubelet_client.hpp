#pragma once
// The kubelet's pod-resources API (/var/lib/kubelet/pod-resources/kubelet.sock, v1 List) over gRPC, as
// allocation.hpp's plain data. List rather than Get: Get answers a pod it does not know with a bare error
// (code Unknown), which cannot be told from a failure, where List's absence of the pod is an answer. The
// kubelet limits the API to 100 calls a second with a burst of 10: a call it turns away
// (RESOURCE_EXHAUSTED) is tried again within the deadline.
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "gpuguard/enforcer/allocation.hpp"

namespace gpuguard::enforcer {

class KubeletClient {
 public:
  explicit KubeletClient(const std::filesystem::path& socket);
  ~KubeletClient();
  KubeletClient(const KubeletClient&) = delete;
  KubeletClient& operator=(const KubeletClient&) = delete;

  // What the kubelet allocated to the pod (by namespace and name, as pod-resources knows pods).
  KubeletAnswer pod(const std::string& pod_namespace, const std::string& pod_name, std::chrono::milliseconds deadline);
  // Every pod the kubelet lists, by "namespace/name"; `error` set when it could not be read.
  std::map<std::string, PodResources> all(std::chrono::milliseconds deadline, std::string& error);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::enforcer

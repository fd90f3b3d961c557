#pragma once
// The kubelet's pod-resources API (/var/lib/kubelet/pod-resources/kubelet.sock, v1) over gRPC: where the
// node enforcer's allocations come from (ports.hpp's PodResourcesSource). Its answers are taken as the bytes
// gRPC received and read as a stream (pod_resources_reader.hpp), never converted whole. Get, where the
// kubelet serves it (KubeletPodResourcesGet: beta and on from Kubernetes 1.34, GA from 1.36), answers one
// pod; List answers every pod, and serves where Get does not. The kubelet limits the API to 100 calls a
// second with a burst of 10: a call it turns away (RESOURCE_EXHAUSTED, "rejected by rate limit") is tried
// again within the deadline; an answer over the receive limit is not. One call at a time: the bytes of one
// answer, at most kMaxReceive, are all it holds of the kubelet's at once.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "gpuguard/enforcer/ports.hpp"

namespace gpuguard::enforcer {

class KubeletClient final : public PodResourcesSource {
 public:
  // An answer larger than this is refused by gRPC before it is read.
  // 8 MiB: gRPC holds up to about two and a half times a message while it receives it (docs/node-enforcer.md#memory).
  static constexpr int kMaxReceive = 8 << 20;

  explicit KubeletClient(const std::filesystem::path& socket);
  ~KubeletClient() override;
  KubeletClient(const KubeletClient&) = delete;
  KubeletClient& operator=(const KubeletClient&) = delete;

  std::string list(std::chrono::milliseconds deadline, const Wanted& wanted, const Take& take) override;
  std::optional<KubeletAnswer> get(const std::string& pod_namespace, const std::string& pod_name,
                                   std::chrono::milliseconds deadline) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::enforcer

#pragma once
// Asks the kubelet what it offers under every resource name (pod-resources GetAllocatableResources) and
// what its pods hold (List: devices and DRA claims), for served_elsewhere.hpp: one channel to the socket,
// one call at a time, each answer at most kMaxReceive.
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gpuguard/deviceplugin/served_elsewhere.hpp"

namespace gpuguard::deviceplugin {

class KubeletOffers {
 public:
  // Larger answers are refused by gRPC, unread: a node's devices take a few KiB.
  static constexpr int kMaxReceive = 4 << 20;

  struct Answer {
    std::vector<OfferedResource> resources;
    std::string error;                   // empty when the kubelet answered
    std::vector<PodOnNode> pods = {};    // every pod it runs, each with its containers' names
    std::vector<HeldDevices> held = {};  // what each pod's containers hold, also in resources
  };

  explicit KubeletOffers(const std::filesystem::path& socket);
  ~KubeletOffers();
  KubeletOffers(const KubeletOffers&) = delete;
  KubeletOffers& operator=(const KubeletOffers&) = delete;

  Answer read(std::chrono::milliseconds deadline);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::deviceplugin

#pragma once
// List-and-watch of a few Kubernetes resources, each kept in the caller's cache: for each resource a
// Reflector (the state machine) drives an API client (the transport) on one thread of its own. What
// client-go's informers do, and no more.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/kube/api_server.hpp"
#include "gpuguard/kube/reflector.hpp"
#include "gpuguard/kube/store.hpp"

namespace gpuguard::kube {

struct WatchedResource {
  std::string name;            // "pods": for logs and metrics
  std::string path;            // "/api/v1/pods"
  std::string field_selector;  // as kubectl takes it, e.g. "status.phase!=Failed"; empty for none
  Store* store = nullptr;      // the caller's, outliving the Informers
};

struct InformerOptions {
  ReflectorOptions reflector;
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds list_page_timeout{60'000};
  unsigned page_size = 500;
  std::string user_agent = "gpuguard";
};

// Called with what each list or watch came to, for metrics.
using InformerObserver = std::function<void(std::string_view resource, ReflectorOutcome outcome)>;

class Informers {
 public:
  Informers(ApiServer server, std::vector<WatchedResource> resources, InformerOptions options = {},
            InformerObserver observer = {});
  ~Informers();
  Informers(const Informers&) = delete;
  Informers& operator=(const Informers&) = delete;

  void start();
  // True once every resource has been listed (it stays true through later re-lists and outages).
  bool synced() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::kube

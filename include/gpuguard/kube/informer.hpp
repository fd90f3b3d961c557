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
#include "gpuguard/kube/discovery.hpp"
#include "gpuguard/kube/reflector.hpp"
#include "gpuguard/kube/store.hpp"

namespace gpuguard::kube {

struct WatchedResource {
  std::string name;            // "pods": for logs and metrics
  std::string path;            // "/api/v1/pods", or "/apis/<group>/{version}/<resource>" with `versions`
  std::string field_selector;  // as kubectl takes it, e.g. "status.phase!=Failed"; empty for none
  Store* store = nullptr;      // the caller's, outliving the Informers
  // Where the group's version differs between releases: the versions the store can read, newest first.
  // The group's discovery document picks one for "{version}"; while the server serves none of them, the
  // store holds one empty complete list (it counts as synced) and the discovery is asked again every
  // InformerOptions::rediscover_interval, so that a cluster that gains the API is read without a restart.
  std::vector<std::string> versions = {};
  std::string label_selector = {};  // as kubectl takes it, e.g. "gpuguard.io/ignore"; empty for none
};

struct InformerOptions {
  ReflectorOptions reflector;
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds list_page_timeout{60'000};
  unsigned page_size = 500;
  std::string user_agent = "gpuguard";
  std::chrono::milliseconds rediscover_interval{60'000};
  // A resource's list and watch, or a group's discovery, that fails (an exception from its store or the
  // observer: a bug, or memory the process cannot get) starts again after this pause, listing first, while
  // the other resources' watches go on. The pause doubles with each failure that comes within restart_max
  // of the last start, up to restart_max, so that one that repeats at once lists at most that often.
  std::chrono::milliseconds restart_after{5'000};
  std::chrono::milliseconds restart_max{300'000};
  // Called for each group of versioned resources with what its discovery came to, first and whenever it
  // changes (never with Outcome::unreadable: that is retried with the reflector's backoff).
  std::function<void(const std::string& group, const GroupDiscovery& found)> on_discovery = {};
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
  // What discovery found for a group of versioned resources; Outcome::unreadable while it is still asking.
  GroupDiscovery discovered(const std::string& group) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::kube

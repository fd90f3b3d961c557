#pragma once
// A small Kubernetes API client: list, then watch from the list's resourceVersion, for a few resources,
// over HTTPS with the service account's bearer token. What client-go's reflector does, and no more.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gpuguard::kube {

struct ApiServer {
  std::string host;  // DNS name or IP address (IPv6 without brackets)
  std::string port = "443";
  std::string path_prefix;           // for an apiserver behind a proxy path; usually empty
  std::filesystem::path token_file;  // re-read for every request; empty: no Authorization header
  std::filesystem::path ca_file;     // re-read for every connection; empty: the system's trust store

  // https://host[:port][/prefix]. Throws std::invalid_argument naming what is wrong.
  static ApiServer from_url(std::string_view url);
  // KUBERNETES_SERVICE_HOST/PORT and the service account's token and CA. Throws std::runtime_error when
  // those are missing (not running in a pod).
  static ApiServer in_cluster();
  std::string url() const;
};

inline constexpr const char* kServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";

struct WatchedResource {
  std::string name;            // "pods": for logs and metrics
  std::string path;            // "/api/v1/pods"
  std::string field_selector;  // as kubectl takes it, e.g. "status.phase!=Failed"; empty for none
  // Applied to every listed item as its page arrives, so that a large collection is not held whole
  // until the last page: keep only the fields `replace` reads. Optional.
  std::function<nlohmann::json(const nlohmann::json& item)> trim;
  // The whole collection after each (re-)list, then every ADDED, MODIFIED and DELETED object.
  std::function<void(const std::vector<nlohmann::json>& items)> replace;
  std::function<void(std::string_view type, const nlohmann::json& object)> apply;
};

struct InformerOptions {
  std::chrono::milliseconds backoff_initial{500};
  std::chrono::milliseconds backoff_max{30'000};
  // Each watch asks the apiserver to end it after a random time in this range, as client-go does, so
  // that watches of many clients do not all restart together.
  std::chrono::seconds watch_timeout_min{300};
  std::chrono::seconds watch_timeout_max{600};
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds list_page_timeout{60'000};
  unsigned page_size = 500;
  std::string user_agent = "gpuguard";
};

// Why a list or watch ended, for metrics: list_success, list_failure, watch_closed (the apiserver ended
// it; the next one resumes from the last resourceVersion), watch_gone (410: that version is compacted
// away, so the next step is a full list) and watch_error (dropped or refused; retried with backoff from
// the last resourceVersion).
using InformerObserver = std::function<void(std::string_view resource, std::string_view outcome)>;

// Runs one list-and-watch loop per resource on a thread of its own until destroyed.
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

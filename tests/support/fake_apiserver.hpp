#pragma once
// A Kubernetes API server just big enough for list and watch of pods, nodes, namespaces and the admission
// configurations (by name), for the PATCH of a Node's status conditions that the device plugin sends, for
// DRA claims in whichever resource.k8s.io versions a test has it serve (with the group's discovery
// document), and for the audit loop's Leases (get, create, update on the resourceVersion read, as the API
// server checks it) and PolicyReports (server-side apply, delete, list), over real TLS (the test CA's
// 127.0.0.1 certificate) with a bearer token. It keeps a history of events, as etcd does, so that a watch
// resumed from a resourceVersion gets what it missed, until compact() forgets it: then such a watch gets
// 410 Gone. Tests can cut every open watch stream mid-flight.
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpuguard::test {

class FakeApiserver {
 public:
  // On `address` (another loopback address: 127.0.0.2) at `port` (0: any), serving the certificate and key in
  // `certs` (empty: the test certificates, which name 127.0.0.1 and localhost).
  explicit FakeApiserver(std::string token, const std::string& address = "127.0.0.1", const std::string& certs = "",
                         unsigned short port = 0);
  unsigned short port() const;
  ~FakeApiserver();

  std::string url() const;

  // resource is "pods", "nodes", "namespaces", "mutatingwebhookconfigurations",
  // "validatingadmissionpolicybindings", "validatingadmissionpolicies", "resourceclaims" or
  // "resourceclaimtemplates". put() is ADDED or MODIFIED, remove() DELETED, each with the next resourceVersion.
  // With `record` false the change leaves no event: only a list shows it (what a client misses when the history
  // it would resume from is compacted).
  void put(const std::string& resource, nlohmann::json object, bool record = true);
  void remove(const std::string& resource, const std::string& name, bool record = true);
  // Forgets the history up to now: a watch from any version before the next one gets 410 Gone.
  // As an ERROR event in a 200 stream (what the watch cache does), or as an HTTP 410 status.
  void compact(bool as_http_status = false);
  // Closes every open watch connection without ending its chunked body.
  void drop_watches();
  // Closes every connection open now, idle keep-alive ones included (what an API server restart does).
  void cut_connections();
  // TLS handshakes completed so far: one per connection a client made.
  std::size_t handshakes() const;
  void set_token(std::string token);
  // While held, list requests wait (to observe an extender that has not synced).
  void hold_lists(bool hold);
  // How many list requests wait now, held.
  std::size_t held_lists() const;
  std::string resource_version() const;

  // nullptr when there is no such object.
  nlohmann::json object(const std::string& resource, const std::string& name) const;

  // The Lease "namespace/name" (nullptr when none), and what the PolicyReports are: namespace -> report.
  nlohmann::json lease(const std::string& key) const;
  void set_lease(const std::string& key, nlohmann::json lease);
  std::map<std::string, nlohmann::json> policy_reports() const;
  // Applies and deletes of PolicyReports answered 2xx, by namespace.
  std::map<std::string, unsigned> report_writes() const;
  // The resource.k8s.io versions served, newest first: GET /apis/resource.k8s.io answers an APIGroup
  // listing them (404 while there are none), and claims are listed and watched at each.
  void serve_claims(std::vector<std::string> versions);
  // Whether the wgpolicyk8s.io/v1alpha2 API is served (its CRD installed); true at first.
  void serve_policy_reports(bool served);
  // A single object at its path ("/apis/apps/v1/namespaces/n/deployments/d"): GET answers it, and a JSON
  // Patch (application/json-patch+json) changes it as the API server applies one (422 when an op fails, a
  // failed test included). at() is nullptr when there is none.
  void put_at(const std::string& path, nlohmann::json object);
  nlohmann::json at(const std::string& path) const;
  // A path that takes POSTs (Events, say): each is answered 201 with its body and kept, in order.
  void collect_posts(const std::string& path);
  std::vector<nlohmann::json> posts(const std::string& path) const;
  // How a path's POSTs are answered instead (a dry-run create as admission mutated or refused it, say):
  // the status, the body, and Warning headers, as the API server sends admission's warnings. Kept as
  // collect_posts keeps them.
  struct PostAnswer {
    unsigned status = 201;
    nlohmann::json body;
    std::vector<std::string> warnings;
  };
  void answer_posts(const std::string& path, std::function<PostAnswer(const nlohmann::json&)> answer);

  struct Request {
    std::string path, query, authorization;
    unsigned status = 0;
    std::string method, content_type, body;
  };
  std::vector<Request> requests() const;
  // Requests for `resource` (in any group and version) that were lists (watch=false) or watches, answered
  // with `status` (0: any).
  std::size_t count(const std::string& resource, bool watch, unsigned status = 0) const;

 private:
  struct Event {
    std::uint64_t version;
    std::string resource, type;
    nlohmann::json object;
  };
  struct Connection;
  void accept_loop();
  void serve(std::shared_ptr<Connection> connection);
  void answer_list(Connection& connection, const std::string& resource, Request seen);
  void answer_watch(Connection& connection, const std::string& resource, Request seen);
  std::pair<unsigned, nlohmann::json> patch_node_status(const Request& seen);
  // found, status, body, Warning headers
  std::tuple<bool, unsigned, nlohmann::json, std::vector<std::string>> answer_by_path(const Request& seen);
  std::pair<unsigned, nlohmann::json> answer_lease(const Request& seen);
  std::pair<unsigned, nlohmann::json> answer_policy_reports(const Request& seen);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuguard::test

#include "fake_apiserver.hpp"

#include <sys/socket.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <chrono>

#include "server_process.hpp"

namespace gpuguard::test {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using nlohmann::json;

namespace {

std::string percent_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      out.push_back(static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::map<std::string, std::string> parse_query(std::string_view query) {
  std::map<std::string, std::string> values;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const std::size_t eq = pair.find('=');
    values[std::string(pair.substr(0, eq))] = eq == std::string_view::npos ? "" : percent_decode(pair.substr(eq + 1));
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
  }
  return values;
}

// The name a fieldSelector of metadata.name=<name> asks for; empty for any other (not filtered).
std::string named_by(const std::map<std::string, std::string>& query) {
  const auto selector = query.find("fieldSelector");
  if (selector == query.end() || !selector->second.starts_with("metadata.name=")) return {};
  return selector->second.substr(std::string_view("metadata.name=").size());
}

json status_object(unsigned code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
          {"status", "Failure"}, {"message", message}, {"reason", reason},
          {"code", code}};
}

// Whether a watch asking only for `only` (empty: for any) gets the event.
template <typename E>
bool named(const E& event, const std::string& only) {
  return only.empty() || event.object.at("metadata").at("name") == only;
}

std::string chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

// The collection a list or watch of `path` reads: "pods", "nodes", "namespaces", "configmaps" (one
// namespace's, the enforcer's break glass; a test puts them in one namespace), the webhook's configurations
// and the backstop's bindings and policies (admissionregistration.k8s.io/v1), DRA's claims and templates at the
// versions served; empty for any other path. A labelSelector is not applied: the stores that ask for one read the label
// themselves.
std::string listed_resource(const std::string& path, const std::vector<std::string>& claim_versions) {
  if (path == "/api/v1/pods") return "pods";
  if (path == "/api/v1/nodes") return "nodes";
  if (path == "/api/v1/namespaces") return "namespaces";
  for (const char* kind :
       {"mutatingwebhookconfigurations", "validatingadmissionpolicybindings", "validatingadmissionpolicies"}) {
    if (path == std::string("/apis/admissionregistration.k8s.io/v1/") + kind) return kind;
  }
  if (path.starts_with("/api/v1/namespaces/") && path.ends_with("/configmaps")) return "configmaps";
  for (const std::string& version : claim_versions) {
    for (const char* kind : {"resourceclaims", "resourceclaimtemplates"}) {
      if (path == "/apis/resource.k8s.io/" + version + "/" + kind) return kind;
    }
  }
  return "";
}

// The APIGroup discovery answers for resource.k8s.io, the first version preferred.
json resource_group(const std::vector<std::string>& claim_versions) {
  json versions = json::array();
  for (const std::string& version : claim_versions) {
    versions.push_back({{"groupVersion", "resource.k8s.io/" + version}, {"version", version}});
  }
  return {{"kind", "APIGroup"},
          {"apiVersion", "v1"},
          {"name", "resource.k8s.io"},
          {"versions", versions},
          {"preferredVersion", versions[0]}};
}

}  // namespace

struct FakeApiserver::Connection {
  Connection(tcp::socket socket, ssl::context& context) : stream(std::move(socket), context) {}
  ssl::stream<tcp::socket> stream;
  void cut() {
    boost::system::error_code ignored;
    stream.next_layer().shutdown(tcp::socket::shutdown_both, ignored);
  }
};

struct FakeApiserver::Impl {
  asio::io_context ioc;
  ssl::context context{ssl::context::tls_server};
  tcp::acceptor acceptor{ioc};
  std::string address;
  unsigned short port = 0;

  mutable std::mutex mutex;
  std::condition_variable changed;
  std::string token;
  std::map<std::string, std::map<std::string, json>> objects;  // resource -> name -> object
  std::vector<Event> history;
  std::uint64_t version = 100;
  std::uint64_t compacted = 0;  // a watch from a version before this one is 410 Gone
  bool gone_as_status = false;
  std::uint64_t drop_epoch = 0;
  bool holding_lists = false;
  std::size_t held_lists = 0;  // list requests waiting while holding_lists
  bool stopping = false;
  std::vector<Request> requests;
  std::map<std::string, json> leases;   // "namespace/name" -> Lease
  std::map<std::string, json> reports;  // namespace -> PolicyReport
  std::map<std::string, unsigned> report_writes;
  bool reports_served = true;
  std::map<std::string, json> by_path;              // single objects, GET and JSON Patch
  std::map<std::string, std::vector<json>> posted;  // paths that take POSTs, and what was posted
  std::map<std::string, std::function<PostAnswer(const json&)>> post_answers;  // how some of those are answered
  std::vector<std::string> claim_versions;  // the resource.k8s.io versions served; none at first
  std::vector<std::weak_ptr<Connection>> connections;
  std::size_t handshakes = 0;
  std::vector<std::thread> threads;
  std::thread acceptor_thread;
};

FakeApiserver::FakeApiserver(std::string token, const std::string& address, const std::string& certs,
                             unsigned short port)
    : impl_(std::make_unique<Impl>()) {
  impl_->token = std::move(token);
  impl_->address = address;
  const std::string dir = certs.empty() ? certs_dir() : certs;
  impl_->context.use_certificate_chain_file(dir + "/tls.crt");
  impl_->context.use_private_key_file(dir + "/tls.key", ssl::context::pem);
  const tcp::endpoint endpoint(asio::ip::make_address(address), port);
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.bind(endpoint);
  impl_->acceptor.listen();
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->acceptor_thread = std::thread([this] { accept_loop(); });
}

FakeApiserver::~FakeApiserver() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
    for (auto& weak : impl_->connections) {
      if (auto connection = weak.lock()) connection->cut();
    }
  }
  impl_->changed.notify_all();
  {
    // Wake the blocking accept.
    asio::io_context ioc;
    tcp::socket poke(ioc);
    boost::system::error_code ignored;
    poke.connect(impl_->acceptor.local_endpoint(), ignored);
  }
  impl_->acceptor_thread.join();
  for (auto& thread : impl_->threads) thread.join();
}

unsigned short FakeApiserver::port() const { return impl_->port; }

std::string FakeApiserver::url() const { return "https://" + impl_->address + ":" + std::to_string(impl_->port); }

void FakeApiserver::accept_loop() {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket socket = impl_->acceptor.accept(ec);
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopping) return;
    if (ec) continue;
    auto connection = std::make_shared<Connection>(std::move(socket), impl_->context);
    impl_->connections.push_back(connection);
    impl_->threads.emplace_back([this, connection] { serve(connection); });
  }
}

void FakeApiserver::serve(std::shared_ptr<Connection> connection) {
  boost::system::error_code ec;
  connection->stream.handshake(ssl::stream_base::server, ec);
  if (ec) return;
  {
    std::lock_guard lock(impl_->mutex);
    ++impl_->handshakes;
  }
  boost::beast::flat_buffer buffer;
  for (;;) {
    http::request<http::string_body> request;
    http::read(connection->stream, buffer, request, ec);
    if (ec) return;
    const std::string target(request.target());
    const std::size_t question = target.find('?');
    Request seen{target.substr(0, question),
                 question == std::string::npos ? "" : target.substr(question + 1),
                 std::string(request[http::field::authorization]),
                 0,
                 std::string(request.method_string()),
                 std::string(request[http::field::content_type]),
                 request.body()};
    const auto query = parse_query(seen.query);
    std::string token;
    std::vector<std::string> claim_versions;
    {
      std::lock_guard lock(impl_->mutex);
      token = impl_->token;
      claim_versions = impl_->claim_versions;
    }
    const std::string resource = listed_resource(seen.path, claim_versions);
    auto reply = [&](unsigned status, const json& body, const std::vector<std::string>& warnings = {}) {
      seen.status = status;
      {
        std::lock_guard lock(impl_->mutex);
        impl_->requests.push_back(seen);
      }
      http::response<http::string_body> response{static_cast<http::status>(status), 11};
      response.set(http::field::content_type, "application/json");
      for (const std::string& warning : warnings) response.insert("Warning", "299 - \"" + warning + "\"");
      response.body() = body.dump();
      response.prepare_payload();
      http::write(connection->stream, response, ec);
    };
    if (seen.authorization != "Bearer " + token) {
      reply(401, status_object(401, "Unauthorized", "Unauthorized"));
    } else if (seen.path.starts_with("/apis/coordination.k8s.io/v1/")) {
      const auto [status, body] = answer_lease(seen);
      reply(status, body);
    } else if (seen.path == "/apis/resource.k8s.io" && !claim_versions.empty()) {
      reply(200, resource_group(claim_versions));
    } else if (const auto [found, status, body, warnings] = answer_by_path(seen); found) {
      reply(status, body, warnings);
    } else if (seen.path.starts_with("/apis/wgpolicyk8s.io/")) {
      const auto [report_status, report_body] = answer_policy_reports(seen);
      reply(report_status, report_body);
    } else if (request.method() == http::verb::patch) {
      const auto [patch_status, patch_body] = patch_node_status(seen);
      reply(patch_status, patch_body);
    } else if (resource.empty()) {
      reply(404, status_object(404, "NotFound", "the server could not find the requested resource"));
    } else if (query.count("watch") && query.at("watch") != "false" && query.at("watch") != "0") {
      answer_watch(*connection, resource, seen);
      return;  // a watch ends its connection
    } else {
      answer_list(*connection, resource, seen);
    }
    if (ec) return;
  }
}

// /apis/coordination.k8s.io/v1/namespaces/<ns>/leases[/<name>]: GET, POST, and PUT only on the
// resourceVersion last written (409 otherwise, 422 without one), as the API server's Lease strategy has it.
std::pair<unsigned, json> FakeApiserver::answer_lease(const Request& seen) {
  constexpr std::string_view kPrefix = "/apis/coordination.k8s.io/v1/namespaces/";
  const std::string rest = seen.path.substr(kPrefix.size());
  const std::size_t slash = rest.find('/');
  if (!seen.path.starts_with(kPrefix) || slash == std::string::npos || !rest.substr(slash).starts_with("/leases")) {
    return {404, status_object(404, "NotFound", "the server could not find the requested resource")};
  }
  const std::string ns = rest.substr(0, slash);
  const std::string tail = rest.substr(slash + std::string("/leases").size());
  std::lock_guard lock(impl_->mutex);
  if (seen.method == "POST" && tail.empty()) {
    json lease = json::parse(seen.body, nullptr, false);
    if (!lease.is_object()) return {400, status_object(400, "BadRequest", "not a Lease")};
    const std::string key = ns + "/" + lease["metadata"].value("name", "");
    if (impl_->leases.count(key)) return {409, status_object(409, "AlreadyExists", "leases already exists")};
    lease["metadata"]["resourceVersion"] = std::to_string(++impl_->version);
    impl_->leases[key] = lease;
    return {201, lease};
  }
  if (tail.size() < 2 || tail[0] != '/') return {405, status_object(405, "MethodNotAllowed", "not here")};
  const std::string key = ns + "/" + tail.substr(1);
  const auto it = impl_->leases.find(key);
  if (seen.method == "GET") {
    if (it == impl_->leases.end()) return {404, status_object(404, "NotFound", "leases not found")};
    return {200, it->second};
  }
  if (seen.method != "PUT") return {405, status_object(405, "MethodNotAllowed", "not here")};
  json lease = json::parse(seen.body, nullptr, false);
  if (!lease.is_object()) return {400, status_object(400, "BadRequest", "not a Lease")};
  const std::string version = lease["metadata"].value("resourceVersion", "");
  if (version.empty()) return {422, status_object(422, "Invalid", "metadata.resourceVersion must be specified")};
  if (it == impl_->leases.end()) return {404, status_object(404, "NotFound", "leases not found")};
  if (it->second["metadata"].value("resourceVersion", "") != version) {
    return {409, status_object(409, "Conflict", "the object has been modified")};
  }
  lease["metadata"]["resourceVersion"] = std::to_string(++impl_->version);
  it->second = lease;
  return {200, lease};
}

// /apis/wgpolicyk8s.io/v1alpha2: the cluster-wide list, and a namespace's report applied (server-side
// apply, which the fake takes as "replace") or deleted. 404 for all of it while the CRD is "absent".
std::pair<unsigned, json> FakeApiserver::answer_policy_reports(const Request& seen) {
  constexpr std::string_view kApi = "/apis/wgpolicyk8s.io/v1alpha2";
  std::lock_guard lock(impl_->mutex);
  if (!impl_->reports_served || !seen.path.starts_with(kApi)) {
    return {404, status_object(404, "NotFound", "the server could not find the requested resource")};
  }
  const std::string rest = seen.path.substr(kApi.size());
  if (rest == "/policyreports" && seen.method == "GET") {
    // As the API server writes it: an empty list's items are null (a nil Go slice).
    json list = {{"apiVersion", "meta.k8s.io/v1"},
                 {"kind", "PartialObjectMetadataList"},
                 {"items", nullptr},
                 {"metadata", {{"resourceVersion", std::to_string(impl_->version)}}}};
    for (const auto& [ns, report] : impl_->reports) {
      list["items"].push_back({{"metadata", report["metadata"]}});
    }
    return {200, list};
  }
  constexpr std::string_view kNamespaces = "/namespaces/";
  const std::size_t slash = rest.find('/', kNamespaces.size());
  if (!rest.starts_with(kNamespaces) || slash == std::string::npos ||
      !rest.substr(slash).starts_with("/policyreports/")) {
    return {404, status_object(404, "NotFound", "the server could not find the requested resource")};
  }
  const std::string ns = rest.substr(kNamespaces.size(), slash - kNamespaces.size());
  if (seen.method == "DELETE") {
    if (impl_->reports.erase(ns) == 0) return {404, status_object(404, "NotFound", "policyreports not found")};
    ++impl_->report_writes[ns];
    return {200, status_object(200, "Success", "deleted")};
  }
  if (seen.method != "PATCH") return {405, status_object(405, "MethodNotAllowed", "not here")};
  const auto query = parse_query(seen.query);
  if (seen.content_type != "application/apply-patch+yaml" || !query.count("fieldManager")) {
    return {400, status_object(400, "BadRequest", "an apply patch needs its content type and a fieldManager")};
  }
  json report = json::parse(seen.body, nullptr, false);
  if (!report.is_object() || report.value("kind", "") != "PolicyReport") {
    return {400, status_object(400, "BadRequest", "not a PolicyReport")};
  }
  report["metadata"]["resourceVersion"] = std::to_string(++impl_->version);
  impl_->reports[ns] = report;
  ++impl_->report_writes[ns];
  return {200, report};
}

json FakeApiserver::lease(const std::string& key) const {
  std::lock_guard lock(impl_->mutex);
  const auto it = impl_->leases.find(key);
  return it == impl_->leases.end() ? json(nullptr) : it->second;
}

void FakeApiserver::set_lease(const std::string& key, json lease) {
  std::lock_guard lock(impl_->mutex);
  lease["metadata"]["resourceVersion"] = std::to_string(++impl_->version);
  impl_->leases[key] = std::move(lease);
}

std::map<std::string, json> FakeApiserver::policy_reports() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->reports;
}

std::map<std::string, unsigned> FakeApiserver::report_writes() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->report_writes;
}

void FakeApiserver::serve_claims(std::vector<std::string> versions) {
  std::lock_guard lock(impl_->mutex);
  impl_->claim_versions = std::move(versions);
}

void FakeApiserver::serve_policy_reports(bool served) {
  std::lock_guard lock(impl_->mutex);
  impl_->reports_served = served;
}

std::tuple<bool, unsigned, json, std::vector<std::string>> FakeApiserver::answer_by_path(const Request& seen) {
  std::lock_guard lock(impl_->mutex);
  if (const auto collected = impl_->posted.find(seen.path); collected != impl_->posted.end() && seen.method == "POST") {
    const json body = json::parse(seen.body, nullptr, false);
    if (!body.is_object()) return {true, 400, status_object(400, "BadRequest", "the body is not a JSON object"), {}};
    collected->second.push_back(body);
    if (const auto answer = impl_->post_answers.find(seen.path); answer != impl_->post_answers.end()) {
      PostAnswer answered = answer->second(body);
      return {true, answered.status, std::move(answered.body), std::move(answered.warnings)};
    }
    return {true, 201, body, {}};
  }
  const auto object = impl_->by_path.find(seen.path);
  if (object == impl_->by_path.end()) return {false, 0, nullptr, {}};
  if (seen.method == "GET") return {true, 200, object->second, {}};
  if (seen.method != "PATCH") return {true, 405, status_object(405, "MethodNotAllowed", "GET and PATCH only"), {}};
  if (seen.content_type != "application/json-patch+json")
    return {
        true, 415, status_object(415, "UnsupportedMediaType", "the body of the request was in an unknown format"), {}};
  const json patch = json::parse(seen.body, nullptr, false);
  if (!patch.is_array()) return {true, 400, status_object(400, "BadRequest", "the patch is not a JSON array"), {}};
  try {
    object->second = object->second.patch(patch);
  } catch (const json::exception& e) {
    return {true, 422, status_object(422, "Invalid", e.what()), {}};
  }
  return {true, 200, object->second, {}};
}

void FakeApiserver::collect_posts(const std::string& path) {
  std::lock_guard lock(impl_->mutex);
  impl_->posted[path];
}

void FakeApiserver::answer_posts(const std::string& path, std::function<PostAnswer(const json&)> answer) {
  std::lock_guard lock(impl_->mutex);
  impl_->posted[path];
  impl_->post_answers[path] = std::move(answer);
}

std::vector<json> FakeApiserver::posts(const std::string& path) const {
  std::lock_guard lock(impl_->mutex);
  const auto collected = impl_->posted.find(path);
  return collected == impl_->posted.end() ? std::vector<json>{} : collected->second;
}

void FakeApiserver::put_at(const std::string& path, json object) {
  std::lock_guard lock(impl_->mutex);
  impl_->by_path[path] = std::move(object);
}

json FakeApiserver::at(const std::string& path) const {
  std::lock_guard lock(impl_->mutex);
  const auto object = impl_->by_path.find(path);
  return object == impl_->by_path.end() ? json(nullptr) : object->second;
}

// A strategic merge patch of /api/v1/nodes/<name>/status that sets conditions: each is merged into the
// Node's by `type`, as the API server's strategy for NodeStatus.Conditions does, or removed by its
// directive `$patch: delete`.
std::pair<unsigned, json> FakeApiserver::patch_node_status(const Request& seen) {
  constexpr std::string_view kPrefix = "/api/v1/nodes/", kSuffix = "/status";
  if (!seen.path.starts_with(kPrefix) || !seen.path.ends_with(kSuffix))
    return {405, status_object(405, "MethodNotAllowed", "only a Node's status is patched here")};
  if (seen.content_type != "application/strategic-merge-patch+json")
    return {415, status_object(415, "UnsupportedMediaType", "the body of the request was in an unknown format")};
  const json patch = json::parse(seen.body, nullptr, false);
  if (!patch.is_object()) return {400, status_object(400, "BadRequest", "the patch is not a JSON object")};
  const std::string name = seen.path.substr(kPrefix.size(), seen.path.size() - kPrefix.size() - kSuffix.size());
  json node;
  {
    std::lock_guard lock(impl_->mutex);
    auto& nodes = impl_->objects["nodes"];
    const auto it = nodes.find(name);
    if (it == nodes.end()) return {404, status_object(404, "NotFound", "nodes \"" + name + "\" not found")};
    node = it->second;
  }
  if (patch.contains("status") && patch["status"].contains("conditions")) {
    json& conditions = node["status"]["conditions"];
    if (!conditions.is_array()) conditions = json::array();
    for (const json& change : patch["status"]["conditions"]) {
      auto same_type = std::find_if(conditions.begin(), conditions.end(),
                                    [&](const json& c) { return c.value("type", "") == change.value("type", ""); });
      if (change.value("$patch", "") == "delete") {
        if (same_type != conditions.end()) conditions.erase(same_type);
      } else if (same_type == conditions.end()) {
        conditions.push_back(change);
      } else {
        same_type->update(change);
      }
    }
    put("nodes", node);
  }
  std::lock_guard lock(impl_->mutex);
  return {200, impl_->objects["nodes"][name]};
}

json FakeApiserver::object(const std::string& resource, const std::string& name) const {
  std::lock_guard lock(impl_->mutex);
  const auto collection = impl_->objects.find(resource);
  if (collection == impl_->objects.end() || !collection->second.count(name)) return nullptr;
  return collection->second.at(name);
}

void FakeApiserver::answer_list(Connection& connection, const std::string& resource, Request seen) {
  const auto query = parse_query(seen.query);
  json page;
  {
    std::unique_lock lock(impl_->mutex);
    if (impl_->holding_lists) {
      ++impl_->held_lists;
      impl_->changed.wait(lock, [&] { return !impl_->holding_lists || impl_->stopping; });
      --impl_->held_lists;
    }
    json items = json::array();
    const std::string only = named_by(query);
    for (const auto& [name, object] : impl_->objects[resource]) {
      if (only.empty() || name == only) items.push_back(object);
    }
    std::size_t offset = query.count("continue") ? std::stoul(query.at("continue")) : 0;
    const std::size_t limit = query.count("limit") ? std::stoul(query.at("limit")) : items.size();
    json metadata = {{"resourceVersion", std::to_string(impl_->version)}};
    json chosen = json::array();
    for (std::size_t i = offset; i < items.size() && i < offset + limit; ++i) chosen.push_back(items[i]);
    if (offset + limit < items.size()) metadata["continue"] = std::to_string(offset + limit);
    page = {{"kind", resource == "pods" ? "PodList" : "NodeList"},
            {"apiVersion", "v1"},
            {"metadata", metadata},
            {"items", chosen}};
    seen.status = 200;
    impl_->requests.push_back(seen);
  }
  http::response<http::string_body> response{http::status::ok, 11};
  response.set(http::field::content_type, "application/json");
  response.body() = page.dump();
  response.prepare_payload();
  boost::system::error_code ec;
  http::write(connection.stream, response, ec);
}

void FakeApiserver::answer_watch(Connection& connection, const std::string& resource, Request seen) {
  const auto query = parse_query(seen.query);
  const std::string only = named_by(query);
  const std::uint64_t from = query.count("resourceVersion") ? std::stoull(query.at("resourceVersion")) : 0;
  const auto seconds = std::min<long>(query.count("timeoutSeconds") ? std::stol(query.at("timeoutSeconds")) : 60, 600);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  boost::system::error_code ec;
  const std::string chunked_head =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::unique_lock lock(impl_->mutex);
  const bool gone = from < impl_->compacted;
  seen.status = gone && impl_->gone_as_status ? 410u : 200u;
  impl_->requests.push_back(seen);
  if (gone) {
    const json status = status_object(410, "Expired",
                                      std::string("too old resource version: ").append(std::to_string(from)) +
                                          std::string(" (").append(std::to_string(impl_->compacted)) + ")");
    const bool as_status = impl_->gone_as_status;
    lock.unlock();
    if (as_status) {
      http::response<http::string_body> response{http::status::gone, 11};
      response.set(http::field::content_type, "application/json");
      response.body() = status.dump();
      response.prepare_payload();
      http::write(connection.stream, response, ec);
    } else {
      const json event = {{"type", "ERROR"}, {"object", status}};
      asio::write(connection.stream, asio::buffer(chunked_head + chunk(event.dump() + "\n") + "0\r\n\r\n"), ec);
    }
    return;
  }
  lock.unlock();
  asio::write(connection.stream, asio::buffer(chunked_head), ec);
  lock.lock();
  const std::uint64_t epoch = impl_->drop_epoch;
  std::uint64_t sent = from;
  for (;;) {
    auto pending = [&] {
      return std::any_of(impl_->history.begin(), impl_->history.end(),
                         [&](const Event& e) { return e.version > sent && e.resource == resource && named(e, only); });
    };
    impl_->changed.wait_until(lock, deadline,
                              [&] { return impl_->stopping || impl_->drop_epoch != epoch || pending(); });
    if (impl_->stopping || impl_->drop_epoch != epoch) {
      connection.cut();  // mid-stream: no last chunk
      return;
    }
    if (!pending()) {
      lock.unlock();
      asio::write(connection.stream, asio::buffer(std::string("0\r\n\r\n")), ec);
      return;
    }
    std::string out;
    for (const Event& e : impl_->history) {
      if (e.version <= sent || e.resource != resource) continue;
      if (!named(e, only)) {
        sent = e.version;
        continue;
      }
      // One event per line, as the apiserver writes them; two share a chunk when they are ready together.
      out += json{{"type", e.type}, {"object", e.object}}.dump() + "\n";
      sent = e.version;
    }
    lock.unlock();
    asio::write(connection.stream, asio::buffer(chunk(out)), ec);
    lock.lock();
    if (ec) return;
  }
}

void FakeApiserver::put(const std::string& resource, json object, bool record) {
  {
    std::lock_guard lock(impl_->mutex);
    const std::string name = object["metadata"]["name"];
    object["metadata"]["resourceVersion"] = std::to_string(++impl_->version);
    auto& collection = impl_->objects[resource];
    const bool existed = collection.count(name) > 0;
    collection[name] = object;
    if (record) impl_->history.push_back({impl_->version, resource, existed ? "MODIFIED" : "ADDED", object});
  }
  impl_->changed.notify_all();
}

void FakeApiserver::remove(const std::string& resource, const std::string& name, bool record) {
  {
    std::lock_guard lock(impl_->mutex);
    auto& collection = impl_->objects[resource];
    const auto found = collection.find(name);
    if (found == collection.end()) return;
    json object = found->second;
    collection.erase(found);
    object["metadata"]["resourceVersion"] = std::to_string(++impl_->version);
    if (record) impl_->history.push_back({impl_->version, resource, "DELETED", object});
  }
  impl_->changed.notify_all();
}

void FakeApiserver::compact(bool as_http_status) {
  std::lock_guard lock(impl_->mutex);
  impl_->compacted = ++impl_->version;
  impl_->gone_as_status = as_http_status;
  impl_->history.clear();
}

void FakeApiserver::drop_watches() {
  {
    std::lock_guard lock(impl_->mutex);
    ++impl_->drop_epoch;
  }
  impl_->changed.notify_all();
}

void FakeApiserver::cut_connections() {
  std::lock_guard lock(impl_->mutex);
  for (auto& weak : impl_->connections) {
    if (auto connection = weak.lock()) connection->cut();
  }
}

std::size_t FakeApiserver::handshakes() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->handshakes;
}

void FakeApiserver::set_token(std::string token) {
  std::lock_guard lock(impl_->mutex);
  impl_->token = std::move(token);
}

std::size_t FakeApiserver::held_lists() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->held_lists;
}

void FakeApiserver::hold_lists(bool hold) {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->holding_lists = hold;
  }
  impl_->changed.notify_all();
}

std::string FakeApiserver::resource_version() const {
  std::lock_guard lock(impl_->mutex);
  return std::to_string(impl_->version);
}

std::vector<FakeApiserver::Request> FakeApiserver::requests() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->requests;
}

std::size_t FakeApiserver::count(const std::string& resource, bool watch, unsigned status) const {
  std::lock_guard lock(impl_->mutex);
  return std::count_if(impl_->requests.begin(), impl_->requests.end(), [&](const Request& r) {
    return (r.path == "/api/v1/" + resource || (r.path.starts_with("/apis/") && r.path.ends_with("/" + resource))) &&
           (r.query.find("watch=1") != std::string::npos) == watch && (status == 0 || r.status == status);
  });
}

}  // namespace gpuguard::test

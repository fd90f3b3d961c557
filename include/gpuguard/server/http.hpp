#pragma once
// The seam between the HTTPS transport and what it serves. Nothing here depends on Beast, so handlers are
// plain functions of a request that unit tests can call directly.
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpuguard::server {

struct RequestHead {
  std::string_view method;
  std::string_view path;   // target without the query
  std::string_view query;  // after '?', empty when none
  std::string_view content_type;
  std::optional<std::uint64_t> content_length;
  bool body = false;  // a body follows the head (a Content-Length over 0, or chunked)
};

struct Response {
  unsigned status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Close the connection once this answer is written, so that the client's next request opens a new one
  // (which a Service balances afresh): the webhook's answer to the arm hook's probe pod.
  bool close_connection = false;
};

Response text_response(unsigned status, std::string body);
Response json_response(std::string body);

// What every gpuguard server answers besides its own routes: GET /healthz (the process serves),
// GET /readyz (`ready`; a non-empty `note` follows "ok" or "not ready" on a line of its own: what works less
// than it might, or why it is not ready),
// GET /metrics (`scrape()`, in the Prometheus text format). reject_early() gives 405 for another method on
// them, 400 for a request with a body, and nullopt for every other path; respond() builds the answer.
struct ProbeRoutes {
  static bool owns(std::string_view path);
  static std::optional<Response> reject_early(const RequestHead& head);
  static Response respond(std::string_view path, bool ready, const std::function<std::string()>& scrape,
                          const std::string& note = {});
};

// What a server counts of its own for the program's /metrics: every answer by HTTP status, the handler's
// and the transport's (400 for a malformed request, 413, 431, 503 when the byte budget is spent), and the
// connections shed at the connection limit. Under failurePolicy: Fail every answer but 200 to a review is
// a refused pod, so each status is its own series. Relaxed atomic increments; the label values are fixed.
class ServerCounters {
 public:
  static constexpr std::array<unsigned, 9> kStatuses = {200, 400, 404, 405, 413, 415, 431, 500, 503};
  enum class Shed { refused, evicted };  // closed at once at the limit; an idle one closed to make room

  void count_answer(unsigned status);
  void count_shed(Shed why);
  // What clients hold now: bytes of the server's byte budget, and connections between a request's head
  // and its answer. Each is moved by the same amount both ways.
  void hold_bytes(std::int64_t delta);
  void hold_request(int delta);
  std::uint64_t answers(unsigned status) const;  // kStatuses' own; any other status counts as "other"
  std::uint64_t shed(Shed why) const;
  // gpuguard_http_responses_total{code}, gpuguard_http_connections_shed_total{reason},
  // gpuguard_http_budget_bytes_held and gpuguard_http_requests_in_flight.
  void render(std::string& out) const;

 private:
  std::array<std::atomic<std::uint64_t>, kStatuses.size() + 1> answers_{};
  std::array<std::atomic<std::uint64_t>, 2> shed_{};
  std::atomic<std::int64_t> bytes_held_{0};
  std::atomic<std::int64_t> requests_in_flight_{0};
};

// For a route that takes only POST with a JSON body: 405 or 415, or nullopt when the request may go on.
std::optional<Response> require_json_post(const RequestHead& head);

class Handler {
 public:
  virtual ~Handler() = default;
  // Called once the headers are in. A response returned here is sent without reading the body, and the
  // connection is closed afterwards unless the request had no body.
  virtual std::optional<Response> reject_early(const RequestHead& head) const = 0;
  virtual Response handle(const RequestHead& head, std::string body) const = 0;
};

// The deadline the caller set with `?timeout=` (a Go duration such as "10s" or "500ms", as the apiserver
// sends it), or nullopt when there is none or it does not parse.
std::optional<std::chrono::milliseconds> timeout_parameter(std::string_view query);

// True for application/json, with or without parameters such as "; charset=utf-8".
bool is_json_content_type(std::string_view content_type);

}  // namespace gpuguard::server

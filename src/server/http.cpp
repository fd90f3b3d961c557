#include "gpuguard/server/http.hpp"

#include <cctype>
#include <charconv>

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::server {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::size_t status_index(unsigned status) {
  for (std::size_t i = 0; i < ServerCounters::kStatuses.size(); ++i) {
    if (ServerCounters::kStatuses[i] == status) return i;
  }
  return ServerCounters::kStatuses.size();
}

Response method_not_allowed(std::string_view allowed) {
  Response response = text_response(405, "method not allowed");
  response.headers.emplace_back("Allow", std::string(allowed));
  return response;
}

}  // namespace

Response json_response(std::string body) {
  Response response;
  response.content_type = "application/json";
  response.body = std::move(body);
  return response;
}

void ServerCounters::count_answer(unsigned status) {
  answers_[status_index(status)].fetch_add(1, std::memory_order_relaxed);
}

void ServerCounters::hold_bytes(std::int64_t delta) { bytes_held_.fetch_add(delta, std::memory_order_relaxed); }

void ServerCounters::hold_request(int delta) { requests_in_flight_.fetch_add(delta, std::memory_order_relaxed); }

void ServerCounters::count_shed(Shed why) {
  shed_[static_cast<std::size_t>(why)].fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t ServerCounters::answers(unsigned status) const {
  return answers_[status_index(status)].load(std::memory_order_relaxed);
}

std::uint64_t ServerCounters::shed(Shed why) const {
  return shed_[static_cast<std::size_t>(why)].load(std::memory_order_relaxed);
}

void ServerCounters::render(std::string& out) const {
  static constexpr metrics::Family kResponses{
      "gpuguard_http_responses_total", "counter",
      "HTTP answers sent, by status code, the server's own (413, 431, 503, malformed requests) included."};
  static constexpr metrics::Family kShed{"gpuguard_http_connections_shed_total", "counter",
                                         "Connections closed at the connection limit: refused when accepted, or "
                                         "evicted while idle to make room."};
  static constexpr metrics::Family kBytesHeld{
      "gpuguard_http_budget_bytes_held", "gauge",
      "Bytes of the server's byte budget held now by request bodies and large answers."};
  static constexpr metrics::Family kInFlight{"gpuguard_http_requests_in_flight", "gauge",
                                             "Connections whose request head has been read and whose answer has "
                                             "not been written: never closed to make room."};
  metrics::header(out, kResponses);
  for (std::size_t i = 0; i <= kStatuses.size(); ++i) {
    const std::string code = i < kStatuses.size() ? std::to_string(kStatuses[i]) : std::string("other");
    metrics::sample(out, kResponses, metrics::labels({{"code", code}}), answers_[i].load(std::memory_order_relaxed));
  }
  metrics::header(out, kShed);
  metrics::sample(out, kShed, "reason=\"refused\"", shed(Shed::refused));
  metrics::sample(out, kShed, "reason=\"evicted\"", shed(Shed::evicted));
  // As they are, signed: a give without its take would show, not read as 0.
  metrics::single(out, kBytesHeld, std::to_string(bytes_held_.load(std::memory_order_relaxed)));
  metrics::single(out, kInFlight, std::to_string(requests_in_flight_.load(std::memory_order_relaxed)));
}

bool ProbeRoutes::owns(std::string_view path) { return path == "/healthz" || path == "/readyz" || path == "/metrics"; }

std::optional<Response> ProbeRoutes::reject_early(const RequestHead& head) {
  if (!owns(head.path)) return std::nullopt;
  if (head.method != "GET" && head.method != "HEAD") return method_not_allowed("GET, HEAD");
  // Answered before a byte of it is read, and the connection closed: a body the server waited for would
  // hold a connection, and room in the request budget, that no probe ever needs.
  if (head.body) return text_response(400, "probes and /metrics take no body");
  return std::nullopt;
}

Response ProbeRoutes::respond(std::string_view path, bool ready, const std::function<std::string()>& scrape,
                              const std::string& note) {
  if (path == "/healthz") return text_response(200, "ok");
  if (path == "/readyz") {
    const std::string status = ready ? "ok" : "not ready";
    return text_response(ready ? 200 : 503, note.empty() ? status : status + "\n" + note);
  }
  Response response;
  response.content_type = "text/plain; version=0.0.4; charset=utf-8";
  response.body = scrape();
  return response;
}

std::optional<Response> require_json_post(const RequestHead& head) {
  if (head.method != "POST") return method_not_allowed("POST");
  if (!is_json_content_type(head.content_type)) return text_response(415, "Content-Type must be application/json");
  return std::nullopt;
}

Response text_response(unsigned status, std::string body) {
  Response response;
  response.status = status;
  response.body = std::move(body);
  if (!response.body.empty() && response.body.back() != '\n') response.body += '\n';
  return response;
}

std::optional<std::chrono::milliseconds> timeout_parameter(std::string_view query) {
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (!pair.starts_with("timeout=")) continue;
    const std::string_view value = pair.substr(8);
    double amount = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), amount);
    if (ec != std::errc{} || amount <= 0) return std::nullopt;
    const std::string_view unit(end, value.data() + value.size() - end);
    double millis = 0;
    if (unit == "s")
      millis = amount * 1000;
    else if (unit == "ms")
      millis = amount;
    else if (unit == "m")
      millis = amount * 60'000;
    else
      return std::nullopt;
    if (millis < 1 || millis > 3'600'000) return std::nullopt;
    return std::chrono::milliseconds(static_cast<long long>(millis));
  }
  return std::nullopt;
}

bool is_json_content_type(std::string_view content_type) {
  return iequals(trim(content_type.substr(0, content_type.find(';'))), "application/json");
}

}  // namespace gpuguard::server

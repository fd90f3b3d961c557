// The status port's routes and options (include/gpuguard/server/status_routes.hpp).
#include "gpuguard/server/status_routes.hpp"

namespace gpuguard::server {

StatusRoutes::StatusRoutes(std::function<Readiness()> readiness, std::function<std::string()> scrape)
    : readiness_(std::move(readiness)), scrape_(std::move(scrape)) {}

std::optional<Response> StatusRoutes::reject_early(const RequestHead& head) const {
  if (ProbeRoutes::owns(head.path)) return ProbeRoutes::reject_early(head);
  return text_response(404, "not found");
}

Response StatusRoutes::handle(const RequestHead& head, std::string) const {
  const Readiness now = readiness_();
  return ProbeRoutes::respond(head.path, now.ready, scrape_, now.note);
}

ServerOptions status_server_options(std::string listen_address, std::chrono::milliseconds shutdown_timeout,
                                    std::size_t answer_bytes) {
  ServerOptions options;
  options.listen_address = std::move(listen_address);
  options.threads = 1;
  options.body_limit = 0;
  options.header_limit = std::size_t{8} << 10;
  options.max_connections = 64;
  options.inflight_bytes = answer_bytes;
  options.shutdown_delay = std::chrono::milliseconds{0};
  options.shutdown_timeout = shutdown_timeout;
  return options;
}

}  // namespace gpuguard::server

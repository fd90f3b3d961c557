#pragma once
// The status port of every program but the webhook and the extender, whose probes share their own port:
// /healthz, /readyz and /metrics over plain HTTP, and 404 for anything else. Written once, with the one set of
// server options such a port needs: probes and scrapes carry no body (ProbeRoutes refuses one unread), their
// heads are a few hundred bytes, and a handful of clients ask. What all clients on the pod network can hold
// there is thus 2.5 MiB at most: 64 connections' buffers of 24 KiB and 1 MiB of answers, and a connection
// that has sent nothing whole yet gives its place to the kubelet's probe (HttpServer's make_room).
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "gpuguard/server/http.hpp"
#include "gpuguard/server/http_server.hpp"

namespace gpuguard::server {

class StatusRoutes final : public Handler {
 public:
  // Whether /readyz answers 200, and what it says beside the status when not empty.
  struct Readiness {
    bool ready = false;
    std::string note;
  };
  // `readiness` and `scrape` are asked at each probe and each scrape, on the server's thread.
  StatusRoutes(std::function<Readiness()> readiness, std::function<std::string()> scrape);

  std::optional<Response> reject_early(const RequestHead& head) const override;
  Response handle(const RequestHead& head, std::string body) const override;

 private:
  std::function<Readiness()> readiness_;
  std::function<std::string()> scrape_;
};

// The options of a status port on `listen_address`: one thread, the bounds above, no drain delay (nothing
// routes traffic by these probes), and an exit at most `shutdown_timeout` after SIGTERM. `answer_bytes` is what
// the answers over 16 KiB in flight may hold together: a page larger than that is answered 503, so a program
// whose page grows with the cluster (the audit's, by namespace) gives its largest page room for two scrapes.
ServerOptions status_server_options(std::string listen_address, std::chrono::milliseconds shutdown_timeout,
                                    std::size_t answer_bytes = std::size_t{1} << 20);

}  // namespace gpuguard::server

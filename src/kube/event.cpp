// Warning Events' JSON (kube/event.hpp): one shape for every program that writes one.
#include "gpuguard/kube/event.hpp"

#include <ctime>

#include <nlohmann/json.hpp>

namespace gpuguard::kube {
namespace {

constexpr std::size_t kMaxMessage = 1024;

std::string rfc3339(long long unix_seconds) {
  const auto time = static_cast<std::time_t>(unix_seconds);
  std::tm utc{};
  gmtime_r(&time, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace

std::string warning_event_json(const WarningEvent& event) {
  nlohmann::json involved = {
      {"apiVersion", event.about.api_version}, {"kind", event.about.kind}, {"name", event.about.name}};
  if (!event.about.namespace_.empty()) involved["namespace"] = event.about.namespace_;
  if (!event.about.uid.empty()) involved["uid"] = event.about.uid;
  nlohmann::json source = {{"component", event.component}};
  if (!event.host.empty()) source["host"] = event.host;
  const std::string stamp = rfc3339(event.unix_seconds);
  return nlohmann::json{{"apiVersion", "v1"},
                        {"kind", "Event"},
                        {"metadata", {{"generateName", event.component + "."}, {"namespace", event.events_namespace}}},
                        {"involvedObject", involved},
                        {"reason", event.reason},
                        {"message", event.message.substr(0, kMaxMessage)},
                        {"type", "Warning"},
                        {"source", source},
                        {"firstTimestamp", stamp},
                        {"lastTimestamp", stamp},
                        {"count", 1}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string events_path(std::string_view events_namespace) {
  return "/api/v1/namespaces/" + std::string(events_namespace) + "/events";
}

}  // namespace gpuguard::kube

#pragma once
// A Warning Event, as `kubectl describe` shows it under its object: the node enforcer's on a Node, or on a
// pod it enforced as any pod though it looks like GPU infrastructure, the arm hook's on the webhook's
// Deployment when it leaves an install unarmed. Written once (count 1), never
// updated: each says what happened when.
#include <string>
#include <string_view>

namespace gpuguard::kube {

struct EventSubject {
  std::string api_version;  // "v1", "apps/v1"
  std::string kind;         // "Node", "Deployment"
  std::string namespace_;   // empty for a cluster-scoped object
  std::string name;
  std::string uid;  // where known: `kubectl describe` shows only the events of the object with this UID
};

struct WarningEvent {
  EventSubject about;
  std::string events_namespace;  // where the Event is made: the object's, or "default" for a Node's
  std::string reason;            // "GPUsBeyondAllocation", "GPUInfrastructureUnlisted", "NotArmed"
  std::string message;           // cut to 1 KiB
  std::string component;         // "gpuguard-node-enforcer"
  std::string host;              // the node it was seen on; may be empty
  long long unix_seconds = 0;    // its first and last time
};

// The Event's JSON, for POST /api/v1/namespaces/{events_namespace}/events.
std::string warning_event_json(const WarningEvent& event);

// That path.
std::string events_path(std::string_view events_namespace);

}  // namespace gpuguard::kube

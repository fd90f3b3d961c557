#pragma once
// Which version of an API group to read, from the API server's discovery document for the group
// (GET /apis/<group>, an APIGroup): the newest of the versions this client understands that the server
// serves. resource.k8s.io is why: v1 from Kubernetes 1.34, v1beta2 on 1.33 and v1beta1 on 1.32 where the
// admin enabled them, none before. Pure; kube::Informers does the request.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuguard::kube {

struct GroupDiscovery {
  enum class Outcome { served, not_served, unreadable };
  Outcome outcome = Outcome::unreadable;
  std::string version;  // served: the version to read
  std::string served;   // the versions the server offers, comma-separated, for logs
};

// `status` is the HTTP status of GET /apis/<group>: 404 means the group is not served at all. `known` lists
// the versions the caller can read, newest first.
GroupDiscovery choose_group_version(unsigned status, std::string_view body, const std::vector<std::string>& known);

// "/apis/<group>/{version}/<resource>" -> "<group>"; empty when the path has no such shape.
std::string group_of_versioned_path(std::string_view path);

}  // namespace gpuguard::kube

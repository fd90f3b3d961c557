#pragma once
// Deterministic AdmissionReviews of a chosen size, shaped like real pods: several containers with ~25 env
// vars each, resources, ports, mounts, probes; one container asks for a GPU. Keys keep the order the
// apiserver writes them in (Go struct order), which the decoder's single pass relies on.
#include <string>

#include <nlohmann/json.hpp>

namespace gpuguard::bench {

inline nlohmann::ordered_json container(int index, bool gpu) {
  nlohmann::ordered_json env = nlohmann::ordered_json::array();
  for (int e = 0; e < 25; ++e) {
    env.push_back({{"name", std::string("APP_SETTING_").append(std::to_string(e))},
                   {"value", std::string("value-").append(std::to_string(e * 7919))}});
  }
  nlohmann::ordered_json c = {
      {"name", std::string("container-").append(std::to_string(index))},
      {"image", std::string("registry.example.com/team/service:1.").append(std::to_string(index))},
      {"args", {"--port=8080", "--log-level=info"}},
      {"env", env},
      {"ports", {{{"name", "http"}, {"containerPort", 8080}, {"protocol", "TCP"}}}},
      {"resources", {{"requests", {{"cpu", "250m"}, {"memory", "256Mi"}}}, {"limits", {{"memory", "512Mi"}}}}},
      {"volumeMounts",
       {{{"name", "data"}, {"mountPath", "/data"}},
        {{"name", "kube-api-access"},
         {"mountPath", "/var/run/secrets/kubernetes.io/serviceaccount"},
         {"readOnly", true}}}},
      {"readinessProbe", {{"httpGet", {{"path", "/healthz"}, {"port", 8080}}}, {"periodSeconds", 5}}},
      {"terminationMessagePath", "/dev/termination-log"},
      {"imagePullPolicy", "IfNotPresent"}};
  if (gpu) c["resources"]["limits"]["nvidia.com/gpu"] = "1";
  return c;
}

// A CREATE review whose JSON is at least `bytes` long.
inline std::string review_of_size(std::size_t bytes) {
  nlohmann::ordered_json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "bench"}, {"namespace", "team-a"}, {"labels", {{"app", "bench"}}}}},
      {"spec",
       {{"containers", nlohmann::ordered_json::array()},
        {"volumes", {{{"name", "data"}, {"emptyDir", nlohmann::ordered_json::object()}}}}}}};
  nlohmann::ordered_json review = {
      {"apiVersion", "admission.k8s.io/v1"},
      {"kind", "AdmissionReview"},
      {"request",
       {{"uid", "2b752327-a529-4ffd-b2e2-478455e80a0d"},
        {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
        {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
        {"requestKind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
        {"requestResource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
        {"namespace", "team-a"},
        {"operation", "CREATE"},
        {"userInfo", {{"username", "system:serviceaccount:kube-system:replicaset-controller"}}},
        {"object", pod},
        {"oldObject", nullptr},
        {"dryRun", false},
        {"options", {{"kind", "CreateOptions"}, {"apiVersion", "meta.k8s.io/v1"}}}}}};
  auto& containers = review["request"]["object"]["spec"]["containers"];
  std::size_t size = review.dump().size();
  for (int i = 0; size < bytes; ++i) {
    nlohmann::ordered_json c = container(i, i == 1);
    size += c.dump().size() + 1;
    containers.push_back(std::move(c));
  }
  return review.dump();
}

}  // namespace gpuguard::bench

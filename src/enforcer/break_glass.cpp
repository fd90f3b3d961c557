#include "break_glass.hpp"

namespace gpuguard::enforcer {
namespace {

kube::InformerOptions informer_options() {
  kube::InformerOptions options;
  options.user_agent = "gpuguard-node-enforcer/" GPUGUARD_VERSION;
  return options;
}

}  // namespace

BreakGlass::BreakGlass(const kube::ApiServer& server, const std::string& namespace_name, const std::string& name,
                       kube::InformerObserver observer)
    : what_(namespace_name + "/" + name),
      informers_(server,
                 {{"break-glass configmap", "/api/v1/namespaces/" + namespace_name + "/configmaps",
                   "metadata.name=" + name, &store_}},
                 informer_options(), std::move(observer)) {}

}  // namespace gpuguard::enforcer

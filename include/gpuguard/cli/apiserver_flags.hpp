#pragma once
// The flags that say how a program reaches the Kubernetes API, shared by the webhook (DRA claims) and the
// scheduler extender (pods and nodes): in a pod, the service account; elsewhere --apiserver-url,
// --token-file and --ca-file.
#include <boost/program_options.hpp>

#include "gpuguard/kube/api_server.hpp"

namespace gpuguard::cli {

void add_apiserver_flags(boost::program_options::options_description& description);

// Whether an API is known: --apiserver-url, or KUBERNETES_SERVICE_HOST as a pod has it.
bool apiserver_known(const boost::program_options::variables_map& flags);

// Throws std::invalid_argument for a malformed --apiserver-url, std::runtime_error when neither a URL nor
// the in-cluster environment is there.
kube::ApiServer api_server(const boost::program_options::variables_map& flags);

}  // namespace gpuguard::cli

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

// api_server() into `out` for a program that cannot run without the API: 0, or the status to exit with
// after saying why (2 for a malformed --apiserver-url, on standard error prefixed by `program`; 1 when no
// API is known, logged as "cannot start").
int require_api_server(const std::string& program, const boost::program_options::variables_map& flags,
                       kube::ApiServer& out);

}  // namespace gpuguard::cli

#include "gpuguard/cli/apiserver_flags.hpp"

#include <cstdlib>
#include <iostream>

#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/log/log.hpp"

namespace gpuguard::cli {

namespace po = boost::program_options;

void add_apiserver_flags(po::options_description& description) {
  description.add_options()("apiserver-url", po::value<std::string>(),
                            "https://host:port of the Kubernetes API; default: in-cluster service")(
      "token-file", po::value<std::string>(),
      "bearer token file, re-read for every request (default in a pod: the service account's)")(
      "ca-file", po::value<std::string>(),
      "CA bundle that signs the apiserver's certificate (default in a pod: the service account's; else the "
      "system's)");
}

bool apiserver_known(const po::variables_map& flags) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  return flags.count("apiserver-url") > 0 || (host != nullptr && *host != '\0');
}

kube::ApiServer api_server(const po::variables_map& flags) {
  kube::ApiServer server = flags.count("apiserver-url")
                               ? kube::ApiServer::from_url(flags["apiserver-url"].as<std::string>())
                               : kube::ApiServer::in_cluster();
  if (auto token = path_flag(flags, "token-file")) server.token_file = *token;
  if (auto ca = path_flag(flags, "ca-file")) server.ca_file = *ca;
  return server;
}

int require_api_server(const std::string& program, const po::variables_map& flags, kube::ApiServer& out) {
  try {
    out = api_server(flags);
    return 0;
  } catch (const std::invalid_argument& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    log::error("cannot start", {{"reason", e.what()}});
    return 1;
  }
}

}  // namespace gpuguard::cli

#include "gpuguard/cli/server_flags.hpp"

#include <iostream>

namespace gpuguard::cli {

namespace po = boost::program_options;

namespace {

std::chrono::milliseconds seconds_flag(const po::variables_map& flags, const char* name) {
  return std::chrono::milliseconds(static_cast<long long>(flags[name].as<double>() * 1000));
}

}  // namespace

void add_server_flags(po::options_description& description) {
  description.add_options()("tls-cert-file", po::value<std::string>(),
                            "PEM certificate chain served to clients (ECDSA or RSA), re-read on change")(
      "tls-private-key-file", po::value<std::string>(), "PEM private key of that certificate")(
      "listen-address", po::value<std::string>()->default_value("0.0.0.0:8443"), "IP:port to serve HTTPS on")(
      "threads", po::value<unsigned>()->default_value(0),
      "server threads; 0 = one per CPU core (the webhook: as many as --memory-limit holds)")(
      "shutdown-delay", po::value<double>()->default_value(5),
      "seconds to keep serving after SIGTERM, with /readyz failing")(
      "shutdown-timeout", po::value<double>()->default_value(25), "seconds after SIGTERM by which the process exits");
}

bool has_tls_flags(const po::variables_map& flags) {
  return flags.count("tls-cert-file") && flags.count("tls-private-key-file");
}

std::optional<server::ServerOptions> server_options(const std::string& program, const po::variables_map& flags) {
  if (flags.count("tls-cert-file") != flags.count("tls-private-key-file")) {
    std::cerr << program << ": --tls-cert-file and --tls-private-key-file go together (see --help)\n";
    return std::nullopt;
  }
  const double delay = flags["shutdown-delay"].as<double>();
  const double timeout = flags["shutdown-timeout"].as<double>();
  if (!(delay >= 0 && delay < 3600) || !(timeout > 0 && timeout < 3600)) {
    std::cerr << program << ": --shutdown-delay must be >= 0 and --shutdown-timeout > 0 (seconds, under an hour)\n";
    return std::nullopt;
  }
  server::ServerOptions options;
  options.listen_address = flags["listen-address"].as<std::string>();
  options.threads = flags["threads"].as<unsigned>();
  options.shutdown_delay = seconds_flag(flags, "shutdown-delay");
  options.shutdown_timeout = seconds_flag(flags, "shutdown-timeout");
  return options;
}

}  // namespace gpuguard::cli

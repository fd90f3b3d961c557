#pragma once
// The serving flags the webhook and the scheduler extender share: where to listen, the TLS pair, threads
// and the SIGTERM drain.
#include <optional>
#include <string>

#include <boost/program_options.hpp>

#include "gpuguard/server/http_server.hpp"

namespace gpuguard::cli {

void add_server_flags(boost::program_options::options_description& description);

// The ServerOptions the flags ask for, or nullopt after printing why they cannot be used (exit status 2).
// Both TLS flags or neither; whether TLS is required is up to the binary (has_tls_flags).
std::optional<server::ServerOptions> server_options(const std::string& program,
                                                    const boost::program_options::variables_map& flags);

bool has_tls_flags(const boost::program_options::variables_map& flags);

}  // namespace gpuguard::cli

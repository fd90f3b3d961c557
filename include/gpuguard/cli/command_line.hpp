#pragma once
#include <csignal>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

namespace gpuguard::cli {

// Parses argv for one of gpuguard's binaries. Adds and handles the options every binary has the same
// way: --help and --version print and stop (status 0), --log-level sets the log level, and a bad flag
// is reported with `program` as the prefix (status 2). Returns the flags to go on with, or the status to
// exit with.
struct Parsed {
  std::optional<boost::program_options::variables_map> flags;
  int exit_status = 0;
};
Parsed parse_command_line(const std::string& program, const std::string& version,
                          boost::program_options::options_description& description, int argc, char** argv);

// Parses the arguments after a subcommand's name (`program` is "<binary> <subcommand>"), whose description
// holds its own --help: --help prints it and stops (status 0), a bad flag is reported with `program` as
// the prefix (status 2). Returns the flags to go on with, or the status to exit with.
Parsed parse_subcommand(const std::string& program, const boost::program_options::options_description& description,
                        const std::vector<std::string>& args);

// The value of a path flag, or nullopt when it was not given.
std::optional<std::filesystem::path> path_flag(const boost::program_options::variables_map& flags, const char* name);

// Runs a server's whole life (`serve` returns once it has drained). Returns the exit status: 0 after
// logging "stopped", or 1 after logging "cannot start" with the reason when `serve` throws.
int run_service(const std::function<void()>& serve);

// SIGTERM and SIGINT: the signals on which every gpuguard program stops in order.
sigset_t stop_signals();

}  // namespace gpuguard::cli

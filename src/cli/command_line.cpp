#include "gpuguard/cli/command_line.hpp"

#include <iostream>

#include "gpuguard/log/log.hpp"

namespace gpuguard::cli {

namespace po = boost::program_options;

namespace {

// Stores the options `parse` returns: a bad flag is reported (exit status 2) and --help answered (0) here,
// so that a program's own flags and its subcommands' read alike.
template <typename Parse>
Parsed store_flags(const std::string& program, const po::options_description& description, Parse&& parse) {
  po::variables_map flags;
  try {
    po::store(parse(), flags);
    po::notify(flags);
  } catch (const po::error& e) {
    std::cerr << program << ": " << e.what() << " (see --help)\n";
    return {std::nullopt, 2};
  }
  if (flags.count("help")) {
    std::cout << description << "\n";
    return {std::nullopt, 0};
  }
  return {std::move(flags), 0};
}

}  // namespace

Parsed parse_command_line(const std::string& program, const std::string& version, po::options_description& description,
                          int argc, char** argv) {
  description.add_options()("log-level", po::value<std::string>()->default_value("info"), "debug, info, warn or error")(
      "help,h", "print this help and exit")("version", "print the version and exit");
  Parsed parsed = store_flags(program, description, [&] { return po::parse_command_line(argc, argv, description); });
  if (!parsed.flags) return parsed;
  const po::variables_map& flags = *parsed.flags;
  if (flags.count("version")) {
    std::cout << program << " " << version << "\n";
    return {std::nullopt, 0};
  }
  const auto level = log::parse_level(flags["log-level"].as<std::string>());
  if (!level) {
    std::cerr << program << ": --log-level must be debug, info, warn or error\n";
    return {std::nullopt, 2};
  }
  log::set_level(*level);
  return parsed;
}

Parsed parse_subcommand(const std::string& program, const po::options_description& description,
                        const std::vector<std::string>& args) {
  return store_flags(program, description, [&] { return po::command_line_parser(args).options(description).run(); });
}

std::optional<std::filesystem::path> path_flag(const po::variables_map& flags, const char* name) {
  if (!flags.count(name)) return std::nullopt;
  return std::filesystem::path(flags[name].as<std::string>());
}

int run_service(const std::function<void()>& serve) {
  try {
    serve();
  } catch (const std::exception& e) {
    log::error("cannot start", {{"reason", e.what()}});
    return 1;
  }
  log::info("stopped");
  return 0;
}

sigset_t stop_signals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  return stop;
}

StopSignalsHeld::StopSignalsHeld() : stop_(stop_signals()) { ::pthread_sigmask(SIG_BLOCK, &stop_, nullptr); }

StopSignalsHeld::Released StopSignalsHeld::release() const { return Released(stop_); }

StopSignalsHeld::Released::Released(const sigset_t& stop) : stop_(stop) {
  ::pthread_sigmask(SIG_UNBLOCK, &stop_, nullptr);
}

StopSignalsHeld::Released::~Released() { ::pthread_sigmask(SIG_BLOCK, &stop_, nullptr); }

}  // namespace gpuguard::cli

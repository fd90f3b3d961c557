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

// SIGTERM and SIGINT held pending in the calling thread, and in every thread it starts, except while the
// object release() returns lives, which unblocks them in the calling thread alone. Every program that serves
// until a signal (the webhook, the scheduler extender, the audit controller, the node enforcer, the device
// plugin) makes one first, before any thread exists, and releases it just before its server's loop runs on
// that thread (whose connection loops start blocked too): a stop during start-up waits for it and ends in the
// orderly stop, and the kernel gives the signal to no thread but the one that waits for it. (Given to one of
// gRPC's threads, asleep in a library ThreadSanitizer does not instrument, it waited there unseen, and the
// stop never came.) Held before the release and after it, as when start-up throws or the server's run()
// does: a pending stop must not kill the process by its default action before it says why it cannot start.
class StopSignalsHeld {
 public:
  // The signals unblocked in the thread that made it, and blocked again when it goes.
  class Released {
   public:
    explicit Released(const sigset_t& stop);
    ~Released();
    Released(const Released&) = delete;
    Released& operator=(const Released&) = delete;

   private:
    sigset_t stop_;
  };

  StopSignalsHeld();
  StopSignalsHeld(const StopSignalsHeld&) = delete;
  StopSignalsHeld& operator=(const StopSignalsHeld&) = delete;
  ~StopSignalsHeld() = default;
  // While the result lives a pending signal is delivered, to the handler in place by then (the server's).
  // Keep it after the server, so that it goes first: a stop that comes once run() has returned or thrown,
  // when the server and its handler are about to go, waits pending while the program says why and exits.
  [[nodiscard]] Released release() const;

 private:
  sigset_t stop_;
};

}  // namespace gpuguard::cli

#pragma once
// The state machine of one list-and-watch, as client-go's reflector has it: list, then watch from the
// list's resourceVersion; after a watch ends, watch again from the last version seen; after 410 Gone,
// list again; after a failure, back off with jitter, doubling up to a limit. Pure: the driver
// (kube::Informers) does the I/O, says how each step ended and how long a watch lasted, and waits as
// told, so tests drive it with made-up outcomes and no clock.
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace gpuguard::kube {

// How a watch stream ended: the apiserver closed it (resume from the last version), 410 Gone (that
// version is compacted away: list again), or it broke or was refused (resume after a backoff).
enum class WatchEnd { closed, gone, failed };

// What each step came to, for metrics: gpuguard_kube_informer_outcomes_total{outcome=...}.
enum class ReflectorOutcome { list_success, list_failure, watch_closed, watch_gone, watch_error };
inline constexpr std::string_view kReflectorOutcomes[] = {"list_success", "list_failure", "watch_closed", "watch_gone",
                                                          "watch_error"};

struct ReflectorOptions {
  std::chrono::milliseconds backoff_initial{500};
  std::chrono::milliseconds backoff_max{30'000};
  // Each watch asks the apiserver to end it after a random time in this range, as client-go does, so
  // that the watches of many clients do not all restart together.
  std::chrono::seconds watch_timeout_min{300};
  std::chrono::seconds watch_timeout_max{600};
  // A watch that the apiserver closes sooner than this counts as failing: resuming at once, again and
  // again, would be a busy loop.
  std::chrono::milliseconds shortest_healthy_watch{1'000};
};

class Reflector {
 public:
  struct Step {
    enum class Kind { list, watch, wait };
    Kind kind = Kind::list;
    std::string version;                   // watch: resume from this resourceVersion
    std::chrono::milliseconds duration{};  // watch: the timeout to ask for; wait: how long
  };

  // `random` returns a number in [0, 1): the jitter of backoffs and watch timeouts.
  Reflector(ReflectorOptions options, std::function<double()> random);

  const Step& next() const { return step_; }
  // The list ended with this resourceVersion, or failed (nullopt).
  ReflectorOutcome listed(std::optional<std::string> version);
  // The watch ended; `last_version` is the newest resourceVersion it delivered (or the one it started from).
  ReflectorOutcome watched(WatchEnd end, std::string last_version, std::chrono::milliseconds lasted);
  // The wait is over.
  void waited();
  // Listed at least once; stays true through later re-lists and outages.
  bool synced() const { return synced_; }

 private:
  Step watch_from(std::string version);
  Step wait_then(Step after);

  ReflectorOptions options_;
  std::function<double()> random_;
  std::chrono::milliseconds backoff_;
  Step step_;
  std::optional<Step> after_wait_;
  bool synced_ = false;
};

}  // namespace gpuguard::kube

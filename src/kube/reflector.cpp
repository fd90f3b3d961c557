#include "gpuguard/kube/reflector.hpp"

#include <algorithm>

namespace gpuguard::kube {

Reflector::Reflector(ReflectorOptions options, std::function<double()> random)
    : options_(options), random_(std::move(random)), backoff_(options_.backoff_initial) {}

Reflector::Step Reflector::watch_from(std::string version) {
  const auto span = options_.watch_timeout_max - options_.watch_timeout_min;
  const auto timeout = options_.watch_timeout_min +
                       std::chrono::seconds(static_cast<long long>(random_() * static_cast<double>(span.count() + 1)));
  return {Step::Kind::watch, std::move(version), std::chrono::duration_cast<std::chrono::milliseconds>(timeout)};
}

// Full jitter over the upper half of the backoff, so that many clients do not retry in step; the next
// backoff doubles, up to the maximum.
Reflector::Step Reflector::wait_then(Step after) {
  const double half = static_cast<double>(backoff_.count()) / 2;
  const auto wait = std::chrono::milliseconds(static_cast<long long>(half + random_() * half));
  backoff_ = std::min(backoff_ * 2, options_.backoff_max);
  after_wait_ = std::move(after);
  return {Step::Kind::wait, {}, wait};
}

ReflectorOutcome Reflector::listed(std::optional<std::string> version) {
  if (!version) {
    step_ = wait_then({Step::Kind::list, {}, {}});
    return ReflectorOutcome::list_failure;
  }
  synced_ = true;
  backoff_ = options_.backoff_initial;
  step_ = watch_from(std::move(*version));
  return ReflectorOutcome::list_success;
}

ReflectorOutcome Reflector::watched(WatchEnd end, std::string last_version, std::chrono::milliseconds lasted) {
  if (end == WatchEnd::gone) {
    step_ = {Step::Kind::list, {}, {}};
    return ReflectorOutcome::watch_gone;
  }
  if (end == WatchEnd::closed && lasted >= options_.shortest_healthy_watch) {
    backoff_ = options_.backoff_initial;
    step_ = watch_from(std::move(last_version));
    return ReflectorOutcome::watch_closed;
  }
  step_ = wait_then(watch_from(std::move(last_version)));
  return end == WatchEnd::closed ? ReflectorOutcome::watch_closed : ReflectorOutcome::watch_error;
}

void Reflector::waited() {
  if (step_.kind != Step::Kind::wait || !after_wait_) return;
  step_ = std::move(*after_wait_);
  after_wait_.reset();
}

}  // namespace gpuguard::kube

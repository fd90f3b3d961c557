// The reflector's state machine, driven with made-up outcomes: what the extender's list-and-watch does
// after each list and watch, without an apiserver, TLS or a clock.
#include <catch2/catch.hpp>

#include "gpuguard/kube/reflector.hpp"

using namespace gpuguard::kube;
using namespace std::chrono_literals;
using Kind = Reflector::Step::Kind;

namespace {

ReflectorOptions options() {
  ReflectorOptions o;
  o.backoff_initial = 500ms;
  o.backoff_max = 4'000ms;
  o.watch_timeout_min = 300s;
  o.watch_timeout_max = 600s;
  return o;
}

// A reflector whose jitter is whatever the test sets, 0 (the shortest) by default.
struct Fixture {
  double jitter = 0;
  Reflector reflector{options(), [this] { return jitter; }};
  const Reflector::Step& step() const { return reflector.next(); }
};

}  // namespace

TEST_CASE("reflector: list, then watch from the list's version, and resume from the last version seen") {
  Fixture f;
  CHECK(f.step().kind == Kind::list);
  CHECK_FALSE(f.reflector.synced());
  CHECK(f.reflector.listed("100") == ReflectorOutcome::list_success);
  CHECK(f.reflector.synced());
  REQUIRE(f.step().kind == Kind::watch);
  CHECK(f.step().version == "100");
  // The apiserver ended a healthy watch: resume at once from the newest version it delivered.
  CHECK(f.reflector.watched(WatchEnd::closed, "180", 300s) == ReflectorOutcome::watch_closed);
  REQUIRE(f.step().kind == Kind::watch);
  CHECK(f.step().version == "180");
}

TEST_CASE("reflector: 410 Gone lists again at once, and the cache stays synced through it") {
  Fixture f;
  f.reflector.listed("100");
  CHECK(f.reflector.watched(WatchEnd::gone, "150", 2s) == ReflectorOutcome::watch_gone);
  CHECK(f.step().kind == Kind::list);
  CHECK(f.reflector.synced());
  f.reflector.listed("900");
  CHECK(f.step().version == "900");
}

TEST_CASE("reflector: failures back off with jitter, doubling up to the maximum, and success resets it") {
  Fixture f;
  // Lists that fail: wait, then list again; waits of [b/2, b] for b = 500, 1000, 2000, 4000, 4000 ms.
  const std::chrono::milliseconds expected_shortest[] = {250ms, 500ms, 1000ms, 2000ms, 2000ms};
  for (const auto shortest : expected_shortest) {
    CHECK(f.reflector.listed(std::nullopt) == ReflectorOutcome::list_failure);
    REQUIRE(f.step().kind == Kind::wait);
    CHECK(f.step().duration == shortest);
    f.reflector.waited();
    CHECK(f.step().kind == Kind::list);
  }
  CHECK_FALSE(f.reflector.synced());

  f.jitter = 0.999;  // the longest wait of the upper half
  f.reflector.listed(std::nullopt);
  CHECK(f.step().duration == 3998ms);
  f.reflector.waited();

  // A success resets the backoff: the next failure waits from the initial backoff again.
  f.jitter = 0;
  f.reflector.listed("7");
  CHECK(f.reflector.watched(WatchEnd::failed, "9", 10s) == ReflectorOutcome::watch_error);
  REQUIRE(f.step().kind == Kind::wait);
  CHECK(f.step().duration == 250ms);
  f.reflector.waited();
  REQUIRE(f.step().kind == Kind::watch);
  CHECK(f.step().version == "9");  // a broken watch resumes from where it was, not from a new list
}

TEST_CASE("reflector: a watch the apiserver closes at once backs off instead of spinning") {
  Fixture f;
  f.reflector.listed("1");
  CHECK(f.reflector.watched(WatchEnd::closed, "1", 10ms) == ReflectorOutcome::watch_closed);
  CHECK(f.step().kind == Kind::wait);
  f.reflector.waited();
  CHECK(f.reflector.watched(WatchEnd::closed, "1", 10ms) == ReflectorOutcome::watch_closed);
  CHECK(f.step().duration == 500ms);  // doubled
  f.reflector.waited();
  f.reflector.watched(WatchEnd::closed, "2", 5s);  // a healthy one resets the backoff
  f.reflector.watched(WatchEnd::closed, "2", 10ms);
  CHECK(f.step().duration == 250ms);
}

TEST_CASE("reflector: each watch asks for a timeout within the configured range") {
  Fixture f;
  f.reflector.listed("1");
  CHECK(f.step().duration == 300s);
  f.jitter = 0.999;
  f.reflector.watched(WatchEnd::closed, "1", 300s);
  CHECK(f.step().duration == 600s);
  f.jitter = 0.5;
  f.reflector.watched(WatchEnd::closed, "1", 300s);
  CHECK(f.step().duration == 450s);
}

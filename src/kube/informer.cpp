#include "gpuguard/kube/informer.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "api_client.hpp"
#include "gpuguard/log/log.hpp"

namespace gpuguard::kube {

namespace asio = boost::asio;

struct Informers::Impl {
  Impl(ApiServer server, std::vector<WatchedResource> r, InformerOptions o, InformerObserver ob)
      : resources(std::move(r)),
        options(std::move(o)),
        observer(std::move(ob)),
        client(ioc, std::move(server), options) {}

  std::vector<WatchedResource> resources;
  InformerOptions options;
  InformerObserver observer;
  asio::io_context ioc;
  ApiClient client;
  std::atomic<std::size_t> listed{0};             // resources in `synced_once`
  std::set<const WatchedResource*> synced_once;   // touched only by the loop's thread
  std::set<const WatchedResource*> started_runs;  // by discover(); the same
  std::mt19937 random{std::random_device{}()};
  std::thread thread;
  mutable std::mutex discovery_mutex;
  std::map<std::string, GroupDiscovery, std::less<>> discoveries;  // group -> what its discovery found

  // Asks the group's discovery document until it answers, then lists and watches the group's resources
  // at the version it chose; while none is served, each store holds an empty list and it asks again.
  asio::awaitable<void> discover(std::string group, std::vector<WatchedResource*> members,
                                 std::chrono::milliseconds pause) {
    co_await pause_for(pause);
    const std::vector<std::string>& known = members.front()->versions;
    std::chrono::milliseconds backoff = options.reflector.backoff_initial;
    std::string last_error;
    std::optional<std::string> unserved_offering;  // what the server offered while it served none we read
    GroupDiscovery found;
    for (;;) {
      Request request;
      request.method = "GET";
      request.path = "/apis/" + group;
      request.user_agent = options.user_agent;
      const Reply reply = co_await client.send(request, options.connect_timeout);
      found = choose_group_version(reply.status, reply.body, known);
      if (found.outcome == GroupDiscovery::Outcome::served) break;
      if (found.outcome == GroupDiscovery::Outcome::not_served) {
        if (found.served != unserved_offering) {
          publish(group, found);
          if (!unserved_offering) {
            for (WatchedResource* resource : members) {
              resource->store->list_begin();
              resource->store->list_end(true);
              mark_synced(*resource);
            }
          }
          unserved_offering = found.served;
        }
        last_error.clear();
        backoff = options.reflector.backoff_initial;
        asio::steady_timer timer(ioc, options.rediscover_interval);
        co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
        continue;
      }
      const std::string error = reply.error.empty() ? "the answer is not an APIGroup" : reply.error;
      if (error != last_error) {
        log::warn("cannot read an API group's versions; retrying", {{"group", group}, {"reason", error}});
      }
      last_error = error;
      asio::steady_timer timer(ioc, backoff);
      co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
      backoff = std::min(backoff * 2, options.reflector.backoff_max);
    }
    publish(group, found);
    for (WatchedResource* resource : members) {
      // Each path is replaced once: a discovery started again after a failure finds it done.
      const std::size_t at = resource->path.find("{version}");
      if (at != std::string::npos) resource->path.replace(at, std::string_view("{version}").size(), found.version);
    }
    // Once each: a discovery started again after a failure here does not start a second.
    for (WatchedResource* resource : members) {
      if (started_runs.insert(resource).second) spawn_run(*resource, {});
    }
  }

  void mark_synced(const WatchedResource& resource) {
    if (synced_once.insert(&resource).second) ++listed;
  }

  static std::string failure_text(const std::exception_ptr& failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "an exception that is not a std::exception";
    }
  }

  // The pause before a failed coroutine starts again: options.restart_after, doubled while failures come
  // within options.restart_max of the last start (`last` was its pause, `ran` its time since), up to it.
  std::chrono::milliseconds next_pause(std::chrono::milliseconds last, std::chrono::steady_clock::duration ran) const {
    if (last.count() <= 0 || ran > last + options.restart_max) return options.restart_after;
    return std::min(last * 2, options.restart_max);
  }

  // Each coroutine is started with a completion that starts it again after a pause when it ended by an
  // exception: one resource's failure never ends the loop, and so every other watch with it.
  void spawn_run(WatchedResource& resource, std::chrono::milliseconds pause) {
    const auto started = std::chrono::steady_clock::now();
    asio::co_spawn(ioc, run(resource, pause), [this, &resource, pause, started](const std::exception_ptr& failure) {
      if (!failure) return;
      const std::chrono::milliseconds next = next_pause(pause, std::chrono::steady_clock::now() - started);
      log::error("a list and watch of the Kubernetes API failed; it starts again, listing first",
                 {{"resource", resource.name}, {"reason", failure_text(failure)}, {"after_ms", next.count()}});
      spawn_run(resource, next);
    });
  }

  void spawn_discover(const std::string& group, const std::vector<WatchedResource*>& members,
                      std::chrono::milliseconds pause) {
    const auto started = std::chrono::steady_clock::now();
    asio::co_spawn(ioc, discover(group, members, pause),
                   [this, group, members, pause, started](const std::exception_ptr& failure) {
                     if (!failure) return;
                     const std::chrono::milliseconds next =
                         next_pause(pause, std::chrono::steady_clock::now() - started);
                     log::error("reading an API group's versions failed; it starts again",
                                {{"group", group}, {"reason", failure_text(failure)}, {"after_ms", next.count()}});
                     spawn_discover(group, members, next);
                   });
  }

  asio::awaitable<void> pause_for(std::chrono::milliseconds pause) {
    if (pause.count() <= 0) co_return;
    asio::steady_timer timer(ioc, pause);
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  }

  void publish(const std::string& group, const GroupDiscovery& found) {
    {
      const std::lock_guard lock(discovery_mutex);
      discoveries[group] = found;
    }
    if (options.on_discovery) options.on_discovery(group, found);
  }

  // Does what the resource's reflector says, for as long as the io_context runs.
  asio::awaitable<void> run(WatchedResource& resource, std::chrono::milliseconds pause) {
    co_await pause_for(pause);
    Reflector reflector(options.reflector, [this] { return std::uniform_real_distribution<double>(0, 1)(random); });
    for (;;) {
      const Reflector::Step step = reflector.next();
      switch (step.kind) {
        case Reflector::Step::Kind::list: {
          const ReflectorOutcome outcome = reflector.listed(co_await client.list(resource));
          if (observer) observer(resource.name, outcome);
          if (reflector.synced()) mark_synced(resource);
          break;
        }
        case Reflector::Step::Kind::watch: {
          std::string version = step.version;
          const auto started = std::chrono::steady_clock::now();
          const WatchEnd end = co_await client.watch(resource, version, step.duration);
          const auto lasted =
              std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
          if (end == WatchEnd::gone) {
            log::info("watch resource version expired; listing again",
                      {{"resource", resource.name}, {"resource_version", version}});
          }
          const ReflectorOutcome outcome = reflector.watched(end, std::move(version), lasted);
          if (observer) observer(resource.name, outcome);
          break;
        }
        case Reflector::Step::Kind::wait: {
          asio::steady_timer timer(ioc, step.duration);
          co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
          reflector.waited();
          break;
        }
      }
    }
  }
};

Informers::Informers(ApiServer server, std::vector<WatchedResource> resources, InformerOptions options,
                     InformerObserver observer)
    : impl_(std::make_unique<Impl>(std::move(server), std::move(resources), std::move(options), std::move(observer))) {}

Informers::~Informers() {
  impl_->ioc.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void Informers::start() {
  std::map<std::string, std::vector<WatchedResource*>> groups;
  for (auto& resource : impl_->resources) {
    if (resource.versions.empty()) {
      impl_->spawn_run(resource, {});
      continue;
    }
    const std::string group = group_of_versioned_path(resource.path);
    if (group.empty()) {
      throw std::invalid_argument("a versioned resource's path has no /apis/<group>/{version}/: " + resource.path);
    }
    groups[group].push_back(&resource);
  }
  for (auto& [group, members] : groups) impl_->spawn_discover(group, members, {});
  impl_->thread = std::thread([this] {
    try {
      impl_->ioc.run();
    } catch (const std::exception& e) {
      // A coroutine's exception ends in its completion (spawn_run, spawn_discover); only a completion's own
      // (memory to start one again) comes here, and then nothing is watched any more.
      log::error("Kubernetes API watch loop failed", {{"reason", e.what()}});
    }
  });
}

bool Informers::synced() const { return impl_->listed.load() == impl_->resources.size(); }

GroupDiscovery Informers::discovered(const std::string& group) const {
  const std::lock_guard lock(impl_->discovery_mutex);
  const auto found = impl_->discoveries.find(group);
  return found == impl_->discoveries.end() ? GroupDiscovery{} : found->second;
}

}  // namespace gpuguard::kube

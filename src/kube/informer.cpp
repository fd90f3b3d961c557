#include "gpuguard/kube/informer.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <random>
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
  std::atomic<std::size_t> listed{0};
  std::mt19937 random{std::random_device{}()};
  std::thread thread;

  // Does what the resource's reflector says, for as long as the io_context runs.
  asio::awaitable<void> run(WatchedResource& resource) {
    Reflector reflector(options.reflector, [this] { return std::uniform_real_distribution<double>(0, 1)(random); });
    bool counted = false;
    for (;;) {
      const Reflector::Step step = reflector.next();
      switch (step.kind) {
        case Reflector::Step::Kind::list: {
          const ReflectorOutcome outcome = reflector.listed(co_await client.list(resource));
          if (observer) observer(resource.name, outcome);
          if (reflector.synced() && !counted) {
            counted = true;
            ++listed;
          }
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
  for (auto& resource : impl_->resources) asio::co_spawn(impl_->ioc, impl_->run(resource), asio::detached);
  impl_->thread = std::thread([this] {
    try {
      impl_->ioc.run();
    } catch (const std::exception& e) {
      // A handler threw (the JSON given to it is checked, so this is a bug): nothing is watched any more.
      log::error("Kubernetes API watch loop failed", {{"reason", e.what()}});
    }
  });
}

bool Informers::synced() const { return impl_->listed.load() == impl_->resources.size(); }

}  // namespace gpuguard::kube

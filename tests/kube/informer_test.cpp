// kube::Informers against the fake API server over real TLS: a resource whose store fails (a bug, or memory
// the process cannot get, thrown from inside the loop) is listed and watched again after a pause that
// doubles while it keeps failing, and the other resources' watches never stop meanwhile.
#include <catch2/catch.hpp>

#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "eventually.hpp"
#include "fake_apiserver.hpp"
#include "fake_apiserver_client.hpp"
#include "gpuguard/kube/informer.hpp"

using namespace gpuguard;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Object names as the informer gives them; the first `failures` list items throw instead.
class NamesStore : public kube::Store {
 public:
  explicit NamesStore(int failures = 0) : failures_left_(failures) {}
  void list_begin() override { aside_.clear(); }
  void list_item(std::string_view object) override {
    {
      const std::lock_guard lock(mutex_);
      if (failures_left_ > 0) {
        --failures_left_;
        throw std::runtime_error("the store's own failure");
      }
    }
    aside_.insert(name_of(object));
  }
  void list_end(bool complete) override {
    const std::lock_guard lock(mutex_);
    if (complete) names_ = aside_;
  }
  void apply(std::string_view type, std::string_view object) override {
    const std::lock_guard lock(mutex_);
    if (type == "DELETED") {
      names_.erase(name_of(object));
    } else {
      names_.insert(name_of(object));
    }
  }
  std::set<std::string> names() const {
    const std::lock_guard lock(mutex_);
    return names_;
  }

 private:
  static std::string name_of(std::string_view object) {
    return json::parse(object)["metadata"]["name"].get<std::string>();
  }
  mutable std::mutex mutex_;
  int failures_left_;
  std::set<std::string> aside_, names_;
};

json object(const std::string& name) {
  return {{"apiVersion", "v1"}, {"metadata", {{"name", name}, {"namespace", "default"}, {"uid", "uid-" + name}}}};
}

}  // namespace

TEST_CASE("informers: a store that throws is listed and watched again, and the other watches go on") {
  test::FakeApiserver apiserver("informer-token");
  const test::FakeApiserverClient client(apiserver, "informer-token");
  apiserver.put("pods", object("p1"));
  apiserver.put("nodes", object("n1"));
  NamesStore pods(2), nodes;  // the pods' first two lists fail
  kube::InformerOptions options;
  options.restart_after = 100ms;
  kube::Informers informers(client.server(),
                            {{"pods", "/api/v1/pods", "", &pods}, {"nodes", "/api/v1/nodes", "", &nodes}}, options);
  const auto started = std::chrono::steady_clock::now();
  informers.start();
  REQUIRE(test::eventually([&] { return nodes.names() == std::set<std::string>{"n1"}; }));
  REQUIRE(test::eventually([&] { return pods.names() == std::set<std::string>{"p1"}; }));
  // After 100 ms, then 200: the pause doubles while the failures come at once.
  CHECK(std::chrono::steady_clock::now() - started >= 300ms);
  CHECK(test::eventually([&] { return informers.synced(); }));
  // Both watched after it: the store that failed, and the one beside it.
  apiserver.put("pods", object("p2"));
  apiserver.put("nodes", object("n2"));
  CHECK(test::eventually([&] { return pods.names() == std::set<std::string>{"p1", "p2"}; }));
  CHECK(test::eventually([&] { return nodes.names() == std::set<std::string>{"n1", "n2"}; }));
  CHECK(apiserver.count("pods", false) == 3);  // two failed lists and the one that came through
}

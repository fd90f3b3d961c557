#pragma once
// The node's break glass (docs/operations.md#break-glass): while a ConfigMap of one name exists in the
// release's namespace, every node's enforcer lets every container be created as it is. It is read from
// the API by list and watch, so it acts on every node within about a second, and nothing of the release
// reverts it: the policy key nodeEnforcement, which does the same, reaches the enforcer through the
// kubelet's volume in up to a minute, and the next helm upgrade sets it back.
#include <atomic>
#include <memory>
#include <string>

#include "gpuguard/kube/api_server.hpp"
#include "gpuguard/kube/informer.hpp"
#include "gpuguard/kube/store.hpp"

namespace gpuguard::enforcer {

class BreakGlass {
 public:
  // Watches configmaps/<name> in <namespace_name> (the account needs get, list and watch of it alone).
  BreakGlass(const kube::ApiServer& server, const std::string& namespace_name, const std::string& name,
             kube::InformerObserver observer = {});
  void start() { informers_.start(); }
  // True while the ConfigMap exists, as last listed or watched; false until the API has answered.
  bool engaged() const { return store_.present.load(std::memory_order_relaxed); }
  const std::string& describe() const { return what_; }

 private:
  // Whether the one object the field selector lets through exists.
  struct PresenceStore final : kube::Store {
    std::atomic<bool> present{false};
    bool listed = false;  // what the list in progress has found
    void list_begin() override { listed = false; }
    void list_item(std::string_view /*object*/) override { listed = true; }
    void list_end(bool complete) override {
      if (complete) present.store(listed, std::memory_order_relaxed);
    }
    void apply(std::string_view type, std::string_view /*object*/) override {
      present.store(type != "DELETED", std::memory_order_relaxed);
    }
  };

  std::string what_;
  PresenceStore store_;
  kube::Informers informers_;
};

}  // namespace gpuguard::enforcer

#pragma once
// The switches that take pods out of gpuguard's admission where the webhook never sees it: a namespace
// labelled gpuguard.io/ignore (an admin's opt-out, or the break glass's value break-glass), and the
// webhook configuration or the backstop's binding deleted (the other break glass), and the pair that keeps
// the backstop's parameter watched deleted (which spoils the next). Nothing reaches the
// webhook once one is thrown, so it watches them through the API and says what it sees as gauges, for
// the alerts GPUGuardAdmissionBreakGlass and GPUGuardAdmissionObjectMissing (docs/operations.md#runbook),
// and whether it can watch them at all (GPUGuardAdmissionSwitchesUnwatched): each alert is silent without
// its watch. Only deletion of an object is seen, not a change of what it holds.
// It keeps the labelled namespaces' names alone (the list is selected by the label on the server, and only
// an admin may add it: the policy gpuguard-ignored-namespaces), and of each object whether it exists.
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/kube/informer.hpp"
#include "gpuguard/kube/reflector.hpp"
#include "gpuguard/kube/store.hpp"

namespace gpuguard::webhook {

inline constexpr std::string_view kIgnoreLabel = "gpuguard.io/ignore";
inline constexpr std::string_view kBreakGlassValue = "break-glass";

// The namespaces labelled kIgnoreLabel, by name: whether the label's value is the break glass's.
class IgnoredNamespaces final : public kube::Store {
 public:
  struct Counts {
    std::size_t break_glass = 0, other = 0;
  };
  Counts counts() const;
  bool listed() const { return listed_.load(); }

  void list_begin() override;
  void list_item(std::string_view object) override;
  void list_end(bool complete) override;
  void apply(std::string_view type, std::string_view object) override;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, bool, std::less<>> labelled_, listing_;
  std::atomic<bool> listed_{false};
};

// Whether one object, by name, exists: a list and watch selected by metadata.name.
class NamedObject final : public kube::Store {
 public:
  explicit NamedObject(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  bool exists() const { return exists_.load(); }
  bool listed() const { return listed_.load(); }

  void list_begin() override { listing_ = false; }
  void list_item(std::string_view object) override;
  void list_end(bool complete) override;
  void apply(std::string_view type, std::string_view object) override;

 private:
  bool is_it(std::string_view object) const;

  std::string name_;
  bool listing_ = false;  // the informer's thread alone
  std::atomic<bool> exists_{false}, listed_{false};
};

class AdmissionSwitches {
 public:
  // The MutatingWebhookConfiguration, the backstop's ValidatingAdmissionPolicyBinding and its
  // ValidatingAdmissionPolicy to watch, by name, and the policy and binding of one name that keep the API
  // servers watching the backstop's parameter (gpuguard-keep-configmap-params: without them the backstop's
  // binding, made again after the break glass, judges pods by the policy as it was); an empty name is not
  // watched (the backstop disabled, say).
  AdmissionSwitches(std::string webhook_configuration, std::string backstop_binding, std::string backstop_policy,
                    std::string parameter_keeper = {});

  // For kube::Informers: the labelled namespaces, and each object named, each list and watch named for
  // the object (its series' object="...").
  std::vector<kube::WatchedResource> watched_resources();
  // For kube::Informers' observer: whether each list and watch works. A list that succeeds, or a watch
  // that runs its course, says it does; a failed list or watch says it does not, until the next of those.
  // A resource watched for two objects works while both do. Outcomes for resources not watched here (DRA
  // claims) are ignored.
  void observe(std::string_view reflector, kube::ReflectorOutcome outcome);
  // gpuguard_admission_switches_watched for each resource from the start, and gpuguard_ignored_namespaces
  // and gpuguard_admission_object_present each once listed.
  void render(std::string& out) const;

 private:
  struct Object {
    const char* label;     // the series' object="..."
    const char* resource;  // its collection
    std::unique_ptr<NamedObject> store;
  };
  struct Watch {
    std::string resource;   // the collection, the series' resource="..."
    std::string reflector;  // the list and watch's name: "namespaces", or the object's label
    std::atomic<bool> working{false};
  };

  IgnoredNamespaces namespaces_;
  std::vector<Object> objects_;
  std::vector<std::unique_ptr<Watch>> watches_;  // fixed once constructed: observe() only reads the vector
};

}  // namespace gpuguard::webhook

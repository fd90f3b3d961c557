// The admission switches' stores, fed as kube::Informers feeds them: what a list and each watch event
// leave counted, whatever order a namespace's fields come in, and text that is not an object.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "gpuguard/kube/store.hpp"
#include "gpuguard/webhook/admission_switches.hpp"

using gpuguard::kube::PaddedText;
using gpuguard::webhook::IgnoredNamespaces;
using gpuguard::webhook::NamedObject;

namespace {

std::string ns(const std::string& name, const std::string& value) {
  const std::string labels = value.empty() ? "{}" : R"({"gpuguard.io/ignore":")" + value + R"("})";
  return R"({"kind":"Namespace","metadata":{"labels":)" + labels + R"(,"name":")" + name + R"("}})";
}

void item(gpuguard::kube::Store& store, const std::string& text) { store.list_item(PaddedText(text).view()); }
void event(gpuguard::kube::Store& store, const char* type, const std::string& text) {
  store.apply(type, PaddedText(text).view());
}

}  // namespace

TEST_CASE("the ignored namespaces are counted by whether the label's value is the break glass's") {
  IgnoredNamespaces store;
  CHECK_FALSE(store.listed());
  store.list_begin();
  item(store, ns("granted", "true"));
  item(store, ns("lab", "break-glass"));
  item(store, ns("unlabelled", ""));  // a server that did not select
  item(store, "not json");
  item(store, R"({"metadata":{"labels":{"gpuguard.io/ignore":"x"}}})");  // no name
  // A byte order mark before the text: the API server writes none (RFC 8259), and the store does not read
  // such a text, where nlohmann would skip the mark (the admission fuzzer's finding of 2026-12-07).
  item(store, "\xEF\xBB\xBF" + ns("marked", "break-glass"));
  // Nor one followed by NUL bytes, where nlohmann would end the text at the first (the fuzzer's next finding).
  item(store, ns("nul", "break-glass") + std::string(8, '\0'));
  store.list_end(true);
  REQUIRE(store.listed());
  CHECK(store.counts().break_glass == 1);
  CHECK(store.counts().other == 1);

  event(store, "ADDED", ns("team-a", "break-glass"));
  event(store, "MODIFIED", ns("granted", "break-glass"));  // a value changed
  CHECK(store.counts().break_glass == 3);
  CHECK(store.counts().other == 0);
  event(store, "MODIFIED", ns("team-a", ""));  // the label taken off, sent as it is
  event(store, "DELETED", ns("lab", "break-glass"));
  CHECK(store.counts().break_glass == 1);

  // An incomplete re-list keeps what was held; a complete one replaces it.
  store.list_begin();
  store.list_end(false);
  CHECK(store.counts().break_glass == 1);
  store.list_begin();
  store.list_end(true);
  CHECK(store.counts().break_glass == 0);
}

TEST_CASE("a named object exists from its list and watch, and no other object's counts") {
  NamedObject store("gpuguard");
  store.list_begin();
  item(store, R"({"metadata":{"name":"gpuguard-other"}})");
  store.list_end(true);
  REQUIRE(store.listed());
  CHECK_FALSE(store.exists());
  event(store, "ADDED", R"({"metadata":{"name":"gpuguard"}})");
  CHECK(store.exists());
  event(store, "DELETED", R"({"metadata":{"name":"other"}})");
  CHECK(store.exists());
  event(store, "DELETED", R"({"metadata":{"name":"gpuguard"}})");
  CHECK_FALSE(store.exists());
  store.list_begin();
  item(store, R"({"metadata":{"name":"gpuguard"}})");
  store.list_end(false);  // incomplete: nothing learnt
  CHECK_FALSE(store.exists());
  store.list_begin();
  item(store, R"({"metadata":{"name":"gpuguard"}})");
  store.list_end(true);
  CHECK(store.exists());
}

TEST_CASE("each watch is said working from a list that succeeds or a watch that ran its course, until one fails") {
  using gpuguard::kube::ReflectorOutcome;
  gpuguard::webhook::AdmissionSwitches switches("gpuguard", "", "gpuguard-visible-devices");
  auto page = [&] {
    std::string out;
    switches.render(out);
    return out;
  };
  const std::string namespaces = "gpuguard_admission_switches_watched{resource=\"namespaces\"} ";
  const std::string policies = "gpuguard_admission_switches_watched{resource=\"validatingadmissionpolicies\"} ";
  CHECK(page().find(namespaces + "0") != std::string::npos);                     // from the start, before any list
  CHECK(page().find("validatingadmissionpolicybindings") == std::string::npos);  // not named: not watched
  switches.observe("namespaces", ReflectorOutcome::list_success);
  switches.observe("resourceclaims", ReflectorOutcome::list_failure);  // not the switches': ignored
  CHECK(page().find(namespaces + "1") != std::string::npos);
  CHECK(page().find(policies + "0") != std::string::npos);
  switches.observe("namespaces", ReflectorOutcome::watch_error);
  CHECK(page().find(namespaces + "0") != std::string::npos);
  switches.observe("namespaces", ReflectorOutcome::watch_gone);  // a list follows: nothing learnt yet
  CHECK(page().find(namespaces + "0") != std::string::npos);
  switches.observe("namespaces", ReflectorOutcome::watch_closed);
  CHECK(page().find(namespaces + "1") != std::string::npos);
  switches.observe("namespaces", ReflectorOutcome::list_failure);
  CHECK(page().find(namespaces + "0") != std::string::npos);
  // Nothing listed yet: neither the counts nor the objects are said.
  CHECK(page().find("gpuguard_ignored_namespaces") == std::string::npos);
  CHECK(page().find("gpuguard_admission_object_present") == std::string::npos);
}

TEST_CASE("the keeper's policy and binding are watched by name beside the backstop's, each collection said once") {
  using gpuguard::kube::ReflectorOutcome;
  gpuguard::webhook::AdmissionSwitches switches("gpuguard", "gpuguard-visible-devices", "gpuguard-visible-devices",
                                                "gpuguard-keep-configmap-params");
  std::vector<std::string> watched;
  for (const auto& resource : switches.watched_resources()) {
    watched.push_back(resource.name + " " + resource.path + " " + resource.field_selector);
  }
  const std::string group = "/apis/admissionregistration.k8s.io/v1/";
  const std::string backstop = " metadata.name=gpuguard-visible-devices";
  const std::string keeper = " metadata.name=gpuguard-keep-configmap-params";
  CHECK(watched == std::vector<std::string>{
                       "namespaces /api/v1/namespaces ",
                       "webhook-configuration " + group + "mutatingwebhookconfigurations metadata.name=gpuguard",
                       "backstop-binding " + group + "validatingadmissionpolicybindings" + backstop,
                       "backstop-policy " + group + "validatingadmissionpolicies" + backstop,
                       "keeper-binding " + group + "validatingadmissionpolicybindings" + keeper,
                       "keeper-policy " + group + "validatingadmissionpolicies" + keeper,
                   });
  auto page = [&] {
    std::string out;
    switches.render(out);
    return out;
  };
  const std::string policies = "gpuguard_admission_switches_watched{resource=\"validatingadmissionpolicies\"} ";
  const auto count = [](const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  // Working once both lists of the collection have succeeded, and not while either fails.
  switches.observe("backstop-policy", ReflectorOutcome::list_success);
  CHECK(page().find(policies + "0") != std::string::npos);
  switches.observe("keeper-policy", ReflectorOutcome::list_success);
  CHECK(page().find(policies + "1") != std::string::npos);
  switches.observe("keeper-policy", ReflectorOutcome::watch_error);
  CHECK(page().find(policies + "0") != std::string::npos);
  CHECK(count(page(), "gpuguard_admission_switches_watched{") == 4);
  CHECK(count(page(), policies) == 1);
  // Each object's presence under its own label once listed: the keeper's deleted, the backstop's kept.
  for (const auto& resource : switches.watched_resources()) {
    resource.store->list_begin();
    const std::string name = resource.field_selector.substr(resource.field_selector.find('=') + 1);
    if (resource.name != "namespaces" && resource.name != "keeper-policy") {
      resource.store->list_item(PaddedText(R"({"metadata":{"name":")" + name + R"("}})").view());
    }
    resource.store->list_end(true);
  }
  const std::string present = "gpuguard_admission_object_present{object=";
  CHECK(page().find(present + "\"keeper-policy\"} 0") != std::string::npos);
  CHECK(page().find(present + "\"keeper-binding\"} 1") != std::string::npos);
  CHECK(page().find(present + "\"backstop-policy\"} 1") != std::string::npos);
}

// The admission switches' stores, fed as kube::Informers feeds them: what a list and each watch event
// leave counted, whatever order a namespace's fields come in, and text that is not an object.
#include <catch2/catch.hpp>

#include <string>

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

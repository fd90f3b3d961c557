// Kubernetes names (k8s/names.hpp), checked against the API server's own patterns as regular expressions (an
// independent implementation): every string over an alphabet holding each kind of character, up to length 4,
// and the length limits.
#include <catch2/catch.hpp>

#include <regex>
#include <string>
#include <vector>

#include "gpuguard/k8s/names.hpp"

namespace {

// apimachinery's validation: dns1123LabelFmt and dns1123SubdomainFmt, with their length limits.
bool label_by_regex(const std::string& name) {
  static const std::regex kLabel("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  return name.size() <= 63 && std::regex_match(name, kLabel);
}

bool subdomain_by_regex(const std::string& name) {
  static const std::regex kSubdomain("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  return name.size() <= 253 && std::regex_match(name, kSubdomain);
}

}  // namespace

TEST_CASE("names: every short string is a label and a subdomain exactly when the API server's patterns say so") {
  const std::string alphabet = "a9-.A/_";
  std::vector<std::string> names{""};
  for (std::size_t start = 0, length = 1; length <= 4; ++length) {
    const std::size_t end = names.size();
    for (std::size_t i = start; i < end; ++i) {
      for (const char c : alphabet) names.push_back(names[i] + c);
    }
    start = end;
  }
  REQUIRE(names.size() == 1 + 7 + 49 + 343 + 2401);
  std::size_t labels = 0;
  std::size_t subdomains = 0;
  for (const std::string& name : names) {
    INFO("'" << name << "'");
    CHECK(gpuguard::k8s::is_dns_label(name) == label_by_regex(name));
    CHECK(gpuguard::k8s::is_dns_subdomain(name) == subdomain_by_regex(name));
    labels += label_by_regex(name) ? 1 : 0;
    subdomains += subdomain_by_regex(name) ? 1 : 0;
  }
  // Both sides of each comparison are met: some names pass, more fail.
  CHECK(labels > 10);
  CHECK(subdomains > labels);
  CHECK(subdomains < names.size() / 2);
}

TEST_CASE("names: a label holds at most 63 characters, a subdomain at most 253 with parts of any length") {
  using gpuguard::k8s::is_dns_label;
  using gpuguard::k8s::is_dns_subdomain;
  CHECK(is_dns_label(std::string(63, 'a')));
  CHECK_FALSE(is_dns_label(std::string(64, 'a')));
  const std::string longest =
      std::string(63, 'a') + "." + std::string(63, 'b') + "." + std::string(63, 'c') + "." + std::string(61, 'd');
  // apimachinery's IsDNS1123Subdomain holds only the whole name to 253: a part may be longer than a label.
  for (const std::string& name : {longest, longest + "d", std::string(63, 'a') + "." + std::string(64, 'b'),
                                  std::string(253, 'a'), std::string(254, 'a'), std::string(252, 'a') + "-"}) {
    INFO(name.size() << " characters");
    CHECK(is_dns_subdomain(name) == subdomain_by_regex(name));
  }
  CHECK(is_dns_subdomain(longest));
  CHECK_FALSE(is_dns_subdomain(longest + "d"));
  CHECK(is_dns_subdomain(std::string(63, 'a') + "." + std::string(64, 'b')));
  CHECK(is_dns_subdomain(std::string(253, 'a')));
  CHECK_FALSE(is_dns_subdomain(std::string(254, 'a')));
}

// One pod through the admission core, and the node's verdict beside it: what `audit` and the audit loop
// both report.
#include "gpuguard/audit/pod_audit.hpp"

#include <algorithm>
#include <array>
#include <charconv>

#include <simdjson.h>
#include <nlohmann/json.hpp>

namespace gpuguard::audit {
namespace {

std::string json_string(std::string_view text) {
  return nlohmann::json(std::string(text)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string_view text_at(simdjson::dom::element object, std::string_view key) {
  std::string_view text;
  if (object[key].get(text) != simdjson::SUCCESS) return {};
  return text;
}

// The door's name as a label: lower case, words joined by '-'.
constexpr std::array<std::pair<std::string_view, std::string_view>, 12> kReasons = {{
    {"image default", "image-default"},
    {"user value", "user-value"},
    {"user value in a GPU container", "gpu-user-value"},
    {"envFrom in a GPU container", "env-from"},
    {"privileged", "privileged"},
    {"host device mount", "host-device-mount"},
    {"CDI annotation", "cdi-annotation"},
    {"runtime class", "runtime-class"},
    {"NVIDIA CDI annotation", "nvidia-cdi-annotation"},
    {"feature variable", "feature-env-var"},
    {"unresolved DRA claim", "unresolved-claim"},
    {kNodeDoor, "node-runtime"},
}};

// Digits at `text[at..at+n)` as a number, or -1.
int digits(std::string_view text, std::size_t at, std::size_t n) {
  if (at + n > text.size()) return -1;
  int value = 0;
  const auto [end, error] = std::from_chars(text.data() + at, text.data() + at + n, value);
  return error == std::errc{} && end == text.data() + at + n ? value : -1;
}

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
long long days_from_civil(int year, int month, int day) {
  year -= month <= 2 ? 1 : 0;
  const int era = (year >= 0 ? year : year - 399) / 400;
  const int year_of_era = year - era * 400;
  const int day_of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
  const int day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
  return static_cast<long long>(era) * 146097 + day_of_era - 719468;
}

}  // namespace

std::string create_review_for(std::string_view pod_json, std::string_view pod_namespace, std::string_view pod_name) {
  std::string review;
  review.reserve(pod_json.size() + 512);
  review += R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{)"
            R"("uid":"00000000-0000-0000-0000-000000000000",)"
            R"("kind":{"group":"","version":"v1","kind":"Pod"},)"
            R"("resource":{"group":"","version":"v1","resource":"pods"},"namespace":)";
  review += json_string(pod_namespace.empty() ? "default" : pod_namespace);
  review += R"(,"name":)";
  review += json_string(pod_name);
  review += R"(,"operation":"CREATE","userInfo":{"username":"gpuguard-review"},"dryRun":true,"object":)";
  review += pod_json;
  review += "}}";
  return review;
}

std::optional<PodAudit> audit_pod(std::string_view pod_json, const policy::Policy& policy,
                                  const admission::ClaimLookup* claims, std::string& error) {
  // One parser a thread for the pods of usual size, as the admission core keeps; a rare large pod gets its own.
  thread_local simdjson::dom::parser reused;
  simdjson::dom::parser own;
  simdjson::dom::parser& parser = pod_json.size() <= admission::kReusableParserLimit ? reused : own;
  simdjson::dom::element pod;
  if (parser.parse(pod_json.data(), pod_json.size()).get(pod) != simdjson::SUCCESS || !pod.is_object()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  PodAudit audit;
  simdjson::dom::element metadata, spec, resource_claims;
  if (pod["metadata"].get(metadata) == simdjson::SUCCESS && metadata.is_object()) {
    audit.namespace_ = text_at(metadata, "namespace");
    audit.name = text_at(metadata, "name");
    audit.uid = text_at(metadata, "uid");
    audit.created = unix_seconds(text_at(metadata, "creationTimestamp")).value_or(0);
  }
  if (audit.namespace_.empty()) audit.namespace_ = "default";
  if (pod["spec"].get(spec) == simdjson::SUCCESS && spec.is_object()) {
    audit.node = text_at(spec, "nodeName");
    simdjson::dom::array list;
    audit.has_claims = spec["resourceClaims"].get(list) == simdjson::SUCCESS && list.size() > 0;
  }
  admission::Examination examination =
      admission::examine(create_review_for(pod_json, audit.namespace_, audit.name), policy, claims);
  if (!examination.ok) {
    error = std::move(examination.error);
    return std::nullopt;
  }
  audit.exempt = examination.exempt;
  audit.mirror = examination.mirror;
  if (!examination.exposures.empty() || !examination.gpu_less.empty()) {
    audit.findings = std::make_shared<const PodFindings>(
        PodFindings{std::move(examination.exposures), std::move(examination.gpu_less)});
  }
  return audit;
}

std::vector<admission::Exposure> node_exposures(const PodAudit& pod, const nodereport::SeenCondition* condition) {
  std::vector<admission::Exposure> exposures;
  if (condition == nullptr || condition->status == "True") return exposures;
  const std::string detail = "node " + pod.node + ": " + std::string(nodereport::kConditionType) + " " +
                             condition->status + (condition->reason.empty() ? "" : " (" + condition->reason + ")");
  for (const admission::ContainerRef& c : pod.gpu_less()) {
    exposures.push_back({c.container, c.list, std::string(kNodeDoor), detail, "nothing (the node's runtime decides)"});
  }
  return exposures;
}

std::shared_ptr<const PodFindings> PodAudit::no_findings() {
  static const auto kNone = std::make_shared<const PodFindings>();
  return kNone;
}

bool operator==(const PodFindings& a, const PodFindings& b) {
  const auto same_exposure = [](const admission::Exposure& x, const admission::Exposure& y) {
    return x.container == y.container && x.list == y.list && x.door == y.door && x.detail == y.detail &&
           x.webhook == y.webhook;
  };
  const auto same_ref = [](const admission::ContainerRef& x, const admission::ContainerRef& y) {
    return x.container == y.container && x.list == y.list;
  };
  return std::equal(a.exposures.begin(), a.exposures.end(), b.exposures.begin(), b.exposures.end(), same_exposure) &&
         std::equal(a.gpu_less.begin(), a.gpu_less.end(), b.gpu_less.begin(), b.gpu_less.end(), same_ref);
}

std::size_t hash_of(const PodFindings& findings) {
  std::size_t hash = 0;
  const auto mix = [&hash](const std::string& text) {
    hash = (hash * 1099511628211ULL) ^ std::hash<std::string>{}(text);
  };
  for (const admission::Exposure& e : findings.exposures) {
    for (const std::string* field : {&e.container, &e.list, &e.door, &e.detail, &e.webhook}) mix(*field);
  }
  for (const admission::ContainerRef& c : findings.gpu_less) {
    mix(c.container);
    mix(c.list);
  }
  return hash;
}

std::string_view reason_of(std::string_view door) {
  const auto found = std::find_if(kReasons.begin(), kReasons.end(), [&](const auto& r) { return r.first == door; });
  return found != kReasons.end() ? found->second : std::string_view("other");
}

std::optional<long long> unix_seconds(std::string_view text) {
  // YYYY-MM-DDTHH:MM:SS, then an optional fraction, then Z or ±HH:MM.
  if (text.size() < 20 || text[4] != '-' || text[7] != '-' || (text[10] != 'T' && text[10] != 't') || text[13] != ':' ||
      text[16] != ':') {
    return std::nullopt;
  }
  const int year = digits(text, 0, 4), month = digits(text, 5, 2), day = digits(text, 8, 2);
  const int hour = digits(text, 11, 2), minute = digits(text, 14, 2), second = digits(text, 17, 2);
  if (year < 0 || month < 1 || month > 12 || day < 1 || day > 31 || hour < 0 || hour > 23 || minute < 0 ||
      minute > 59 || second < 0 || second > 60) {
    return std::nullopt;
  }
  std::size_t at = 19;
  if (text[at] == '.') {
    ++at;
    const std::size_t start = at;
    while (at < text.size() && text[at] >= '0' && text[at] <= '9') ++at;
    if (at == start) return std::nullopt;
  }
  long long offset = 0;
  if (at < text.size() && (text[at] == 'Z' || text[at] == 'z')) {
    ++at;
  } else if (at < text.size() && (text[at] == '+' || text[at] == '-')) {
    const int hours = digits(text, at + 1, 2), minutes = digits(text, at + 4, 2);
    if (hours < 0 || minutes < 0 || at + 3 >= text.size() || text[at + 3] != ':') return std::nullopt;
    offset = (text[at] == '+' ? 1 : -1) * (hours * 3600LL + minutes * 60LL);
    at += 6;
  } else {
    return std::nullopt;
  }
  if (at != text.size()) return std::nullopt;
  return days_from_civil(year, month, day) * 86400 + hour * 3600LL + minute * 60LL + second - offset;
}

}  // namespace gpuguard::audit

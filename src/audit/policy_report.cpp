// The PolicyReport of a namespace, written so that the same findings always give the same bytes: keys
// sorted (nlohmann's map), results sorted by pod, times from the pods themselves, never from the pass.
#include "gpuguard/audit/policy_report.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace gpuguard::audit {
namespace {

using nlohmann::json;

// A result's message stays readable in a table; the properties name every container and reason.
constexpr std::size_t kMaxMessage = 1024;

std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

// FNV-1a, 64 bits, in hex: a change detector for reports, not a defence against anyone.
std::string fnv1a(std::string_view text) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

// Each name once, in the order first seen.
void add_once(std::vector<std::string>& names, const std::string& name) {
  if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ",") + name;
  return text;
}

json result_for(const PodExposures& entry, policy::Mode mode) {
  const PodAudit& pod = *entry.pod;
  std::vector<std::string> containers, reasons;
  std::string message;
  for (const auto* list : {&pod.exposures(), &entry.from_node}) {
    for (const admission::Exposure& e : *list) {
      add_once(containers, e.container);
      add_once(reasons, std::string(reason_of(e.door)));
      if (!message.empty()) message += "; ";
      message += (e.list == "containers" ? "container \"" : e.list + " \"") + e.container + "\": " + e.door;
      if (!e.detail.empty()) message += " (" + e.detail + ")";
      message += ", the webhook " + e.webhook;
    }
  }
  if (message.size() > kMaxMessage) message = message.substr(0, kMaxMessage - 3) + "...";
  json properties = {{"containers", joined(containers)}, {"reasons", joined(reasons)}};
  if (!pod.node.empty()) properties["node"] = pod.node;
  if (pod.exempt) properties["exempt"] = "true";
  if (pod.mirror) properties["staticPod"] = "true";
  json resource = {{"apiVersion", "v1"}, {"kind", "Pod"}, {"namespace", pod.namespace_}, {"name", pod.name}};
  if (!pod.uid.empty()) resource["uid"] = pod.uid;
  return {{"source", kReportSource},
          {"policy", kReportPolicy},
          {"rule", "no-unrequested-gpus"},
          {"category", "GPU isolation"},
          {"severity", "high"},
          {"scored", true},
          {"result", result_of(pod, mode)},
          {"message", message},
          {"timestamp", {{"seconds", pod.created}, {"nanos", 0}}},
          {"resources", json::array({resource})},
          {"properties", properties}};
}

}  // namespace

std::string_view result_of(const PodAudit& pod, policy::Mode mode) {
  if (pod.exempt || pod.mirror) return kResults[2];
  if (mode == policy::Mode::audit || mode == policy::Mode::off) return kResults[1];
  return kResults[0];
}

NamespaceReport policy_report(std::string_view pod_namespace, std::vector<PodExposures> pods, policy::Mode mode) {
  std::sort(pods.begin(), pods.end(), [](const PodExposures& a, const PodExposures& b) {
    return std::tie(a.pod->name, a.pod->uid) < std::tie(b.pod->name, b.pod->uid);
  });
  NamespaceReport report;
  report.namespace_ = pod_namespace;
  json results = json::array();
  for (const PodExposures& entry : pods) {
    const std::string_view outcome = result_of(*entry.pod, mode);
    (outcome == "fail" ? report.fail : outcome == "warn" ? report.warn : report.skip) += 1;
    if (results.size() < kMaxResults) results.push_back(result_for(entry, mode));
  }
  json document = {
      {"apiVersion", "wgpolicyk8s.io/v1alpha2"},
      {"kind", "PolicyReport"},
      {"metadata",
       {{"name", kReportName}, {"namespace", pod_namespace}, {"labels", {{kManagedByLabel, kManagedByValue}}}}},
      {"summary", {{"pass", 0}, {"fail", report.fail}, {"warn", report.warn}, {"error", 0}, {"skip", report.skip}}},
      {"results", std::move(results)}};
  report.hash = fnv1a(dump(document));
  document["metadata"]["annotations"] = {{kContentHashAnnotation, report.hash}};
  report.body = dump(document);
  return report;
}

}  // namespace gpuguard::audit

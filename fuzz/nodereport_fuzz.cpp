// libFuzzer target: bytes as a node's files, judged by the node report for both values. The files are
// the input split at "\n=====\n": the toolkit's config.toml, containerd's config.toml, a containerd
// drop-in, CRI-O's crio.conf, a CDI spec, the dpkg database, the GPU Operator's toolkit config, the name
// of a file in its install directory (where a libnvidia-container's name carries the version), and rpm's
// SQLite database.
// Besides "no crash, no sanitizer finding" (a malformed file is a finding, never an error), it asserts
// what the report promises: void is honoured or not acted on on every node whose runtime configuration
// can be read (no mode reads it as a device request), cannot-judge exactly where it cannot and naming the
// file and why, valueHonoured matches the verdict, a verdict of not-acted-on names its doors, every finding
// has a code and a message and a malformed one its file, the JSON parses and says what the report says,
// the Node condition is True exactly when the value is honoured and reads back as written, and judging
// is deterministic.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpuguard/nodereport/node_condition.hpp"
#include "gpuguard/nodereport/report.hpp"

using namespace gpuguard::nodereport;

namespace {

[[noreturn]] void violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "property violated: %s: %s\n", what, detail.substr(0, 500).c_str());
  std::abort();
}

// Files in memory, by their path on the host.
class MemoryHost : public HostFiles {
 public:
  std::map<std::string, std::string> files;
  std::optional<std::string> read(const std::string& path) const override {
    const auto found = files.find(path);
    if (found == files.end()) return std::nullopt;
    return found->second;
  }
  std::optional<std::string> read_range(const std::string& path, std::uint64_t offset,
                                        std::size_t length) const override {
    const auto found = files.find(path);
    if (found == files.end()) return std::nullopt;
    if (offset >= found->second.size()) return std::string();
    return found->second.substr(offset, length);
  }
  std::vector<std::string> list(const std::string& directory) const override {
    std::vector<std::string> names;
    const std::string prefix = directory + "/";
    for (const auto& [path, content] : files) {
      if (path.starts_with(prefix) && path.find('/', prefix.size()) == std::string::npos)
        names.push_back(path.substr(prefix.size()));
    }
    return names;
  }
  // The directories a file's path passes through just below `directory`, each once, sorted.
  std::vector<std::string> subdirectories(const std::string& directory) const override {
    std::vector<std::string> names;
    const std::string prefix = directory + "/";
    for (const auto& [path, content] : files) {
      const std::size_t slash = path.starts_with(prefix) ? path.find('/', prefix.size()) : std::string::npos;
      if (slash == std::string::npos) continue;
      std::string name = path.substr(prefix.size(), slash - prefix.size());
      if (names.empty() || names.back() != name) names.push_back(std::move(name));  // a directory's paths are adjacent
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  bool exists(const std::string& path) const override {
    if (files.count(path) != 0) return true;
    const std::string prefix = path + "/";
    const auto next = files.lower_bound(prefix);
    return next != files.end() && next->first.starts_with(prefix);
  }
};

void check(const Report& report, const std::string& input) {
  if (report.value_honoured() != (report.verdict == Verdict::honoured || report.verdict == Verdict::not_acted_on))
    violated("valueHonoured matches the verdict", input);
  if (report.verdict == Verdict::not_acted_on && report.doors.empty()) violated("not-acted-on names doors", input);
  if (report.reason.empty()) violated("a verdict has a reason", input);
  for (const Finding& finding : report.findings) {
    if (finding.code.empty() || finding.message.empty()) violated("a finding has a code and a message", input);
    if (finding.code == "malformed-file" && finding.file.empty()) violated("a malformed file is named", input);
    if (finding.line < 0) violated("a finding's line is 1-based or 0", input);
  }
  const auto json = nlohmann::json::parse(to_json(report), nullptr, false);
  if (json.is_discarded()) violated("the report is JSON", input);
  if (json["valueHonoured"] != report.value_honoured() || json["verdict"] != verdict_name(report.verdict) ||
      json["findings"].size() != report.findings.size())
    violated("the JSON says what the report says", input);
  if (to_text(report).empty()) violated("the text is not empty", input);
  const Condition condition = condition_of(report);
  if ((condition.status == "True") != report.value_honoured()) violated("the condition is True when honoured", input);
  const auto patch = nlohmann::json::parse(condition_patch(condition, "t1", "t0"), nullptr, false);
  if (patch.is_discarded()) violated("the condition's patch is JSON", input);
  const auto seen = seen_condition(R"({"kind":"Node","status":)" + patch["status"].dump() + "}");
  if (!seen || seen->status != condition.status || seen->reason != condition.reason || seen->message.empty() ||
      seen->last_transition_time != "t0")
    violated("the condition reads back as written", input);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  static const char* const kPaths[] = {
      "/etc/nvidia-container-runtime/config.toml",
      "/etc/containerd/config.toml",
      "/etc/containerd/conf.d/99-nvidia.toml",
      "/etc/crio/crio.conf",
      "/etc/cdi/nvidia.yaml",
      "/var/lib/dpkg/status",
      "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
      "",  // a file name in /usr/local/nvidia/toolkit
      "/var/lib/rpm/rpmdb.sqlite",
  };
  MemoryHost host;
  host.files["/proc/driver/nvidia/version"] = "NVRM version: fuzz\n";
  std::string_view rest = input;
  for (const char* path : kPaths) {
    const std::size_t end = rest.find("\n=====\n");
    const std::string_view part = rest.substr(0, end);
    if (*path == '\0') {
      if (!part.empty() && part.find('/') == std::string_view::npos)
        host.files["/usr/local/nvidia/toolkit/" + std::string(part)] = "";
    } else if (!part.empty()) {
      host.files[path] = std::string(part);
    }
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 7);
  }
  for (const std::string value : {"none", "void"}) {
    const Report report = judge(host, value);
    check(report, input);
    if (to_json(judge(host, value)) != to_json(report)) violated("judging is deterministic", input);
    if (value == "void" && !report.value_honoured() && report.verdict != Verdict::cannot_judge)
      violated("void is honoured or not acted on, where the runtime's configuration can be read", input);
    if ((report.verdict == Verdict::cannot_judge) != !report.facts.runtime_config_unreadable.empty())
      violated("cannot-judge exactly when a runtime configuration file cannot be read", input);
    if (report.verdict == Verdict::cannot_judge &&
        report.reason.find(report.facts.runtime_config_unreadable) == std::string::npos)
      violated("cannot-judge names the file and why", input);
  }
  return 0;
}

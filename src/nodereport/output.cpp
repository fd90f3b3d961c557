// The node report as JSON (for tests, the audit and machines) and as text (for an admin at a terminal).
#include <nlohmann/json.hpp>

#include "gpuguard/nodereport/report.hpp"

namespace gpuguard::nodereport {

std::string to_json(const Report& report) {
  const Facts& f = report.facts;
  nlohmann::json facts = {
      {"toolkit",
       {{"config", f.toolkit_config ? nlohmann::json(f.toolkit_config_file) : nullptr},
        {"mode", f.mode},
        {"resolvedMode", f.resolved_mode.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.resolved_mode)},
        {"acceptEnvvarWhenUnprivileged", f.envvar_when_unprivileged},
        {"acceptAsVolumeMounts", f.volume_mounts},
        {"version", f.toolkit_version ? nlohmann::json(*f.toolkit_version) : nullptr},
        {"versionSource", f.toolkit_version_source}}},
      {"runtime",
       {{"name", f.container_runtime},
        {"configFiles", f.runtime_config_files},
        {"defaultHandler", f.default_runtime},
        {"defaultBinary", f.default_runtime_binary},
        {"defaultIsNvidia", f.default_is_nvidia},
        {"nvidiaHandlers", f.nvidia_handlers},
        {"nvidiaBinary", f.nvidia_runtime_binary}}},
      {"cdi",
       {{"defaultKind", f.default_kind},
        {"specDirs", f.spec_dirs},
        {"specFiles", f.cdi_spec_files},
        {"gpuDevices", f.gpu_devices},
        {"noneDevice", f.none_device}}}};
  nlohmann::json findings = nlohmann::json::array();
  for (const Finding& finding : report.findings) {
    nlohmann::json entry = {
        {"severity", severity_name(finding.severity)}, {"code", finding.code}, {"message", finding.message}};
    if (!finding.file.empty()) entry["file"] = finding.file;
    if (finding.line > 0) entry["line"] = finding.line;
    findings.push_back(std::move(entry));
  }
  return nlohmann::json{{"value", report.value},
                        {"valueHonoured", report.value_honoured()},
                        {"verdict", verdict_name(report.verdict)},
                        {"reason", report.reason},
                        {"doors", report.doors},
                        {"hardened", report.hardened},
                        {"hardening", report.hardening},
                        {"facts", std::move(facts)},
                        {"findings", std::move(findings)}}
             .dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

std::string to_text(const Report& report) {
  const Facts& f = report.facts;
  std::string text = "NVIDIA_VISIBLE_DEVICES=" + report.value + ": " + std::string(verdict_name(report.verdict)) +
                     "\n  " + report.reason + "\n";
  for (const std::string& door : report.doors) text += "  door: " + door + "\n";
  text += std::string(report.hardened ? "hardened: " : "not hardened: ") + report.hardening + "\n";
  text += "toolkit: " + (f.toolkit_config ? f.toolkit_config_file : std::string("no config.toml")) + ", mode " + f.mode;
  if (!f.resolved_mode.empty() && f.resolved_mode != f.mode) text += " (" + f.resolved_mode + ")";
  text += ", version " + f.toolkit_version.value_or("unknown");
  if (f.toolkit_version) text += " (" + f.toolkit_version_source + ")";
  text += "\n";
  text += "runtime: " + (f.container_runtime.empty() ? std::string("none configured") : f.container_runtime) +
          ", default handler " + f.default_runtime + " (" + f.default_runtime_binary + ")\n";
  text += "cdi: " + std::to_string(f.cdi_spec_files.size()) + " spec file(s), " + std::to_string(f.gpu_devices.size()) +
          " " + f.default_kind + " device(s)" + (f.none_device ? ", one named none" : "") + "\n";
  for (const Finding& finding : report.findings) {
    text.append(severity_name(finding.severity)).append(" ").append(finding.code).append(": ").append(finding.message);
    if (!finding.file.empty()) {
      text.append(" (").append(finding.file);
      if (finding.line > 0) text.append(":").append(std::to_string(finding.line));
      text.append(")");
    }
    text.append("\n");
  }
  return text;
}

}  // namespace gpuguard::nodereport

// NodeIsolation: the node report's latest verdicts, and the Node condition's writes, as Prometheus series.
#include "gpuguard/deviceplugin/node_isolation.hpp"

#include <array>

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::deviceplugin {
namespace {

constexpr metrics::Family kConditionWrites{
    "gpuguard_device_plugin_node_condition_writes_total", "counter",
    "Writes of this node's GPUIsolation condition to its Node object, by result."};
constexpr metrics::Family kValueHonoured{"gpuguard_device_plugin_value_honoured", "gauge",
                                         "1 when NVIDIA_VISIBLE_DEVICES=<value> keeps GPUs out of a container without "
                                         "one on this node: the node report's verdict (label) is honoured or "
                                         "not-acted-on."};
constexpr metrics::Family kInjectedHonoured{"gpuguard_device_plugin_injected_value_honoured", "gauge",
                                            "1 when the value the policy injects (label) keeps GPUs out of a container "
                                            "without one on this node, as the GPUIsolation condition says."};
constexpr metrics::Family kFindings{"gpuguard_device_plugin_node_findings", "gauge",
                                    "The node report's findings under NVIDIA_VISIBLE_DEVICES=none, by severity."};

std::string verdict_labels(const nodereport::Report& report) {
  return metrics::labels({{"value", report.value}, {"verdict", nodereport::verdict_name(report.verdict)}});
}

}  // namespace

bool NodeIsolation::judged() const {
  const std::lock_guard lock(mutex_);
  return none_.has_value();
}

bool NodeIsolation::update(const nodereport::Report& none, const nodereport::Report& void_value, std::string injected) {
  std::string both = nodereport::to_json(none);
  both.append(nodereport::to_json(void_value));
  const std::lock_guard lock(mutex_);
  none_ = none;
  void_ = void_value;
  injected_ = std::move(injected);
  if (both == last_) return false;
  last_ = std::move(both);
  return true;
}

void NodeIsolation::count_condition_write(bool success) {
  const std::lock_guard lock(mutex_);
  ++condition_writes_.at(success ? 0 : 1);
}

void NodeIsolation::render_metrics(std::string& out) const {
  render_reloads(out, false, false);
  const std::lock_guard lock(mutex_);
  metrics::two_results(out, kConditionWrites, condition_writes_);
  if (!none_ || !void_) return;
  metrics::header(out, kValueHonoured);
  for (const nodereport::Report* report : {&*none_, &*void_}) {
    metrics::sample(out, kValueHonoured, verdict_labels(*report), report->value_honoured() ? "1" : "0");
  }
  const nodereport::Report& injected = injected_ == "void" ? *void_ : *none_;
  metrics::header(out, kInjectedHonoured);
  metrics::sample(out, kInjectedHonoured, verdict_labels(injected), injected.value_honoured() ? "1" : "0");
  metrics::header(out, kFindings);
  std::array<std::size_t, 3> counts{};
  for (const nodereport::Finding& finding : none_->findings) ++counts.at(static_cast<std::size_t>(finding.severity));
  for (const auto severity :
       {nodereport::Severity::critical, nodereport::Severity::warning, nodereport::Severity::info}) {
    metrics::sample(out, kFindings, metrics::labels({{"severity", nodereport::severity_name(severity)}}),
                    counts.at(static_cast<std::size_t>(severity)));
  }
}

}  // namespace gpuguard::deviceplugin

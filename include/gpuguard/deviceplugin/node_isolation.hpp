#pragma once
// What the node report last said of this node, for /metrics: the plugin judges the node at start and
// again every kNodeReportInterval, and the status routes read the latest verdicts from here, with the
// writes of the Node condition and the reloads of the policy whose value the condition judges.
#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "gpuguard/metrics/reloads.hpp"
#include "gpuguard/nodereport/report.hpp"

namespace gpuguard::deviceplugin {

inline constexpr std::chrono::seconds kNodeReportInterval{10};

class NodeIsolation : public metrics::ReloadMetrics {
 public:
  // Keeps the reports for both values, and which of them the policy injects; true when the reports differ
  // from the last ones (the first included).
  bool update(const nodereport::Report& none, const nodereport::Report& void_value, std::string injected = "none");
  void count_condition_write(bool success);
  // Once the first update has been kept.
  bool judged() const;
  // gpuguard_device_plugin_value_honoured, gpuguard_device_plugin_injected_value_honoured and
  // gpuguard_device_plugin_node_findings (nothing before the first update), the condition's writes, and the
  // policy's reloads (not its mode, which the plugin does not read).
  void render_metrics(std::string& out) const;

 private:
  mutable std::mutex mutex_;
  std::optional<nodereport::Report> none_;
  std::optional<nodereport::Report> void_;
  std::string injected_ = "none";
  std::string last_;                                 // both reports as JSON, to tell a change
  std::array<std::uint64_t, 2> condition_writes_{};  // success, failure
};

}  // namespace gpuguard::deviceplugin

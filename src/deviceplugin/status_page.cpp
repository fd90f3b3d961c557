// The device plugin's readiness and series (include/gpuguard/deviceplugin/status_page.hpp).
#include "gpuguard/deviceplugin/status_page.hpp"

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::deviceplugin {

bool StatusPage::ready() const { return status_.gpus == "report-only" ? isolation_.judged() : kubelet_.registered(); }

std::string StatusPage::render_metrics() const {
  std::string out;
  metrics::header(
      out, "gpuguard_device_plugin_info", "gauge",
      "Where the GPUs were discovered (nvml, procfs, none), where their health comes from (nvml, presence, off), "
      "and whether they are served, only reported, or none was found (served, report-only, none).");
  out.append("gpuguard_device_plugin_info{version=\"")
      .append(status_.version)
      .append("\",discovery=\"")
      .append(status_.discovery)
      .append("\",health=\"")
      .append(status_.health)
      .append("\",gpus=\"")
      .append(status_.gpus)
      .append("\"} 1\n");
  metrics::header(out, "gpuguard_device_plugin_devices", "gauge",
                  "Devices served to the kubelet, by resource and health.");
  for (const auto& resource : resources_) {
    std::size_t healthy = 0, total = 0;
    for (const Device& device : resource->devices().snapshot()) {
      ++total;
      healthy += device.healthy ? 1 : 0;
    }
    for (const auto& [health, count] : {std::pair{"healthy", healthy}, std::pair{"unhealthy", total - healthy}}) {
      out.append("gpuguard_device_plugin_devices{resource=\"")
          .append(resource->name())
          .append("\",health=\"")
          .append(health)
          .append("\"} ")
          .append(std::to_string(count))
          .append("\n");
    }
  }
  metrics::header(out, "gpuguard_device_plugin_registered", "gauge",
                  "1 while every resource is registered with the kubelet.sock that exists now.");
  out.append("gpuguard_device_plugin_registered ").append(kubelet_.registered() ? "1" : "0").append("\n");
  metrics::header(out, "gpuguard_device_plugin_kubelet_passes_total", "counter",
                  "Passes over the kubelet's socket and the plugin's own (each second): served again where a socket "
                  "was gone, registered again with a new kubelet.");
  out.append("gpuguard_device_plugin_kubelet_passes_total ").append(std::to_string(kubelet_.passes())).append("\n");
  isolation_.render_metrics(out);
  return out;
}

}  // namespace gpuguard::deviceplugin

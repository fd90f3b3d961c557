// The device plugin's readiness and series (include/gpuguard/deviceplugin/status_page.hpp).
#include "gpuguard/deviceplugin/status_page.hpp"

#include "gpuguard/metrics/text.hpp"

namespace gpuguard::deviceplugin {

namespace {

constexpr metrics::Family kInfo{
    "gpuguard_device_plugin_info", "gauge",
    "Where the GPUs were discovered (nvml, procfs, none), where their health comes from (nvml, presence, off), "
    "and whether they are served, only reported, or none was found (served, report-only, none)."};
constexpr metrics::Family kDevices{"gpuguard_device_plugin_devices", "gauge",
                                   "Devices served to the kubelet, by resource and health."};
constexpr metrics::Family kRegistered{"gpuguard_device_plugin_registered", "gauge",
                                      "1 while every resource is registered with the kubelet.sock that exists now."};
constexpr metrics::Family kPasses{"gpuguard_device_plugin_kubelet_passes_total", "counter",
                                  "Passes over the kubelet's socket and the plugin's own (each second): served again "
                                  "where a socket was gone, registered again with a new kubelet."};

}  // namespace

// Serving: registered, and the GPUs no other plugin serves released, so that a rollout waits for both.
bool StatusPage::ready() const {
  if (status_.gpus == "report-only") return isolation_.judged();
  return kubelet_.registered() && (others_ == nullptr || others_->released());
}

std::string StatusPage::render_metrics() const {
  std::string out;
  metrics::header(out, kInfo);
  metrics::sample(out, kInfo,
                  metrics::labels({{"version", status_.version},
                                   {"discovery", status_.discovery},
                                   {"health", status_.health},
                                   {"gpus", status_.gpus}}),
                  "1");
  metrics::header(out, kDevices);
  for (const auto& resource : resources_) {
    std::size_t healthy = 0, total = 0;
    for (const Device& device : resource->devices().snapshot()) {
      ++total;
      healthy += device.healthy ? 1 : 0;
    }
    for (const auto& [health, count] : {std::pair{"healthy", healthy}, std::pair{"unhealthy", total - healthy}}) {
      metrics::sample(out, kDevices, metrics::labels({{"resource", resource->name()}, {"health", health}}), count);
    }
  }
  metrics::single(out, kRegistered, kubelet_.registered() ? "1" : "0");
  metrics::single(out, kPasses, kubelet_.passes());
  if (others_ != nullptr) others_->render_metrics(out);
  isolation_.render_metrics(out);
  return out;
}

}  // namespace gpuguard::deviceplugin

// NVML through dlopen: the plugin never links against the driver's library, so one binary runs on nodes
// with and without it. The few types used are declared here with NVML's documented layouts.
#include <dlfcn.h>

#include <mutex>
#include <thread>

#include "gpuguard/deviceplugin/discovery.hpp"

namespace gpuguard::deviceplugin {
namespace {

// NOLINTBEGIN(readability-identifier-naming): NVML's own names, as nvml.h declares them.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
using nvmlEventSet_t = struct nvmlEventSet_st*;
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;  // the XID for XidCriticalError events
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

// nvmlFieldValue_t, for nvmlDeviceGetFieldValues.
struct nvmlFieldValue_t {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;  // nvmlValueType_t
  nvmlReturn_t nvmlReturn;
  union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
  } value;
};

// NOLINTEND(readability-identifier-naming)

constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kTimeout = 10;
constexpr unsigned long long kXidCriticalError = 0x8;
constexpr unsigned kUuidBufferSize = 96;
constexpr unsigned kFieldGpuRecoveryAction = 230;  // NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
constexpr int kValueTypeUnsignedInt = 1;

class DlNvml final : public Nvml {
 public:
  explicit DlNvml(void* library) : library_(library) {}
  ~DlNvml() override {
    if (events_ != nullptr) event_set_free_(events_);
    if (initialised_) shutdown_();
    dlclose(library_);
  }

  // Resolves every symbol and initialises NVML; returns the reason on failure.
  std::string init() {
    if (!resolve(init_, "nvmlInit_v2") || !resolve(shutdown_, "nvmlShutdown") ||
        !resolve(error_string_, "nvmlErrorString") || !resolve(count_, "nvmlDeviceGetCount_v2") ||
        !resolve(by_index_, "nvmlDeviceGetHandleByIndex_v2") || !resolve(by_uuid_, "nvmlDeviceGetHandleByUUID") ||
        !resolve(uuid_, "nvmlDeviceGetUUID") || !resolve(minor_, "nvmlDeviceGetMinorNumber") ||
        !resolve(event_set_create_, "nvmlEventSetCreate") ||
        !resolve(supported_events_, "nvmlDeviceGetSupportedEventTypes") ||
        !resolve(register_events_, "nvmlDeviceRegisterEvents") || !resolve(event_wait_, "nvmlEventSetWait_v2") ||
        !resolve(event_set_free_, "nvmlEventSetFree")) {
      return "libnvidia-ml.so.1 lacks " + missing_;
    }
    // Drivers before the recovery-action field lack it too; health then has no recovery action to read.
    field_values_ = reinterpret_cast<decltype(field_values_)>(dlsym(library_, "nvmlDeviceGetFieldValues"));
    if (const nvmlReturn_t rc = init_(); rc != kSuccess) return std::string("nvmlInit_v2: ") + error_string_(rc);
    initialised_ = true;
    return {};
  }

  std::vector<Device> devices() override {
    unsigned count = 0;
    check(count_(&count), "nvmlDeviceGetCount_v2");
    std::vector<Device> devices;
    for (unsigned i = 0; i < count; ++i) {
      nvmlDevice_t handle = nullptr;
      check(by_index_(i, &handle), "nvmlDeviceGetHandleByIndex_v2");
      devices.push_back({uuid_of(handle), minor_of(handle)});
    }
    return devices;
  }

  std::optional<XidEvent> wait_for_xid(std::chrono::milliseconds timeout) override {
    if (!register_for_xids()) {
      std::this_thread::sleep_for(timeout);  // no events on this driver: the re-probe still runs
      return std::nullopt;
    }
    nvmlEventData_t data{};
    const nvmlReturn_t rc = event_wait_(events_, &data, static_cast<unsigned>(timeout.count()));
    if (rc == kTimeout) return std::nullopt;
    if (rc != kSuccess || data.eventType != kXidCriticalError) return std::nullopt;
    return XidEvent{data.device != nullptr ? uuid_of(data.device) : std::string{}, data.eventData};
  }

  bool responds(const std::string& uuid) override {
    nvmlDevice_t handle = nullptr;
    unsigned minor = 0;
    return by_uuid_(uuid.c_str(), &handle) == kSuccess && minor_(handle, &minor) == kSuccess;
  }

  std::optional<RecoveryAction> recovery_action(const std::string& uuid) override {
    nvmlDevice_t handle = nullptr;
    if (field_values_ == nullptr || by_uuid_(uuid.c_str(), &handle) != kSuccess) return std::nullopt;
    nvmlFieldValue_t field{};
    field.fieldId = kFieldGpuRecoveryAction;
    if (field_values_(handle, 1, &field) != kSuccess || field.nvmlReturn != kSuccess) return std::nullopt;
    const unsigned long long value = field.valueType == kValueTypeUnsignedInt ? field.value.uiVal : field.value.ullVal;
    switch (value) {
      case 0: return RecoveryAction::none;
      case 1: return RecoveryAction::gpu_reset;
      case 2: return RecoveryAction::node_reboot;
      case 3: return RecoveryAction::drain_p2p;
      case 4: return RecoveryAction::drain_and_reset;
      default: return RecoveryAction::other;
    }
  }

 private:
  template <typename Function>
  bool resolve(Function& function, const char* name) {
    function = reinterpret_cast<Function>(dlsym(library_, name));
    if (function == nullptr) missing_ = name;
    return function != nullptr;
  }

  void check(nvmlReturn_t rc, const char* call) {
    if (rc != kSuccess) throw Error(std::string(call) + ": " + error_string_(rc));
  }

  std::string uuid_of(nvmlDevice_t handle) {
    char buffer[kUuidBufferSize] = {};
    check(uuid_(handle, buffer, sizeof buffer), "nvmlDeviceGetUUID");
    return buffer;
  }

  unsigned minor_of(nvmlDevice_t handle) {
    unsigned minor = 0;
    check(minor_(handle, &minor), "nvmlDeviceGetMinorNumber");
    return minor;
  }

  // Every GPU that supports XID events joins one event set, created on first use.
  bool register_for_xids() {
    std::call_once(events_once_, [this] {
      if (event_set_create_(&events_) != kSuccess) {
        events_ = nullptr;
        return;
      }
      unsigned count = 0;
      if (count_(&count) != kSuccess) return;
      for (unsigned i = 0; i < count; ++i) {
        nvmlDevice_t handle = nullptr;
        unsigned long long supported = 0;
        if (by_index_(i, &handle) != kSuccess || supported_events_(handle, &supported) != kSuccess) continue;
        if ((supported & kXidCriticalError) != 0 && register_events_(handle, kXidCriticalError, events_) == kSuccess) {
          registered_ = true;
        }
      }
    });
    return events_ != nullptr && registered_;
  }

  void* library_;
  bool initialised_ = false;
  std::string missing_;
  std::once_flag events_once_;
  nvmlEventSet_t events_ = nullptr;
  bool registered_ = false;

  nvmlReturn_t (*init_)() = nullptr;
  nvmlReturn_t (*shutdown_)() = nullptr;
  const char* (*error_string_)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*count_)(unsigned*) = nullptr;
  nvmlReturn_t (*by_index_)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*by_uuid_)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*uuid_)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*minor_)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*event_set_create_)(nvmlEventSet_t*) = nullptr;
  nvmlReturn_t (*supported_events_)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*register_events_)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*event_wait_)(nvmlEventSet_t, nvmlEventData_t*, unsigned) = nullptr;
  nvmlReturn_t (*event_set_free_)(nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*field_values_)(nvmlDevice_t, int, nvmlFieldValue_t*) = nullptr;
};

}  // namespace

std::unique_ptr<Nvml> load_nvml(std::string& why_not) {
  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* reason = dlerror();
    why_not = reason != nullptr ? reason : "dlopen(libnvidia-ml.so.1) failed";
    return nullptr;
  }
  auto nvml = std::make_unique<DlNvml>(library);
  why_not = nvml->init();
  if (!why_not.empty()) return nullptr;
  return nvml;
}

}  // namespace gpuguard::deviceplugin

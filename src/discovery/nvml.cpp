// NVML through dlopen: the plugin never links against the driver's library, so one binary runs on nodes
// with and without it. The few types used are in nvml_abi.hpp, with NVML's documented layouts.
#include <dlfcn.h>

#include <cmath>
#include <mutex>
#include <thread>

#include "gpuguard/discovery/discovery.hpp"
#include "nvml_abi.hpp"

namespace gpuguard::discovery {

using namespace nvml;

namespace {

constexpr unsigned long long kMiB = 1024ULL * 1024;
constexpr unsigned long long kGiB = 1024 * kMiB;

}  // namespace

std::string mig_profile_suffix(unsigned gpu_instance_profile_index) {
  switch (gpu_instance_profile_index) {
    case 0x7:                     // 1_SLICE_REV1
    case 0x8: return "+me";       // 2_SLICE_REV1
    case 0xA:                     // 1_SLICE_GFX
    case 0xB:                     // 2_SLICE_GFX
    case 0xC: return "+gfx";      // 4_SLICE_GFX
    case 0xD:                     // 1_SLICE_NO_ME
    case 0xE: return "-me";       // 2_SLICE_NO_ME
    case 0xF:                     // 1_SLICE_ALL_ME
    case 0x10: return "+me.all";  // 2_SLICE_ALL_ME
    default: return "";
  }
}

std::string mig_profile_name(unsigned gpu_slices, unsigned compute_slices, unsigned long long memory_mib,
                             unsigned long long gpu_memory_bytes, std::string_view suffix) {
  // NVIDIA's rounding: the share of the GPU's memory, up to the next eighth, of the GPU's memory in GiB.
  unsigned long long gb = 0;
  if (gpu_memory_bytes != 0) {
    const double share =
        std::ceil(static_cast<double>(memory_mib * kMiB) / static_cast<double>(gpu_memory_bytes) * 8) / 8;
    const unsigned long long whole_gib = (gpu_memory_bytes + kGiB - 1) / kGiB;  // rounded up, as NVIDIA's
    const auto gpu_gib = static_cast<double>(whole_gib);
    gb = static_cast<unsigned long long>(std::llround(share * gpu_gib));
  }
  std::string name = compute_slices == gpu_slices ? "" : std::to_string(compute_slices) + "c.";
  name += std::to_string(gpu_slices) + "g." + std::to_string(gb) + "gb";
  name += suffix;
  return name;
}

namespace {

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
    // Drivers without MIG (before R450) lack these: their GPUs are listed without MIG devices.
    mig_ = resolve_optional(mig_mode_, "nvmlDeviceGetMigMode") &&
           resolve_optional(max_mig_, "nvmlDeviceGetMaxMigDeviceCount") &&
           resolve_optional(mig_by_index_, "nvmlDeviceGetMigDeviceHandleByIndex") &&
           resolve_optional(gi_id_, "nvmlDeviceGetGpuInstanceId") &&
           resolve_optional(ci_id_, "nvmlDeviceGetComputeInstanceId") &&
           resolve_optional(attributes_, "nvmlDeviceGetAttributes_v2") &&
           resolve_optional(memory_, "nvmlDeviceGetMemoryInfo");
    if (memory_ == nullptr) resolve_optional(memory_, "nvmlDeviceGetMemoryInfo");  // MPS's memory limits
    // For the profile's +me, +gfx, -me suffixes; without them the name has slices and memory only.
    profiles_ = resolve_optional(gi_by_id_, "nvmlDeviceGetGpuInstanceById") &&
                resolve_optional(gi_info_, "nvmlGpuInstanceGetInfo") &&
                resolve_optional(gi_profile_info_, "nvmlDeviceGetGpuInstanceProfileInfo");
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
      Device device{uuid_of(handle), minor_of(handle), false, {}, {}};
      if (nvmlMemory_t memory{}; memory_ != nullptr && memory_(handle, &memory) == kSuccess) {
        device.memory_bytes = memory.total;
      }
      unsigned current = 0, pending = 0;
      if (mig_ && mig_mode_(handle, &current, &pending) == kSuccess && current == kMigEnabled) {
        device.mig_enabled = true;
        device.mig_devices = mig_devices_of(handle);
      }
      devices.push_back(std::move(device));
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

  template <typename Function>
  bool resolve_optional(Function& function, const char* name) {
    function = reinterpret_cast<Function>(dlsym(library_, name));
    return function != nullptr;
  }

  std::vector<MigDevice> mig_devices_of(nvmlDevice_t gpu) {
    unsigned count = 0;
    check(max_mig_(gpu, &count), "nvmlDeviceGetMaxMigDeviceCount");
    nvmlMemory_t memory{};
    check(memory_(gpu, &memory), "nvmlDeviceGetMemoryInfo");
    std::vector<MigDevice> migs;
    for (unsigned i = 0; i < count; ++i) {
      nvmlDevice_t handle = nullptr;
      const nvmlReturn_t rc = mig_by_index_(gpu, i, &handle);
      if (rc == kNotFound || rc == kInvalidArgument) continue;  // no MIG device in this slot
      check(rc, "nvmlDeviceGetMigDeviceHandleByIndex");
      MigDevice mig;
      mig.uuid = uuid_of(handle);
      check(gi_id_(handle, &mig.gi), "nvmlDeviceGetGpuInstanceId");
      check(ci_id_(handle, &mig.ci), "nvmlDeviceGetComputeInstanceId");
      nvmlDeviceAttributes_t attributes{};
      check(attributes_(handle, &attributes), "nvmlDeviceGetAttributes_v2");
      mig.profile = mig_profile_name(attributes.gpuInstanceSliceCount, attributes.computeInstanceSliceCount,
                                     attributes.memorySizeMB, memory.total, suffix_of(gpu, mig.gi));
      migs.push_back(std::move(mig));
    }
    return migs;
  }

  // The GPU instance's profile, found by its ID among the GPU's profiles; "" when NVML cannot say.
  std::string suffix_of(nvmlDevice_t gpu, unsigned gi) {
    nvmlGpuInstance_t instance = nullptr;
    nvmlGpuInstanceInfo_t info{};
    if (!profiles_ || gi_by_id_(gpu, gi, &instance) != kSuccess || gi_info_(instance, &info) != kSuccess) return "";
    for (unsigned index = 0; index < kGpuInstanceProfileCount; ++index) {
      nvmlGpuInstanceProfileInfo_t profile{};
      if (gi_profile_info_(gpu, index, &profile) == kSuccess && profile.id == info.profileId) {
        return mig_profile_suffix(index);
      }
    }
    return "";
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
  bool mig_ = false, profiles_ = false;
  nvmlReturn_t (*mig_mode_)(nvmlDevice_t, unsigned*, unsigned*) = nullptr;
  nvmlReturn_t (*max_mig_)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*mig_by_index_)(nvmlDevice_t, unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*gi_id_)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*ci_id_)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*attributes_)(nvmlDevice_t, nvmlDeviceAttributes_t*) = nullptr;
  nvmlReturn_t (*memory_)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*gi_by_id_)(nvmlDevice_t, unsigned, nvmlGpuInstance_t*) = nullptr;
  nvmlReturn_t (*gi_info_)(nvmlGpuInstance_t, nvmlGpuInstanceInfo_t*) = nullptr;
  nvmlReturn_t (*gi_profile_info_)(nvmlDevice_t, unsigned, nvmlGpuInstanceProfileInfo_t*) = nullptr;
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

}  // namespace gpuguard::discovery

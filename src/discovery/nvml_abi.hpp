#pragma once
// The part of NVML's C ABI that gpuguard uses, with the layouts nvml.h gives them: the plugin's dlopen'ed
// NVML (nvml.cpp) and the test suite's stand-in libnvidia-ml.so.1 (tests/support/fake_nvml.cpp) share it,
// so that the stand-in is held to the same layouts.
// NOLINTBEGIN(readability-identifier-naming): NVML's own names.

namespace gpuguard::discovery::nvml {

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

using nvmlGpuInstance_t = struct nvmlGpuInstance_st*;
struct nvmlDeviceAttributes_t {
  unsigned int multiprocessorCount;
  unsigned int sharedCopyEngineCount;
  unsigned int sharedDecoderCount;
  unsigned int sharedEncoderCount;
  unsigned int sharedJpegCount;
  unsigned int sharedOfaCount;
  unsigned int gpuInstanceSliceCount;
  unsigned int computeInstanceSliceCount;
  unsigned long long memorySizeMB;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlGpuInstancePlacement_t {
  unsigned int start;
  unsigned int size;
};
struct nvmlGpuInstanceInfo_t {
  nvmlDevice_t device;
  unsigned int id;
  unsigned int profileId;
  nvmlGpuInstancePlacement_t placement;
};
struct nvmlGpuInstanceProfileInfo_t {
  unsigned int id;
  unsigned int isP2pSupported;
  unsigned int sliceCount;
  unsigned int instanceCount;
  unsigned int multiprocessorCount;
  unsigned int copyEngineCount;
  unsigned int decoderCount;
  unsigned int encoderCount;
  unsigned int jpegCount;
  unsigned int ofaCount;
  unsigned long long memorySizeMB;
};

inline constexpr nvmlReturn_t kSuccess = 0;
inline constexpr nvmlReturn_t kTimeout = 10;
inline constexpr unsigned long long kXidCriticalError = 0x8;
inline constexpr unsigned kUuidBufferSize = 96;
inline constexpr unsigned kFieldGpuRecoveryAction = 230;  // NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
inline constexpr int kValueTypeUnsignedInt = 1;
inline constexpr nvmlReturn_t kInvalidArgument = 2;
inline constexpr nvmlReturn_t kNotFound = 6;
inline constexpr unsigned kMigEnabled = 1;
// NVML_GPU_INSTANCE_PROFILE_1_SLICE (0) to NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME (0x10).
inline constexpr unsigned kGpuInstanceProfileCount = 0x11;

}  // namespace gpuguard::discovery::nvml

// NOLINTEND(readability-identifier-naming)

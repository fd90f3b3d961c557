// A stand-in libnvidia-ml.so.1, so that the real gpuguard-device-plugin binary goes through its own
// dlopen'ed NVML path (discovery, MIG devices and their profiles, XID events) on machines without a GPU,
// and so that NVIDIA's own device plugin and DRA driver (e2e/peers) run over the node's fake GPUs: their
// discovery (name, PCI info, compute capability, architecture, brand, the driver's and CUDA's versions,
// MIG profiles without placements), health events and preferred allocation (topology, NVLink).
// It serves the GPUs of the JSON file GPUGUARD_FAKE_NVML names:
//   {"gpus": [{"uuid": "GPU-…", "minor": 0, "memoryMiB": 81559, "name": "NVIDIA H100 80GB HBM3",
//              "mig": [{"uuid": "MIG-…", "gi": 1, "ci": 0, "profile": 0, "giSlices": 1, "ciSlices": 1,
//                       "memoryMiB": 9856}]}]}
// ("mig" present, even empty, means MIG mode; "profile" is the NVML_GPU_INSTANCE_PROFILE_* index), and
// delivers the XID events appended to <that file>.xids as "<uuid> <xid>" lines, each once. GPU minor m
// sits at PCI bus 0x10+m (0000:1m:00.0, as the e2e node's procfs has it), all on one NUMA node, without
// NVLink. Init and shutdown are counted as NVML counts them: callers nest them (NVIDIA's plugin does).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "discovery/nvml_abi.hpp"

using namespace gpuguard::discovery::nvml;

namespace {

constexpr nvmlReturn_t kUninitialized = 1;
constexpr nvmlReturn_t kNotSupported = 3;
constexpr nvmlReturn_t kInsufficientSize = 7;
constexpr nvmlReturn_t kDriverNotLoaded = 9;
constexpr unsigned kMaxMigDevices = 7;
constexpr unsigned kNoInstance = 0xFFFFFFFF;  // an event of the whole GPU, no MIG instance
constexpr int kTopologyNode = 40;             // NVML_TOPOLOGY_NODE: the same NUMA node
constexpr unsigned kPciBusBase = 0x10;
constexpr unsigned kH100PciDeviceId = 0x233010DE;
constexpr unsigned kH100PciSubsystemId = 0x16C110DE;
// As the e2e node's /proc/driver/nvidia/version says (e2e/node.go), and the CUDA version of that driver.
constexpr const char* kDriverVersion = "580.95.05";
constexpr int kCudaDriverVersion = 13000;
constexpr unsigned kArchitectureHopper = 9;  // NVML_DEVICE_ARCH_HOPPER
constexpr int kBrandNvidia = 14;             // NVML_BRAND_NVIDIA

// nvmlPciInfo_t as nvml.h lays it out (gpuguard itself reads PCI addresses from procfs, not NVML).
struct PciInfo {
  char bus_id_legacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pci_device_id;
  unsigned pci_subsystem_id;
  char bus_id[32];
};
static_assert(sizeof(PciInfo) == 68);
// The profile IDs NVML gives GPU instances are not their profile indexes: offset them so that a caller
// that confused the two would find no profile.
constexpr unsigned kProfileIdOffset = 100;

struct Mig {
  std::string uuid;
  unsigned gi = 0, ci = 0, profile = 0, gi_slices = 1, ci_slices = 1;
  unsigned long long memory_mib = 0;
};

struct Gpu {
  std::string uuid;
  unsigned minor = 0;
  unsigned long long memory_mib = 81559;
  std::string name = "NVIDIA H100 80GB HBM3";
  bool mig_mode = false;
  std::vector<Mig> migs;
};

// What an nvmlDevice_t points to: a GPU, or one of its MIG devices (mig >= 0); a GPU instance handle
// points to the MIG device of that instance.
struct Handle {
  std::size_t gpu = 0;
  int mig = -1;
};

struct State {
  std::mutex mutex;
  std::string events_path;
  std::vector<Gpu> gpus;
  std::deque<Handle> handles;  // stable addresses: handed out as pointers
  std::string loaded;          // the JSON the GPUs were read from
  unsigned references = 0;     // nvmlInit_v2 calls not yet shut down
};

State& state() {
  static State s;
  return s;
}

Handle* handle_for(std::size_t gpu, int mig) {
  State& s = state();
  for (Handle& h : s.handles) {
    if (h.gpu == gpu && h.mig == mig) return &h;
  }
  s.handles.push_back({gpu, mig});
  return &s.handles.back();
}

nvmlDevice_t as_device(Handle* h) { return reinterpret_cast<nvmlDevice_t>(h); }
Handle* as_handle(void* p) { return static_cast<Handle*>(p); }

const Gpu& gpu_of(nvmlDevice_t device) { return state().gpus.at(as_handle(device)->gpu); }
const Mig* mig_of(nvmlDevice_t device) {
  const Handle* h = as_handle(device);
  return h->mig < 0 ? nullptr : &state().gpus.at(h->gpu).migs.at(static_cast<std::size_t>(h->mig));
}

bool load() {
  const char* path = std::getenv("GPUGUARD_FAKE_NVML");
  if (path == nullptr) return false;
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  State& s = state();
  // Unchanged, the GPUs stay as they are: a nested init must not rebuild what other threads read.
  if (!s.gpus.empty() && text == s.loaded) return true;
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, false);
  if (!config.is_object()) return false;
  s.loaded = text;
  s.events_path = std::string(path) + ".xids";
  s.gpus.clear();
  for (const auto& g : config.value("gpus", nlohmann::json::array())) {
    Gpu gpu{g.value("uuid", ""),
            g.value("minor", 0U),
            g.value("memoryMiB", 81559ULL),
            g.value("name", std::string("NVIDIA H100 80GB HBM3")),
            g.contains("mig"),
            {}};
    for (const auto& m : g.value("mig", nlohmann::json::array())) {
      gpu.migs.push_back({m.value("uuid", ""), m.value("gi", 0U), m.value("ci", 0U), m.value("profile", 0U),
                          m.value("giSlices", 1U), m.value("ciSlices", 1U), m.value("memoryMiB", 0ULL)});
    }
    s.gpus.push_back(std::move(gpu));
  }
  return true;
}

// The first "<uuid> <xid>" line of the events file, removed from it.
bool next_event(std::string& uuid, unsigned long long& xid) {
  State& s = state();
  std::ifstream in(s.events_path);
  if (!in) return false;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  in.close();
  if (lines.empty()) return false;
  std::istringstream(lines.front()) >> uuid >> xid;
  std::ofstream out(s.events_path, std::ios::trunc);
  for (std::size_t i = 1; i < lines.size(); ++i) out << lines[i] << "\n";
  return true;
}

nvmlReturn_t copy_string(const std::string& value, char* buffer, unsigned length) {
  if (value.size() + 1 > length) return kInsufficientSize;
  std::memcpy(buffer, value.c_str(), value.size() + 1);
  return kSuccess;
}

}  // namespace

// NOLINTBEGIN(readability-identifier-naming): NVML's own function names.
extern "C" {

nvmlReturn_t nvmlInit_v2() {
  std::lock_guard lock(state().mutex);
  if (!load()) return kDriverNotLoaded;
  ++state().references;
  return kSuccess;
}

nvmlReturn_t nvmlInitWithFlags(unsigned /*flags*/) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown() {
  std::lock_guard lock(state().mutex);
  if (state().references == 0) return kUninitialized;
  --state().references;
  return kSuccess;
}

const char* nvmlErrorString(nvmlReturn_t result) {
  static thread_local std::string text;
  text = "fake NVML error " + std::to_string(result);
  return text.c_str();
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* count) {
  std::lock_guard lock(state().mutex);
  if (state().references == 0) return kUninitialized;
  *count = static_cast<unsigned>(state().gpus.size());
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* device) {
  std::lock_guard lock(state().mutex);
  if (index >= state().gpus.size()) return kInvalidArgument;
  *device = as_device(handle_for(index, -1));
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  std::lock_guard lock(state().mutex);
  const auto& gpus = state().gpus;
  for (std::size_t g = 0; g < gpus.size(); ++g) {
    if (gpus[g].uuid == uuid) {
      *device = as_device(handle_for(g, -1));
      return kSuccess;
    }
    for (std::size_t m = 0; m < gpus[g].migs.size(); ++m) {
      if (gpus[g].migs[m].uuid == uuid) {
        *device = as_device(handle_for(g, static_cast<int>(m)));
        return kSuccess;
      }
    }
  }
  return kNotFound;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned length) {
  const Mig* mig = mig_of(device);
  return copy_string(mig != nullptr ? mig->uuid : gpu_of(device).uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned* minor) {
  if (mig_of(device) != nullptr) return kNotSupported;
  *minor = gpu_of(device).minor;
  return kSuccess;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  static int token = 0;
  *set = reinterpret_cast<nvmlEventSet_t>(&token);
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t, unsigned long long* types) {
  *types = kXidCriticalError;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t, unsigned long long, nvmlEventSet_t) { return kSuccess; }

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t, nvmlEventData_t* data, unsigned timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    std::string uuid;
    unsigned long long xid = 0;
    bool found = false;
    {
      std::lock_guard lock(state().mutex);
      found = next_event(uuid, xid);
    }
    if (found) {
      nvmlDevice_t device = nullptr;
      *data = {};
      if (nvmlDeviceGetHandleByUUID(uuid.c_str(), &device) == kSuccess) data->device = device;
      data->eventType = kXidCriticalError;
      data->eventData = xid;
      data->gpuInstanceId = data->computeInstanceId = kNoInstance;
      return kSuccess;
    }
    if (std::chrono::steady_clock::now() >= deadline) return kTimeout;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t) { return kSuccess; }

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t, int count, nvmlFieldValue_t* values) {
  for (int i = 0; i < count; ++i) values[i].nvmlReturn = kNotSupported;  // no recovery action reported
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned* current, unsigned* pending) {
  *current = *pending = gpu_of(device).mig_mode ? kMigEnabled : 0;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t, unsigned* count) {
  *count = kMaxMigDevices;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned index, nvmlDevice_t* mig) {
  std::lock_guard lock(state().mutex);
  const Handle* gpu = as_handle(device);
  if (index >= state().gpus.at(gpu->gpu).migs.size()) return kNotFound;
  *mig = as_device(handle_for(gpu->gpu, static_cast<int>(index)));
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned* id) {
  const Mig* mig = mig_of(device);
  if (mig == nullptr) return kInvalidArgument;
  *id = mig->gi;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned* id) {
  const Mig* mig = mig_of(device);
  if (mig == nullptr) return kInvalidArgument;
  *id = mig->ci;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t* attributes) {
  const Mig* mig = mig_of(device);
  if (mig == nullptr) return kNotSupported;
  *attributes = {};
  attributes->gpuInstanceSliceCount = mig->gi_slices;
  attributes->computeInstanceSliceCount = mig->ci_slices;
  attributes->memorySizeMB = mig->memory_mib;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned length) {
  return copy_string(gpu_of(device).name, name, length);
}

// A MIG device's is its GPU's.
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, PciInfo* pci) {
  const unsigned bus = kPciBusBase + gpu_of(device).minor;
  *pci = {};
  std::snprintf(pci->bus_id_legacy, sizeof pci->bus_id_legacy, "0000:%02x:00.0", bus);
  std::snprintf(pci->bus_id, sizeof pci->bus_id, "00000000:%02x:00.0", bus);
  pci->bus = bus;
  pci->pci_device_id = kH100PciDeviceId;
  pci->pci_subsystem_id = kH100PciSubsystemId;
  return kSuccess;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned length) {
  return copy_string(kDriverVersion, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* version) {
  *version = kCudaDriverVersion;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t, unsigned* architecture) {
  *architecture = kArchitectureHopper;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t, int* brand) {
  *brand = kBrandNvidia;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned* is_mig) {
  *is_mig = mig_of(device) != nullptr ? 1 : 0;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned* index) {
  *index = static_cast<unsigned>(as_handle(device)->gpu);
  return kSuccess;
}

// No placement for any profile: the GPUs are served whole (MIG is made with "mig" in the JSON instead).
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t, unsigned, void*, unsigned* count) {
  *count = 0;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t, int* major, int* minor) {
  *major = 9;  // Hopper
  *minor = 0;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t, nvmlDevice_t, int* level) {
  *level = kTopologyNode;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t, unsigned, int*) { return kNotSupported; }

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t, unsigned, PciInfo*) { return kNotSupported; }

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  *memory = {};
  memory->total = gpu_of(device).memory_mib * 1024 * 1024;
  memory->free = memory->total;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned id, nvmlGpuInstance_t* instance) {
  std::lock_guard lock(state().mutex);
  const Handle* gpu = as_handle(device);
  const auto& migs = state().gpus.at(gpu->gpu).migs;
  for (std::size_t m = 0; m < migs.size(); ++m) {
    if (migs[m].gi == id) {
      *instance = reinterpret_cast<nvmlGpuInstance_t>(handle_for(gpu->gpu, static_cast<int>(m)));
      return kSuccess;
    }
  }
  return kNotFound;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t instance, nvmlGpuInstanceInfo_t* info) {
  const nvmlDevice_t device = reinterpret_cast<nvmlDevice_t>(instance);
  const Mig* mig = mig_of(device);
  *info = {};
  info->id = mig->gi;
  info->profileId = kProfileIdOffset + mig->profile;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t, unsigned profile, nvmlGpuInstanceProfileInfo_t* info) {
  if (profile >= kGpuInstanceProfileCount) return kInvalidArgument;
  *info = {};
  info->id = kProfileIdOffset + profile;
  return kSuccess;
}

}  // extern "C"
// NOLINTEND(readability-identifier-naming)

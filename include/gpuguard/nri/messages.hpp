#pragma once
// ttrpc's and NRI's messages read in place (proto_reader.hpp): the envelope of a call, and the fields of
// NRI's messages by their numbers in NRI's api.proto (v0.12.3). The plugin dispatches on these and hands the
// requests on as their bytes, so that a 4 MiB request is held once and read once.
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

namespace gpuguard::nri {

// ttrpc's Request: {1 service, 2 method, 3 payload, 4 timeout_nano, 5 metadata} (field::kRequest*).
struct RequestEnvelope {
  std::string_view service, method, payload;
};
// nullopt when the bytes are not such a message.
std::optional<RequestEnvelope> read_request(std::string_view bytes);

// NRI's and ttrpc's field numbers, where the plugin or the node enforcer reads them. Each is held to the
// descriptors NRI's and ttrpc's Go modules were generated from (tests/nri/field_numbers_test.cpp).
namespace field {
inline constexpr std::uint32_t kRequestService = 1, kRequestMethod = 2, kRequestPayload = 3;  // ttrpc's Request
inline constexpr std::uint32_t kCreatePod = 1, kCreateContainer = 2;  // Create/Start/RemoveContainerRequest
inline constexpr std::uint32_t kValidatePod = 1, kValidateContainer = 2, kValidateAdjust = 3;
inline constexpr std::uint32_t kSyncPods = 1, kSyncContainers = 2, kSyncMore = 3;    // SynchronizeRequest
inline constexpr std::uint32_t kStateEvent = 1, kStatePod = 2, kStateContainer = 3;  // StateChangeEvent
inline constexpr std::uint32_t kPodId = 1, kPodName = 2, kPodUid = 3, kPodNamespace = 4, kPodLabels = 5,
                               kPodAnnotations = 6, kPodRuntimeHandler = 7;
inline constexpr std::uint32_t kContainerId = 1, kContainerSandboxId = 2, kContainerName = 3, kContainerAnnotations = 6,
                               kContainerEnv = 8, kContainerMounts = 9, kContainerLinux = 11, kContainerPid = 12,
                               kContainerCdiDevices = 20;
inline constexpr std::uint32_t kMountDestination = 1, kMountType = 2, kMountSource = 3, kMountOptions = 4;
inline constexpr std::uint32_t kLinuxDevices = 2, kLinuxResources = 3;  // LinuxContainer
inline constexpr std::uint32_t kResourcesDevices = 7;                   // LinuxResources
inline constexpr std::uint32_t kDevicePath = 1, kDeviceType = 2, kDeviceMajor = 3, kDeviceMinor = 4;
inline constexpr std::uint32_t kCgroupAllow = 1, kCgroupType = 2, kCgroupMajor = 3, kCgroupMinor = 4;
inline constexpr std::uint32_t kCdiDeviceName = 1;
inline constexpr std::uint32_t kOptionalValue = 1;          // OptionalInt64, OptionalString, ...
inline constexpr std::uint32_t kMapKey = 1, kMapValue = 2;  // a map entry, as protobuf writes maps
// ContainerAdjustment, in a ValidateContainerAdjustmentRequest.
inline constexpr std::uint32_t kAdjustAnnotations = 2, kAdjustMounts = 3, kAdjustEnv = 4, kAdjustLinux = 6,
                               kAdjustCdiDevices = 8;
inline constexpr std::uint32_t kAdjustLinuxDevices = 1, kAdjustLinuxResources = 2;  // LinuxContainerAdjustment
inline constexpr std::uint32_t kKeyValueKey = 1, kKeyValueValue = 2;
}  // namespace field

// Calls `visit` with the value of every occurrence of field `number` in `message`, in order: the bytes of a
// length-delimited one, nothing for others (they are skipped). protobuf merges an embedded message written
// twice, and appends repeated fields, so visiting every occurrence reads what a full parser would. Returns
// false when the message is malformed (what was visited before stays visited).
bool for_each_field(std::string_view message, std::uint32_t number, const std::function<void(std::string_view)>& visit);
// The last occurrence of a string (or bytes) field, as protobuf keeps the last of a scalar; empty if none.
std::string_view string_field(std::string_view message, std::uint32_t number);
// The last occurrence of a varint field (bool, int32, int64, enum), or nullopt if none.
std::optional<std::uint64_t> varint_field(std::string_view message, std::uint32_t number);
// Whether the message reads through to its end.
bool well_formed(std::string_view message);

}  // namespace gpuguard::nri

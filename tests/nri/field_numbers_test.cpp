// The enforcer reads NRI's and ttrpc's messages by hand-kept field numbers (gpuguard/nri/messages.hpp), and
// writes its answers through proto/'s trimmed copy of NRI's api.proto. Both are held here to the descriptors
// NRI's and ttrpc's Go modules, as e2e/go.mod pins them, were generated from (e2e/cmd/proto-descriptors), so
// that neither copy can drift from the wire the runtime speaks.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

#include "gpuguard/nri/messages.hpp"
#include "gpuguard/nri/plugin.hpp"
#include "nri/v1alpha1/api.pb.h"
#include "ttrpc/ttrpc.pb.h"

namespace {

namespace field = gpuguard::nri::field;
using google::protobuf::Descriptor;
using google::protobuf::DescriptorPool;
using google::protobuf::FieldDescriptor;

// The upstream descriptors, built into a pool of their own.
const DescriptorPool& upstream() {
  static const auto* pool = [] {
    std::ifstream in(GPUGUARD_PROTO_DESCRIPTORS, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    google::protobuf::FileDescriptorSet set;
    REQUIRE(set.ParseFromString(bytes.str()));
    auto* built = new DescriptorPool;  // kept for the whole run, as the generated pool is
    for (const auto& file : set.file()) REQUIRE(built->BuildFile(file) != nullptr);
    return built;
  }();
  return *pool;
}

const Descriptor* message(const std::string& name) {
  const std::string full = name.find('.') == std::string::npos ? "nri.pkg.api.v1alpha1." + name : name;
  const Descriptor* found = upstream().FindMessageTypeByName(full);
  INFO(full);
  REQUIRE(found != nullptr);
  return found;
}

int number(const std::string& message_name, const std::string& field_name) {
  const FieldDescriptor* found = message(message_name)->FindFieldByName(field_name);
  INFO(message_name << "." << field_name);
  REQUIRE(found != nullptr);
  return found->number();
}

struct Row {
  const char* message;
  const char* field;
  std::uint32_t kept;
};

}  // namespace

TEST_CASE("nri field numbers: every number the enforcer reads by is upstream's, for that message and field") {
  const Row rows[] = {
      {"ttrpc.Request", "service", field::kRequestService},
      {"ttrpc.Request", "method", field::kRequestMethod},
      {"ttrpc.Request", "payload", field::kRequestPayload},
      {"CreateContainerRequest", "pod", field::kCreatePod},
      {"CreateContainerRequest", "container", field::kCreateContainer},
      {"RemoveContainerRequest", "pod", field::kCreatePod},  // the plugin reads a removal as a create
      {"RemoveContainerRequest", "container", field::kCreateContainer},
      {"RunPodSandboxRequest", "pod", field::kCreatePod},
      {"RemovePodSandboxRequest", "pod", field::kCreatePod},
      {"ValidateContainerAdjustmentRequest", "pod", field::kValidatePod},
      {"ValidateContainerAdjustmentRequest", "container", field::kValidateContainer},
      {"ValidateContainerAdjustmentRequest", "adjust", field::kValidateAdjust},
      {"SynchronizeRequest", "pods", field::kSyncPods},
      {"SynchronizeRequest", "containers", field::kSyncContainers},
      {"SynchronizeRequest", "more", field::kSyncMore},
      {"StateChangeEvent", "event", field::kStateEvent},
      {"StateChangeEvent", "pod", field::kStatePod},
      {"StateChangeEvent", "container", field::kStateContainer},
      {"PodSandbox", "id", field::kPodId},
      {"PodSandbox", "name", field::kPodName},
      {"PodSandbox", "uid", field::kPodUid},
      {"PodSandbox", "namespace", field::kPodNamespace},
      {"PodSandbox", "labels", field::kPodLabels},
      {"PodSandbox", "annotations", field::kPodAnnotations},
      {"PodSandbox", "runtime_handler", field::kPodRuntimeHandler},
      {"Container", "id", field::kContainerId},
      {"Container", "pod_sandbox_id", field::kContainerSandboxId},
      {"Container", "name", field::kContainerName},
      {"Container", "annotations", field::kContainerAnnotations},
      {"Container", "env", field::kContainerEnv},
      {"Container", "mounts", field::kContainerMounts},
      {"Container", "pid", field::kContainerPid},
      {"StartContainerRequest", "pod", field::kCreatePod},
      {"StartContainerRequest", "container", field::kCreateContainer},
      {"Container", "linux", field::kContainerLinux},
      {"Container", "CDI_devices", field::kContainerCdiDevices},
      {"Mount", "destination", field::kMountDestination},
      {"Mount", "type", field::kMountType},
      {"Mount", "source", field::kMountSource},
      {"Mount", "options", field::kMountOptions},
      {"LinuxContainer", "devices", field::kLinuxDevices},
      {"LinuxContainer", "resources", field::kLinuxResources},
      {"LinuxResources", "devices", field::kResourcesDevices},
      {"LinuxDevice", "path", field::kDevicePath},
      {"LinuxDevice", "type", field::kDeviceType},
      {"LinuxDevice", "major", field::kDeviceMajor},
      {"LinuxDevice", "minor", field::kDeviceMinor},
      {"LinuxDeviceCgroup", "allow", field::kCgroupAllow},
      {"LinuxDeviceCgroup", "type", field::kCgroupType},
      {"LinuxDeviceCgroup", "major", field::kCgroupMajor},
      {"LinuxDeviceCgroup", "minor", field::kCgroupMinor},
      {"OptionalInt64", "value", field::kOptionalValue},
      {"CDIDevice", "name", field::kCdiDeviceName},
      {"ContainerAdjustment", "annotations", field::kAdjustAnnotations},
      {"ContainerAdjustment", "mounts", field::kAdjustMounts},
      {"ContainerAdjustment", "env", field::kAdjustEnv},
      {"ContainerAdjustment", "linux", field::kAdjustLinux},
      {"ContainerAdjustment", "CDI_devices", field::kAdjustCdiDevices},
      {"LinuxContainerAdjustment", "devices", field::kAdjustLinuxDevices},
      {"LinuxContainerAdjustment", "resources", field::kAdjustLinuxResources},
      {"KeyValue", "key", field::kKeyValueKey},
      {"KeyValue", "value", field::kKeyValueValue},
  };
  for (const Row& row : rows) {
    INFO(row.message << "." << row.field);
    CHECK(number(row.message, row.field) == static_cast<int>(row.kept));
  }
  // Maps are read as protobuf writes them: entries of {key, value}.
  for (const auto& [name, map] :
       {std::pair{"PodSandbox", "labels"}, std::pair{"PodSandbox", "annotations"},
        std::pair{"Container", "annotations"}, std::pair{"ContainerAdjustment", "annotations"}}) {
    const FieldDescriptor* entries = message(name)->FindFieldByName(map);
    REQUIRE(entries->is_map());
    CHECK(entries->message_type()->map_key()->number() == static_cast<int>(field::kMapKey));
    CHECK(entries->message_type()->map_value()->number() == static_cast<int>(field::kMapValue));
  }
}

TEST_CASE(
    "nri field numbers: the events the plugin subscribes to, and the services and methods it serves, are "
    "upstream's") {
  const auto* events = upstream().FindEnumTypeByName("nri.pkg.api.v1alpha1.Event");
  REQUIRE(events != nullptr);
  CHECK(events->FindValueByName("RUN_POD_SANDBOX")->number() == gpuguard::nri::kRunPodSandboxEvent);
  CHECK(events->FindValueByName("REMOVE_POD_SANDBOX")->number() == gpuguard::nri::kRemovePodSandboxEvent);
  CHECK(events->FindValueByName("CREATE_CONTAINER")->number() == gpuguard::nri::kCreateContainerEvent);
  CHECK(events->FindValueByName("REMOVE_CONTAINER")->number() == gpuguard::nri::kRemoveContainerEvent);
  CHECK(events->FindValueByName("START_CONTAINER")->number() == gpuguard::nri::kStartContainerEvent);
  CHECK(events->FindValueByName("VALIDATE_CONTAINER_ADJUSTMENT")->number() ==
        gpuguard::nri::kValidateContainerAdjustmentEvent);

  const auto* runtime = upstream().FindServiceByName("nri.pkg.api.v1alpha1.Runtime");
  REQUIRE(runtime != nullptr);
  CHECK(runtime->FindMethodByName("RegisterPlugin") != nullptr);
  const auto* plugin = upstream().FindServiceByName("nri.pkg.api.v1alpha1.Plugin");
  REQUIRE(plugin != nullptr);
  for (const char* method :
       {"Configure", "Synchronize", "CreateContainer", "ValidateContainerAdjustment", "StartContainer",
        "RemoveContainer", "RunPodSandbox", "RemovePodSandbox", "StateChange", "Shutdown"}) {
    INFO(method);
    CHECK(plugin->FindMethodByName(method) != nullptr);
  }
}

TEST_CASE("nri field numbers: every field of proto/'s trimmed copy is upstream's field of that name and number") {
  std::size_t fields = 0;
  for (const auto* file :
       {nri::pkg::api::v1alpha1::Container::descriptor()->file(), ttrpc::Request::descriptor()->file()}) {
    for (int m = 0; m < file->message_type_count(); ++m) {
      const Descriptor* ours = file->message_type(m);
      // proto/ttrpc's Status stands in for google.rpc.Status, which ttrpc's Response carries.
      const std::string name = ours->full_name() == "ttrpc.Status" ? "google.rpc.Status" : ours->full_name();
      const Descriptor* theirs = upstream().FindMessageTypeByName(name);
      INFO(name);
      REQUIRE(theirs != nullptr);
      for (int f = 0; f < ours->field_count(); ++f) {
        const FieldDescriptor* mine = ours->field(f);
        const FieldDescriptor* same = theirs->FindFieldByName(mine->name());
        INFO(mine->full_name());
        REQUIRE(same != nullptr);
        CHECK(same->number() == mine->number());
        CHECK(same->is_repeated() == mine->is_repeated());
        // Wire-compatible where they differ: proto/ reads two of upstream's enums as int32.
        const bool enum_as_int =
            same->type() == FieldDescriptor::TYPE_ENUM && mine->type() == FieldDescriptor::TYPE_INT32;
        CHECK((same->type() == mine->type() || enum_as_int));
        ++fields;
      }
    }
  }
  CHECK(fields >= 70);  // proto/ holds about 75: a file that stopped being read would pass with none
}

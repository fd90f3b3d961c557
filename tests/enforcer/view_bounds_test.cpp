// What a container's view holds, whatever the runtime sends (include/gpuguard/nri/container_view.hpp): the
// largest request ttrpc carries, made of what an attacker can put in a pod (a mount path of a megabyte,
// variables of 64 KiB, thousands of mounts, devices and CDI names), is read into a view of at most
// view_bytes_max(), which names what it did not read; and no such view is ever judged "within".
#include <catch2/catch.hpp>

#include "gpuguard/enforcement/decision.hpp"
#include "gpuguard/nri/container_view.hpp"
#include "nri/v1alpha1/api.pb.h"

using namespace gpuguard;
namespace api = ::nri::pkg::api::v1alpha1;

namespace {

enforcement::NodeView node() {
  enforcement::NodeView node;
  node.gpus = {{"GPU-11111111-1111-4111-8111-111111111111", 0, "0000:10:00.0", {}}};
  node.toolkit.mode = "auto";
  node.toolkit.version = enforcement::ToolkitVersion{1, 20, 1};
  return node;
}

}  // namespace

TEST_CASE("enforcer: a view holds at most its fixed bound, and names what it did not read, whatever the request") {
  // The bound itself: a view costs at most a few hundred KiB, whatever a request of 4 MiB holds.
  CHECK(enforcement::view_bytes_max() < std::size_t{320} << 10);
  api::Container c;
  c.set_id("c");
  c.set_name("app");
  const std::string big(64 << 10, '1');
  for (int i = 0; i < 8; ++i) c.add_env("NVIDIA_VISIBLE_DEVICES=" + big);
  c.add_env("NVIDIA_IMEX_CHANNELS=" + big);
  // A mount path of a megabyte under the device list root, and more mounts that may reach a GPU than kept.
  auto* huge = c.add_mounts();
  huge->set_destination(std::string("/var/run/nvidia-container-devices/").append(std::string(1 << 20, 'x')));
  huge->set_source("/dev/null");
  huge->set_type("bind");
  for (int i = 0; i < 200; ++i) {
    auto* mount = c.add_mounts();
    mount->set_destination(std::string("/var/run/nvidia-container-devices/").append(std::string(3000, 'a')) +
                           std::to_string(i));
    mount->set_source("/dev/nvidia0");
    mount->add_options("rbind");
  }
  for (int i = 0; i < 2000; ++i) {
    auto* device = c.mutable_linux()->add_devices();
    device->set_path(std::string("/dev/nvidia").append(std::string(200, '9')));
    device->set_major(195);
    device->set_minor(1);
  }
  for (int i = 0; i < 2000; ++i)
    c.add_cdi_devices()->set_name(std::string("nvidia.com/gpu=").append(std::string(240, 'z')));
  (*c.mutable_annotations())["cdi.k8s.io/many"] = std::string(20000, ',');
  const std::string bytes = c.SerializeAsString();
  REQUIRE(bytes.size() > std::size_t{3} << 20);
  std::size_t followed = 0;
  const auto view = gpuguard::nri::container_view(bytes, node(), [&followed](std::string_view source) {
    ++followed;
    return gpuguard::nri::as_written(source);
  });
  REQUIRE(view);
  CHECK(enforcement::view_bytes(*view) <= enforcement::view_bytes_max());
  // Over the size the decision refuses whatever it reaches: its mounts are not even followed.
  CHECK(followed == 0);
  CHECK(view->mounts.empty());
  CHECK(view->devices.size() == enforcement::kListMax);
  CHECK(view->cdi_devices.size() == enforcement::kListMax);
  CHECK(view->cdi_annotation_names.size() == enforcement::kListMax);
  CHECK(view->selections.at("NVIDIA_VISIBLE_DEVICES").last_over);
  CHECK(view->selections.at("NVIDIA_VISIBLE_DEVICES").last.empty());
  CHECK(view->selections.at("NVIDIA_VISIBLE_DEVICES").entries == 8);
  REQUIRE(view->unread_count > 0);
  std::string unread;
  for (const std::string& line : view->unread) unread += line + "\n";
  CHECK_THAT(unread, Catch::Contains("more CDI names in annotations than 64"));
  // What was not read cannot be judged: refused, never let through.
  enforcement::Allocation allocation;
  allocation.source = enforcement::Allocation::Source::pod_resources;
  const auto decision = enforcement::decide(*view, allocation, node(), policy::Policy{});
  CHECK(decision.action == enforcement::Decision::Action::refuse);
  CHECK(decision.message.size() <= enforcement::kMessageMax);
}

TEST_CASE("enforcer: a container's mounts are followed up to a bound, and one past it cannot be judged") {
  api::Container c;
  c.set_id("c");
  c.set_name("app");
  // A path over PATH_MAX under the device list root, more mounts that may reach a GPU than kept, and
  // thousands of binds of one hostPath: what fits under the size the decision takes.
  auto* long_path = c.add_mounts();
  long_path->set_destination(std::string("/var/run/nvidia-container-devices/").append(std::string(5000, 'x')));
  long_path->set_source("/dev/null");
  long_path->set_type("bind");
  for (int i = 0; i < 100; ++i) {
    auto* mount = c.add_mounts();
    mount->set_destination(std::string("/var/run/nvidia-container-devices/").append(std::string(3000, 'a')) +
                           std::to_string(i));
    mount->set_source("/dev/nvidia0");
    mount->add_options("rbind");
  }
  for (int i = 0; i < 5000; ++i) {
    auto* mount = c.add_mounts();
    mount->set_destination("/a" + std::to_string(i));
    mount->set_source("/etc/containerd");
    mount->set_type("bind");
  }
  const std::string bytes = c.SerializeAsString();
  REQUIRE(bytes.size() <= enforcement::kNriContainerBytesMax);
  std::size_t followed = 0;
  const auto view = gpuguard::nri::container_view(bytes, node(), [&followed](std::string_view source) {
    ++followed;
    return gpuguard::nri::as_written(source);
  });
  REQUIRE(view);
  CHECK(followed == 1024);  // container_view.cpp's kBindMountsFollowedMax; the long path is not followed
  CHECK(view->mounts.size() == enforcement::kMountsMax);
  std::string unread;
  for (const std::string& line : view->unread) unread += line + "\n";
  CHECK_THAT(unread, Catch::Contains("longer than PATH_MAX (5034 bytes)"));
  CHECK_THAT(unread, Catch::Contains("more mounts that may reach a GPU than 16"));
  CHECK_THAT(unread, Catch::Contains("more bind mounts than 1024"));
  enforcement::Allocation allocation;
  allocation.source = enforcement::Allocation::Source::pod_resources;
  allocation.gpus = {"GPU-11111111-1111-4111-8111-111111111111"};
  const auto decision = enforcement::decide(*view, allocation, node(), policy::Policy{});
  CHECK(decision.action == enforcement::Decision::Action::refuse);
}

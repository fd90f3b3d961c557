#pragma once
// The kubelet's pod-resources answer (a ListPodResourcesResponse, or a GetPodResourcesResponse, which has
// the same field 1) read as a stream from the chunks gRPC received it in, never joined: each pod's name
// and namespace are read first, a pod not wanted is skipped unread, and a wanted one is decoded alone, into
// at most kPodKeptMax bytes. So the enforcer holds nothing in proportion to the node's pods but the bytes
// gRPC holds (at most its receive limit), and a pod too large to keep is an answer that cannot be judged,
// not a larger allocation. Pure: bytes in, pods out (tests/enforcer/pod_resources_reader_test.cpp,
// fuzz/nri_fuzz.cpp, which reads it too).
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/enforcer/ports.hpp"

namespace gpuguard::enforcer {

// What one wanted pod may keep: container names, device IDs and CDI names together.
inline constexpr std::size_t kPodKeptMax = std::size_t{64} << 10;
// One container's entry is read whole: at most this long.
inline constexpr std::size_t kContainerEntryMax = std::size_t{64} << 10;

// Reads the answer; returns why it is malformed, or "". A wanted pod over the bounds above is taken with
// PodResources::unreadable saying so.
std::string read_pod_resources(const std::vector<std::string_view>& chunks, const PodResourcesSource::Wanted& wanted,
                               const PodResourcesSource::Take& take);

}  // namespace gpuguard::enforcer

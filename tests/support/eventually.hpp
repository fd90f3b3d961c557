#pragma once
// Waiting for evidence with a bound: the one way tests wait for something another process does.
#include <chrono>
#include <functional>

namespace gpuguard::test {

// Polls `condition` every `every` until it holds or `limit` passes; its last answer.
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit = std::chrono::seconds(10),
                std::chrono::milliseconds every = std::chrono::milliseconds(20));

}  // namespace gpuguard::test

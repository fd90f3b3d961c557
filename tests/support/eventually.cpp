// Waiting with a bound (eventually.hpp says why).
#include "eventually.hpp"

#include <thread>

namespace gpuguard::test {

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit,
                std::chrono::milliseconds every) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(every);
  }
  return condition();
}

}  // namespace gpuguard::test

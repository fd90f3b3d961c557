// libFuzzer target: the node enforcer's property (tests/enforcer/property.hpp) with the fuzzer choosing the
// container, the node, the toolkit and the allocation, byte by byte: whatever it makes up, the enforcer
// refuses it, or every toolkit the node may run (tests/enforcer/toolkit_model.hpp) gives it only what it
// was allocated once the enforcer's adjustment is applied as NRI's generator applies it. The unit test
// draws 40,000 cases from a seeded generator; here coverage steers the draws.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "property.hpp"

namespace {

class Bytes final : public gpuguard::test::property::Choices {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  // Each choice takes a byte (two where n is over 256); past the end every choice is the first.
  std::size_t pick(std::size_t n) override {
    std::size_t value = next();
    if (n > 256) value = value << 8 | next();
    return value % n;
  }

 private:
  std::size_t next() { return at_ < size_ ? data_[at_++] : 0; }
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes choices(data, size);
  const gpuguard::test::property::Case made = gpuguard::test::property::generate(choices);
  if (const auto counterexample = gpuguard::test::property::check(made)) {
    std::fprintf(stderr, "property violated:\n%s\n", counterexample->c_str());
    std::abort();
  }
  return 0;
}

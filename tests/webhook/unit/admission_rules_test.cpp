#include <catch2/catch.hpp>

#include "admission/decide.hpp"
#include "gpuguard/admission/base64.hpp"
#include "gpuguard/k8s/quantity.hpp"
#include "gpuguard/policy/policy.hpp"

using namespace gpuguard::admission;
using namespace gpuguard::policy;
using gpuguard::k8s::is_zero_quantity;

TEST_CASE("quantities: zero only when well-formed and zero") {
  struct Row {
    const char* quantity;
    bool zero;
  };
  const Row rows[] = {
      {"0", true},   {"00", true},    {"0.0", true},   {"+0", true},   {"-0", true},   {"0m", true},
      {"0Ki", true}, {"0e3", true},   {"0E-2", true},  {".0", true},   {"0.", true},   {"1", false},
      {"2", false},  {"0.5", false},  {"500m", false}, {"1Gi", false}, {"-1", false},  {"1e3", false},
      {"", false},   {"lots", false}, {"0x", false},   {"0Kb", false}, {"0e", false},  {"0..0", false},
      {" 0", false}, {"0 ", false},   {"+", false},    {".", false},   {"0mm", false}, {"0e+", false},
  };
  for (const Row& row : rows) {
    INFO("quantity \"" << row.quantity << "\"");
    CHECK(is_zero_quantity(row.quantity) == row.zero);
  }
}

TEST_CASE("GPU resource names: exact names and trailing-* prefixes") {
  const Policy policy;
  CHECK(policy.is_gpu_resource("nvidia.com/gpu"));
  CHECK(policy.is_gpu_resource("nvidia.com/gpu.shared"));
  CHECK(policy.is_gpu_resource("nvidia.com/mig-1g.10gb"));
  CHECK(policy.is_gpu_resource("nvidia.com/mig-"));
  CHECK_FALSE(policy.is_gpu_resource("nvidia.com/gpu-monitor"));
  CHECK_FALSE(policy.is_gpu_resource("nvidia.com/mig"));
  CHECK_FALSE(policy.is_gpu_resource("example.com/gpu"));
  CHECK_FALSE(policy.is_gpu_resource("cpu"));
}

TEST_CASE("base64 round-trips every length and refuses malformed text") {
  std::string bytes;
  for (int n = 0; n < 70; ++n) {
    CHECK(base64_decode(base64_encode(bytes)) == bytes);
    bytes += static_cast<char>(n * 37 + 11);
  }
  CHECK(base64_encode("patch") == "cGF0Y2g=");
  CHECK(base64_encode("pa") == "cGE=");
  CHECK_FALSE(base64_decode("cGF0Y2g").has_value());
  CHECK_FALSE(base64_decode("cG=0Y2g=").has_value());
  CHECK_FALSE(base64_decode("c*F0Y2g=").has_value());
}

TEST_CASE("warnings are cut to 120 characters without splitting a UTF-8 character") {
  CHECK(bounded_warning(std::string(120, 'a')) == std::string(120, 'a'));
  const std::string cut = bounded_warning(std::string(130, 'a'));
  CHECK(cut.size() == 120);
  CHECK(cut.ends_with("..."));
  std::string multibyte(116, 'a');
  multibyte += "\xC3\xA9\xC3\xA9\xC3\xA9";  // "ééé" straddles the cut
  const std::string safe = bounded_warning(multibyte);
  CHECK(safe.size() <= 120);
  CHECK(safe == std::string(116, 'a') + "...");
}

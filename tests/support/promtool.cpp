// promtool check metrics over a page (promtool.hpp).
#include "promtool.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>

namespace gpuguard::test {

ExitResult promtool_check_metrics(const std::string& page) {
  char path[] = "/tmp/gpuguard-metrics-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return {-1, "promtool_check_metrics: cannot make a temporary file"};
  close(fd);
  std::ofstream(path, std::ios::binary) << page;
  ExitResult result = run_binary(GPUGUARD_PROMTOOL_BIN, std::string("check metrics < ") + path);
  unlink(path);
  return result;
}

void check_promtool_clean(const std::string& page) {
  const ExitResult result = promtool_check_metrics(page);
  INFO("promtool check metrics: exit " << result.status << "\n" << result.output);
  CHECK(result.status == 0);
  CHECK(page.find("# TYPE ") != std::string::npos);  // a page, not an error text that happens to parse
}

}  // namespace gpuguard::test

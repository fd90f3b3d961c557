// One series off a /metrics page (series.hpp says why).
#include "series.hpp"

namespace gpuguard::test {

long long series_value(const std::string& page, const std::string& series) {
  const std::string line = series + " ";
  std::size_t at = 0;
  if (!page.starts_with(line)) {
    at = page.find("\n" + line);
    if (at == std::string::npos) return -1;
    ++at;
  }
  return std::stoll(page.substr(at + line.size()));
}

}  // namespace gpuguard::test

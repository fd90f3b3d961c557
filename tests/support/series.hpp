#pragma once
// Reading one series off a /metrics page, the same way for every program's page.
#include <string>

namespace gpuguard::test {

// The whole value of `series` (a name with its labels, exactly as rendered: `name{a="b"}`) on `page`, or
// -1 when the page does not have it.
long long series_value(const std::string& page, const std::string& series);

}  // namespace gpuguard::test

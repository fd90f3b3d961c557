#pragma once
// Prometheus's own check of a /metrics page, as an operator's tooling would read it: promtool check metrics
// (the text format parses, and promlint's rules hold: HELP on every family, counters named _total, base
// units, no reserved suffixes or labels). The promtool is the one e2e/go.mod pins, built by the build.
#include <string>

#include "server_process.hpp"

namespace gpuguard::test {

// status 0 when the page is clean; otherwise promtool's own lines, one per problem, in `output`.
ExitResult promtool_check_metrics(const std::string& page);
// A failed check of the calling test, naming each problem, unless the page is clean.
void check_promtool_clean(const std::string& page);

}  // namespace gpuguard::test

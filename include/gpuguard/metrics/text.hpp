#pragma once
// Writing the Prometheus text exposition format, shared by every registry.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpuguard::metrics {

std::string number(double value);
void header(std::string& out, std::string_view name, std::string_view type, std::string_view help);
void two_results(std::string& out, std::string_view name, const std::array<std::uint64_t, 2>& counts);
// gpuguard_build_info, which every binary exports.
void render_build_info(std::string& out, std::string_view version);

}  // namespace gpuguard::metrics

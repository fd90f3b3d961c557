#pragma once
// Writing the Prometheus text exposition format, shared by every registry.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace gpuguard::metrics {

// A metric family: its name, type and help, declared once (as a constant beside the render that writes it);
// its header and every sample are written from it, so that a series is never named twice by hand.
struct Family {
  std::string_view name;
  std::string_view type;  // counter, gauge, histogram
  std::string_view help;
};

// Families more than one program exports, written alike by each.
inline constexpr Family kInformerOutcomes{"gpuguard_kube_informer_outcomes_total", "counter",
                                          "Lists and watch ends against the Kubernetes API, by resource and outcome."};

std::string number(double value);
// A sample's labels from names and values, in order: name1="value1",name2="value2". The values are fixed
// label values or names the program chose (a namespace, a resource), never a client's text.
std::string labels(std::initializer_list<std::pair<std::string_view, std::string_view>> pairs);
// The family's # HELP and # TYPE lines.
void header(std::string& out, const Family& family);
// One sample: the family's name, `{labels}` where `labels` (`key="value",...`) is not empty, and the value.
void sample(std::string& out, const Family& family, std::string_view labels, std::string_view value);
void sample(std::string& out, const Family& family, std::string_view labels, std::uint64_t value);
// The header, then one sample: for a family of a single series.
void single(std::string& out, const Family& family, std::string_view value);
void single(std::string& out, const Family& family, std::uint64_t value);
// {result="success"} and {result="failure"}, the header first.
void two_results(std::string& out, const Family& family, const std::array<std::uint64_t, 2>& counts);
// gpuguard_build_info, which every binary exports.
void render_build_info(std::string& out, std::string_view version);

}  // namespace gpuguard::metrics

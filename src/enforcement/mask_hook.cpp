// The mask check's createRuntime hook: its arguments, what it reads and its verdict
// (include/gpuguard/enforcement/mask_hook.hpp).
#include "gpuguard/enforcement/mask_hook.hpp"

#include <nlohmann/json.hpp>

#include "gpuguard/k8s/host_path.hpp"

namespace gpuguard::enforcement {

std::vector<std::string> mask_hook_args(const std::string& path, const MaskHookCall& call) {
  std::vector<std::string> args = {path};
  if (call.unknown_allowed) args.emplace_back("--unknown=allow");
  args.emplace_back("--");
  for (const NodeView::RootPlace& place : call.places) {
    args.push_back(place.root);
    args.push_back(place.device);
    args.push_back(place.path);
  }
  return args;
}

std::optional<MaskHookCall> parse_mask_hook_args(const std::vector<std::string>& args, std::string& why) {
  MaskHookCall call;
  std::size_t i = 1;
  if (i < args.size() && args[i] == "--unknown=allow") {
    call.unknown_allowed = true;
    ++i;
  }
  if (i >= args.size() || args[i] != "--") {
    why = "usage: " + std::string(kMaskHookName) + " [--unknown=allow] -- ROOT DEVICE PATH... (a runtime hook)";
    return std::nullopt;
  }
  ++i;
  if ((args.size() - i) % 3 != 0) {
    why = "the MPS roots come in threes: root, device (major:minor), path in its filesystem";
    return std::nullopt;
  }
  for (; i < args.size(); i += 3) {
    if (!args[i].starts_with('/') || args[i + 1].find(':') == std::string::npos || !args[i + 2].starts_with('/')) {
      why = "not an MPS root's place: " + args[i] + " " + args[i + 1] + " " + args[i + 2];
      return std::nullopt;
    }
    call.places.push_back({args[i], args[i + 1], args[i + 2]});
  }
  return call;
}

namespace {

// A SAX reader that keeps the scalars at the wanted paths and nothing else.
class ValuePicker final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit ValuePicker(const std::vector<std::string>& paths) : paths_(paths), values_(paths.size()) {}

  bool null() override { return true; }
  bool boolean(bool /*value*/) override { return true; }
  bool number_integer(number_integer_t value) override { return keep(std::to_string(value)); }
  bool number_unsigned(number_unsigned_t value) override { return keep(std::to_string(value)); }
  bool number_float(number_float_t /*value*/, const string_t& text) override { return keep(text); }
  bool string(string_t& value) override { return keep(value); }
  bool binary(binary_t& /*value*/) override { return true; }
  bool start_object(std::size_t /*elements*/) override { return enter({}); }
  bool key(string_t& name) override {
    stack_.back() = name.size() <= kPathMax ? name : std::string();
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*elements*/) override { return enter(std::string(kInArray)); }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& error) override {
    why_ = "not JSON at byte " + std::to_string(position) + ": " + error.what();
    return false;
  }

  std::vector<std::string>& values() { return values_; }
  const std::string& why() const { return why_; }

 private:
  static constexpr std::string_view kInArray = "\n[]";  // no key is a newline and brackets alone
  // Deeper than any state or config.json runc writes: what is held is a string per level.
  static constexpr std::size_t kDepthMax = 64;

  bool enter(std::string part) {
    if (stack_.size() == kDepthMax) {
      why_ = "nested deeper than " + std::to_string(kDepthMax);
      return false;
    }
    stack_.push_back(std::move(part));
    return true;
  }

  bool keep(const std::string& value) {
    if (stack_.empty() || std::find(stack_.begin(), stack_.end(), kInArray) != stack_.end()) return true;
    std::string path;
    for (const std::string& part : stack_) path.append(path.empty() ? "" : "/").append(part);
    for (std::size_t i = 0; i < paths_.size(); ++i) {
      if (paths_[i] != path) continue;
      if (value.size() > kPathMax) {
        why_ = path + " is over " + std::to_string(kPathMax) + " bytes";
        return false;
      }
      values_[i] = value;
    }
    return true;
  }

  const std::vector<std::string>& paths_;
  std::vector<std::string> values_;
  std::vector<std::string> stack_;
  std::string why_;
};

}  // namespace

std::optional<std::vector<std::string>> json_values(std::istream& in, const std::vector<std::string>& paths,
                                                    std::string& why) {
  ValuePicker picker(paths);
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(in, &picker);
  } catch (const std::exception& e) {
    why = std::string("not JSON: ") + e.what();
    return std::nullopt;
  }
  if (!parsed) {
    why = picker.why().empty() ? "not JSON" : picker.why();
    return std::nullopt;
  }
  return std::move(picker.values());
}

std::string container_rootfs(const std::string& bundle, const std::string& root_path, std::string& why) {
  if (root_path.empty()) {
    why = "its config.json names no root.path";
    return {};
  }
  if (!root_path.starts_with('/') && !bundle.starts_with('/')) {
    why = "its root (" + root_path + ") is not an absolute path, and the runtime's bundle (" + bundle +
          ") is not one either";
    return {};
  }
  return k8s::lexical_path(root_path.starts_with('/') ? root_path : bundle + "/" + root_path);
}

MountFields mount_fields(std::string_view line) {
  std::string_view fields[5];
  for (std::string_view& field : fields) {
    field = line.substr(0, line.find(' '));
    line.remove_prefix(std::min(line.size(), field.size() + 1));
  }
  if (fields[4].empty()) return {};
  return {fields[2], k8s::lexical_path(mountinfo_path(fields[4]))};
}

bool is_mask_line(std::string_view line) {
  const std::size_t type = line.find(" - tmpfs ");
  if (type == std::string_view::npos) return false;
  std::string_view options = line.substr(type + 9);  // "<source> <super options>"
  options = options.substr(std::min(options.size(), options.find(' ') + 1));
  options = options.substr(0, options.find_first_of(" \n"));
  bool size = false, mode = false;
  while (!options.empty()) {
    const std::string_view option = options.substr(0, options.find(','));
    // 4 KiB rounded up to a page: 4, 16 or 64 KiB.
    size = size || option == "size=4k" || option == "size=16k" || option == "size=64k";
    mode = mode || option == "mode=555";
    options.remove_prefix(std::min(options.size(), option.size() + 1));
  }
  return size && mode;
}

namespace {

// What of the container the mounts fail to show, or empty: no mount at its root, or no mask below it.
std::string not_shown(std::string_view mountinfo, const std::string& rootfs) {
  bool root = false, mask = false;
  while (!mountinfo.empty() && !(root && mask)) {
    const std::string_view line = mountinfo.substr(0, mountinfo.find('\n'));
    mountinfo.remove_prefix(std::min(mountinfo.size(), line.size() + 1));
    const std::string point = mount_fields(line).point;
    root = root || point == rootfs;
    mask = mask || (point != rootfs && k8s::is_or_under(point, rootfs) && is_mask_line(line));
  }
  if (!root) {
    return "no mount at its root (" + rootfs + "): they are not the container's (a runtime that runs it in a VM?)";
  }
  if (!mask) return "no mask at all below its root (" + rootfs + ")";
  return {};
}

}  // namespace

std::string mask_hook_verdict(const MaskHookCall& call, const std::string& problem, std::string_view mountinfo,
                              const std::string& rootfs) {
  std::string unknown = problem;
  // What it judges must be there: the container's root among the mounts, and a mask below it. A process
  // whose mounts show neither is not where the container's mounts are, and nothing unmasked there would
  // mean nothing.
  if (unknown.empty()) {
    if (const std::string missing = not_shown(mountinfo, rootfs); !missing.empty()) {
      unknown = "its process's mounts show " + missing;
    }
  }
  if (!unknown.empty()) {
    if (call.unknown_allowed) return {};
    return "gpuguard: the container has masks over MPS roots whose place cannot be checked: " + unknown;
  }
  const std::vector<std::string> unmasked =
      unmasked_roots(mountinfo, call.places, MaskCheck{.rootfs = rootfs, .masks_read_only = false});
  if (unmasked.empty()) return {};
  std::string message =
      "gpuguard: the container would show every shared GPU's MPS server: its mounts show an MPS "
      "root where no mask landed (";
  for (std::size_t i = 0; i < unmasked.size(); ++i) message.append(i == 0 ? "" : ", ").append(unmasked[i]);
  message +=
      "): runc put a mask elsewhere than the mount (through the image's own links or mounts), or the root shows "
      "a second time below the mount, through another mount of it on the host. Mount the host's directory at a "
      "path without links in the image";
  return message;
}

}  // namespace gpuguard::enforcement

#include "gpuguard/policy/policy_watcher.hpp"

#include <stdexcept>
#include <system_error>

#include "gpuguard/files/read_file.hpp"
#include "gpuguard/log/log.hpp"

namespace gpuguard::policy {
namespace {

namespace fs = std::filesystem;

std::string data_link(const fs::path& dir) {
  std::error_code ec;
  const fs::path target = fs::read_symlink(dir / "..data", ec);
  return ec ? std::string{} : target.string();
}

// Every key file in the directory, or nullopt when the directory is missing or changed while being read.
// Names starting with '.' are the kubelet's own (`..data`, `..2026_11_22_…`).
std::optional<std::map<std::string, std::string>> read_keys(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::map<std::string, std::string>{};
  const std::string generation = data_link(dir);
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with('.') || !fs::is_regular_file(entry.path(), ec)) continue;  // follows symlinks
    auto content = files::read_file(entry.path());
    if (!content) return std::nullopt;
    files.emplace(name, std::move(*content));
  }
  if (ec || data_link(dir) != generation) return std::nullopt;  // swapped mid-read: the next check will do
  return files;
}

}  // namespace

PolicyWatcher::PolicyWatcher(std::optional<fs::path> dir, metrics::ReloadMetrics& metrics, std::set<std::string> keys,
                             AtStart invalid)
    : dir_(std::move(dir)),
      metrics_(metrics),
      keys_(std::move(keys)),
      policy_(std::make_shared<const policy::Policy>()) {
  if (dir_) {
    std::error_code ec;
    if (!fs::is_directory(*dir_, ec)) {
      log::warn("policy directory does not exist; serving the default policy until it does", {{"dir", dir_->string()}});
    }
    const auto files = read();
    if (!files) throw std::runtime_error("cannot read policy directory " + dir_->string());
    last_seen_ = *files;
    auto parsed = policy::parse_policy(*files);
    if (!parsed.policy && invalid == AtStart::refuse)
      throw std::runtime_error(parsed.error + " (in " + dir_->string() + ")");
    for (const auto& key : parsed.unknown_keys) log::warn("unknown policy key ignored", {{"key", key}});
    if (parsed.policy) {
      policy_.store(std::make_shared<const policy::Policy>(std::move(*parsed.policy)));
    } else {
      metrics_.count_policy_reload(false);
      log::error("policy refused; the defaults stay in force until it is fixed", {{"reason", parsed.error}});
    }
  }
  metrics_.set_policy_mode(policy::mode_name(current()->mode));
  log::info("policy loaded", {{"mode", policy::mode_name(current()->mode)},
                              {"source", dir_ ? dir_->string() : std::string("defaults")}});
}

std::optional<std::map<std::string, std::string>> PolicyWatcher::read() const {
  auto files = read_keys(*dir_);
  if (files && !keys_.empty()) std::erase_if(*files, [this](const auto& file) { return !keys_.contains(file.first); });
  return files;
}

void PolicyWatcher::watch(std::chrono::milliseconds interval) {
  if (dir_) poller_ = std::make_unique<files::Poller>(interval, [this] { reload(); });
}

bool PolicyWatcher::reload() {
  if (!dir_) return false;
  auto files = read();
  if (!files || files == last_seen_) return false;
  last_seen_ = *files;
  auto parsed = policy::parse_policy(*files);
  if (!parsed.policy) {
    metrics_.count_policy_reload(false);
    log::error("policy refused; the last good policy stays in force", {{"reason", parsed.error}});
    return false;
  }
  for (const auto& key : parsed.unknown_keys) log::warn("unknown policy key ignored", {{"key", key}});
  const policy::Mode mode = parsed.policy->mode;
  policy_.store(std::make_shared<const policy::Policy>(std::move(*parsed.policy)));
  metrics_.count_policy_reload(true);
  metrics_.set_policy_mode(policy::mode_name(mode));
  log::info("policy reloaded", {{"mode", policy::mode_name(mode)}});
  return true;
}

}  // namespace gpuguard::policy

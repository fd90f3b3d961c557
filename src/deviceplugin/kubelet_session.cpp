#include "gpuguard/deviceplugin/kubelet_session.hpp"

#include <sys/stat.h>

#include "gpuguard/log/log.hpp"

namespace gpuguard::deviceplugin {
namespace {

std::optional<ino_t> socket_inode(const std::filesystem::path& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0 || !S_ISSOCK(info.st_mode)) return std::nullopt;
  return info.st_ino;
}

}  // namespace

KubeletSession::KubeletSession(std::vector<std::unique_ptr<PluginServer>>& servers,
                               std::filesystem::path kubelet_socket, Yield yield)
    : servers_(servers), kubelet_socket_(std::move(kubelet_socket)), yield_(std::move(yield)) {}

void KubeletSession::reconcile() {
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  reconcile_locked();
  passes_.fetch_add(1);
}

void KubeletSession::reconcile_locked() {
  for (auto& server : servers_) {
    if (server->serving()) continue;
    server->serve();
    // A new kubelet.sock may get the old one's inode number back: only a registration after this counts.
    registered_with_.reset();
  }
  const auto kubelet = socket_inode(kubelet_socket_);
  if (!kubelet || kubelet != registered_with_) registered_.store(false);
  if (!kubelet || kubelet == registered_with_) return;
  try {
    for (auto& server : servers_) {
      if (yielded_.contains(server->resource_name())) continue;
      const std::string why = yield_ ? yield_(server->resource_name()) : std::string();
      if (!why.empty()) {
        yielded_.insert(server->resource_name());
        log::warn("not registered: another plugin serves the resource",
                  {{"resource", server->resource_name()}, {"reason", why}});
        continue;
      }
      server->register_with_kubelet(kubelet_socket_);
    }
    registered_with_ = kubelet;
    registered_.store(true);
    last_error_.clear();
  } catch (const std::exception& e) {
    if (e.what() != last_error_) log::warn("registration failed; retrying every second", {{"reason", e.what()}});
    last_error_ = e.what();
  }
}

void KubeletSession::stop() {
  std::lock_guard lock(mutex_);
  stopped_ = true;
  registered_.store(false);
  for (auto& server : servers_) server->stop();
}

}  // namespace gpuguard::deviceplugin

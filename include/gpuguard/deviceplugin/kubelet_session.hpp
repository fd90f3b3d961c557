#pragma once
// Keeping the plugin's sockets served and registered with whichever kubelet runs now: a kubelet deletes
// every socket in its directory when it restarts, then creates a new kubelet.sock.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <sys/types.h>

#include "gpuguard/deviceplugin/plugin_server.hpp"

namespace gpuguard::deviceplugin {

class KubeletSession {
 public:
  // Why a resource is not to be registered now (another plugin serves it), or empty; asked at every
  // registration, so that after a kubelet restart the plugin that registers last is never gpuguard's
  // against another that already serves the resource.
  using Yield = std::function<std::string(const std::string& resource)>;

  KubeletSession(std::vector<std::unique_ptr<PluginServer>>& servers, std::filesystem::path kubelet_socket,
                 Yield yield = {});

  // Serves again where a socket of ours is gone, and registers every resource again with a new
  // kubelet.sock (a different inode). Called every second; logs each new registration error once.
  void reconcile();
  // Stops every server and removes its socket; reconcile() does nothing from then on.
  void stop();
  // Every resource is registered with the kubelet.sock that exists now.
  bool registered() const { return registered_.load(); }
  // Passes of reconcile() run to their end: what shows that the plugin has looked again, so that what it did
  // not do (register, serve again) can be told from what it has not yet got to.
  std::uint64_t passes() const { return passes_.load(); }

 private:
  void reconcile_locked();

  std::vector<std::unique_ptr<PluginServer>>& servers_;
  std::filesystem::path kubelet_socket_;
  Yield yield_;
  // Resources left to another plugin, said once each, and for good: once another plugin has served one
  // here, this one never takes it over (not when that plugin fails, nor when the kubelet restarts).
  std::set<std::string> yielded_;
  std::mutex mutex_;
  std::optional<ino_t> registered_with_;
  std::string last_error_;
  bool stopped_ = false;
  std::atomic<bool> registered_{false};
  std::atomic<std::uint64_t> passes_{0};
};

}  // namespace gpuguard::deviceplugin

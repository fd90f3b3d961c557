#include "gpuguard/log/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

namespace gpuguard::log {
namespace {

std::atomic<Level> g_level{Level::info};
std::mutex g_write_mutex;

std::string_view level_name(Level level) {
  switch (level) {
    case Level::debug: return "debug";
    case Level::info: return "info";
    case Level::warn: return "warn";
    case Level::error: break;
  }
  return "error";
}

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(millis));
  return text;
}

}  // namespace

std::optional<Level> parse_level(std::string_view name) {
  for (Level level : {Level::debug, Level::info, Level::warn, Level::error}) {
    if (name == level_name(level)) return level;
  }
  return std::nullopt;
}

void set_level(Level level) { g_level.store(level, std::memory_order_relaxed); }

bool enabled(Level level) { return level >= g_level.load(std::memory_order_relaxed); }

void write(Level level, std::string_view message, Fields fields) {
  if (!enabled(level)) return;
  nlohmann::json line = {{"time", utc_now()}, {"level", level_name(level)}, {"msg", message}};
  for (const Field& field : fields) {
    std::visit(
        [&](const auto& value) {
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, const std::vector<std::string>*>) {
            line[std::string(field.key)] = *value;
          } else {
            line[std::string(field.key)] = value;
          }
        },
        field.value.get());
  }
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  std::lock_guard lock(g_write_mutex);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace gpuguard::log

#pragma once
// JSON lines on stderr: {"time":..., "level":..., "msg":..., ...fields}. Never pass secrets as fields.
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

namespace gpuguard::log {

enum class Level { debug, info, warn, error };

std::optional<Level> parse_level(std::string_view name);
void set_level(Level level);
bool enabled(Level level);
void write(Level level, std::string_view message, const nlohmann::json& fields = nlohmann::json::object());

inline void debug(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) { if (enabled(Level::debug)) write(Level::debug, m, f); }
inline void info(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) { write(Level::info, m, f); }
inline void warn(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) { write(Level::warn, m, f); }
inline void error(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) { write(Level::error, m, f); }

}  // namespace gpuguard::log

#pragma once
// The device plugin's command line: every flag overrides the config file's value when given.
#include <boost/program_options.hpp>

#include <optional>
#include <string>

#include "gpuguard/deviceplugin/config.hpp"

namespace gpuguard::deviceplugin {

void add_flags(boost::program_options::options_description& description);

// Defaults, then --config-file, then the flags given. Returns the config, or prints why not (and the
// file's warnings are logged by the caller from `warnings`).
std::optional<PluginConfig> config_from(const boost::program_options::variables_map& flags,
                                        std::vector<std::string>& warnings);

}  // namespace gpuguard::deviceplugin

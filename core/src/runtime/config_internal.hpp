// Internal: reading the configuration (Note [Config precedence] in runtime.hpp).
#pragma once

#include <backplane/runtime.hpp>

#include <string>
#include <vector>

namespace bp::detail {

// The config file that applies, or "" when there is none. Throws IOError when
// BACKPLANE_CONFIG names a missing file.
std::string config_file_path();
// The file's settings overridden by the environment. Throws IOError for a bad file or value.
Config load_config();
// load_config() of the first call, cached for the process.
const Config& settings();
// BACKPLANE_PLUGIN_PATH split at ':'.
std::vector<std::string> env_plugin_path();

}  // namespace bp::detail

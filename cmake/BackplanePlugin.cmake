# bp_add_backend_plugin(<name> SOURCES <src>... [LIBRARIES <lib>...])
#
# Builds every Backplane backend plugin the same way: a MODULE library named
# libbackplane-<name>.so with hidden visibility, exactly one exported symbol
# (bp_plugin_get_api, enforced by a version script), no undefined symbols, static
# dependencies' symbols hidden, placed in <build>/lib/backplane/plugins (so the build tree
# behaves like an install) and installed to <libdir>/backplane/plugins.
include_guard(GLOBAL)
include(GNUInstallDirs)

set(BP_PLUGIN_OUTPUT_DIR "${CMAKE_BINARY_DIR}/lib/backplane/plugins")
set(BP_PLUGIN_VERSION_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/plugin.map")
set(BP_COMM_VERSION_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/comm.map")

# The shared body of both helpers: target, output name and the version script that leaves
# exactly one symbol exported.
function(_bp_add_plugin target version_script)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIR" "SOURCES;LIBRARIES" ${ARGN})
  add_library(${target} MODULE ${ARG_SOURCES})
  if(NOT ARG_OUTPUT_DIR)
    set(ARG_OUTPUT_DIR "${BP_PLUGIN_OUTPUT_DIR}")
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "${target}"
    LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIR}"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  # The package's namespaced target: in this tree an alias, in an install an imported target.
  target_link_libraries(${target} PRIVATE Backplane::plugin_headers ${ARG_LIBRARIES})
  target_link_options(${target} PRIVATE
    "LINKER:--no-undefined"
    "LINKER:--exclude-libs,ALL"
    "LINKER:--version-script=${version_script}")
  if(NOT ARG_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}/backplane/plugins"
            COMPONENT plugins)
  endif()
endfunction()

function(bp_add_backend_plugin name)
  _bp_add_plugin(backplane-${name} "${BP_PLUGIN_VERSION_SCRIPT}" ${ARGN})
endfunction()

# bp_add_comm_plugin(<name> SOURCES <src>... [LIBRARIES <lib>...])
#
# The same for a communicator plugin (plugins/include/backplane/comm_abi.h): a MODULE library
# libbackplane-comm-<name>.so whose one exported symbol is bp_comm_get_api, beside the device
# plugins (the loader finds both in one search).
function(bp_add_comm_plugin name)
  _bp_add_plugin(backplane-comm-${name} "${BP_COMM_VERSION_SCRIPT}" ${ARGN})
endfunction()

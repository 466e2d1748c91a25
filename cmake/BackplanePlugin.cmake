# bp_add_backend_plugin(<name> SOURCES <src>... [LIBRARIES <lib>...] [NO_INSTALL]
#                       [OUTPUT_DIR <dir>] [NO_CONFORMANCE] [CONFORMANCE_ENV <VAR=value>...])
#
# Builds every Backplane backend plugin the same way: a MODULE library named
# libbackplane-<name>.so with hidden visibility, exactly one exported symbol
# (bp_plugin_get_api, enforced by a version script), no undefined symbols, static
# dependencies' symbols hidden, placed in <build>/lib/backplane/plugins (so the build tree
# behaves like an install) and installed to <libdir>/backplane/plugins.
#
# It also registers the CTest test conformance.<name>: bp-conformance --plugin <the .so>, the
# whole conformance kit on every device of the plugin (plugins/conformance/README.md). A plugin
# that finds no device is skipped with the reason bp-conformance prints (its exit status 77 is
# CTest's SKIP_RETURN_CODE). The tool is Backplane's own in its build tree, the installed
# bin/bp-conformance for an out-of-tree plugin (Backplane_CONFORMANCE, set by find_package);
# with neither, or with NO_CONFORMANCE (the loader's deliberately broken files), no test.
include_guard(GLOBAL)
include(GNUInstallDirs)

set(BP_PLUGIN_OUTPUT_DIR "${CMAKE_BINARY_DIR}/lib/backplane/plugins")
set(BP_PLUGIN_VERSION_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/plugin.map")
set(BP_COMM_VERSION_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/comm.map")

# The shared body of both helpers: target, output name and the version script that leaves
# exactly one symbol exported.
function(_bp_add_plugin target version_script)
  cmake_parse_arguments(ARG "NO_INSTALL;NO_CONFORMANCE" "OUTPUT_DIR"
                        "SOURCES;LIBRARIES;CONFORMANCE_ENV" ${ARGN})
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
  cmake_parse_arguments(ARG "NO_CONFORMANCE" "" "CONFORMANCE_ENV" ${ARGN})
  # In Backplane's tree BP_CONFORMANCE_COMMAND is $<TARGET_FILE:bp-conformance> (a generator
  # expression: the tool may be defined after the plugin).
  if(DEFINED BP_CONFORMANCE_COMMAND)
    set(tool "${BP_CONFORMANCE_COMMAND}")
  elseif(DEFINED Backplane_CONFORMANCE AND EXISTS "${Backplane_CONFORMANCE}")
    set(tool "${Backplane_CONFORMANCE}")
  else()
    return()
  endif()
  if(ARG_NO_CONFORMANCE)
    return()
  endif()
  add_test(NAME conformance.${name}
           COMMAND "${tool}" --plugin $<TARGET_FILE:backplane-${name}> --no-device-exit 77)
  set_tests_properties(conformance.${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
                       LABELS conformance)
  if(ARG_CONFORMANCE_ENV)
    set_tests_properties(conformance.${name} PROPERTIES ENVIRONMENT "${ARG_CONFORMANCE_ENV}")
  endif()
endfunction()

# bp_add_comm_plugin(<name> SOURCES <src>... [LIBRARIES <lib>...])
#
# The same for a communicator plugin (plugins/include/backplane/abi/comm_abi.h): a MODULE library
# libbackplane-comm-<name>.so whose one exported symbol is bp_comm_get_api, beside the device
# plugins (the loader finds both in one search).
function(bp_add_comm_plugin name)
  _bp_add_plugin(backplane-comm-${name} "${BP_COMM_VERSION_SCRIPT}" ${ARGN})
endfunction()

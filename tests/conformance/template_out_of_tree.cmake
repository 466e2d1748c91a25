# ctest conformance.template (cmake -P): installs this build of Backplane into a temporary
# prefix, builds plugins/template out of tree against it with find_package(Backplane), installs
# the plugin into the prefix and runs bp-conformance on it twice:
#   1. ctest in the template's build: conformance.template, which the installed
#      bp_add_backend_plugin registered with the installed tool on the freshly built .so;
#   2. the installed tool, which finds the installed plugin through the relocatable search
#      (<dir of libbackplane.so>/backplane/plugins), with --device template:0.
# Both must pass; the second must report the template's undeclared ops as unsupported.
#
# Variables: BP_BUILD_DIR BP_SOURCE_DIR BP_WORK_DIR BP_GENERATOR BP_PYTHON BP_CHECK
foreach(v BP_BUILD_DIR BP_SOURCE_DIR BP_WORK_DIR BP_GENERATOR BP_PYTHON BP_CHECK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "template_out_of_tree.cmake: ${v} is not set")
  endif()
endforeach()

set(prefix "${BP_WORK_DIR}/prefix")
set(build "${BP_WORK_DIR}/build")
file(REMOVE_RECURSE "${BP_WORK_DIR}")
file(MAKE_DIRECTORY "${BP_WORK_DIR}")

# Runs a command; prints its output when it fails or when `what` names a conformance run.
function(step what)
  message(STATUS "template: ${what}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message("${out}")
    message(FATAL_ERROR "template: ${what} failed (${rc})")
  endif()
  if(what MATCHES "bp-conformance|ctest")
    message("${out}")
  endif()
endfunction()

# The core library, headers, CMake package and tools; the first-party plugins (component
# "plugins") stay out, so the installed tool sees only the template.
step("install Backplane into ${prefix}"
     ${CMAKE_COMMAND} --install "${BP_BUILD_DIR}" --prefix "${prefix}" --component Unspecified)
step("configure plugins/template against it"
     ${CMAKE_COMMAND} -S "${BP_SOURCE_DIR}/plugins/template" -B "${build}" -G "${BP_GENERATOR}"
     -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}"
     -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
step("build the template plugin" ${CMAKE_COMMAND} --build "${build}")
step("install the template plugin" ${CMAKE_COMMAND} --install "${build}" --prefix "${prefix}")

file(GLOB built "${build}/lib/backplane/plugins/libbackplane-template.so")
if(NOT built)
  message(FATAL_ERROR "template: libbackplane-template.so was not built where bp_add_backend_plugin puts it")
endif()
file(GLOB installed "${prefix}/lib*/backplane/plugins/libbackplane-template.so")
if(NOT installed)
  message(FATAL_ERROR "template: the plugin was not installed into <prefix>/lib/backplane/plugins")
endif()
file(GLOB installed_tool "${prefix}/bin/bp-conformance")

set(expect
  --expect-exit 0
  --expect "^PASS +kernels\\.add_broadcast\\[template:0,f32\\]"
  --expect "^PASS +kernels\\.sum_dims\\[template:0,f32\\]"
  --expect "^UNSUPPORTED +kernels\\.matmul\\[template:0,f32\\]: the template backend implements"
  --expect "^PASS +optional\\.events\\[template:0\\].*NULL: host default"
  --forbid "^FAIL")
get_filename_component(cmake_bin "${CMAKE_COMMAND}" DIRECTORY)
step("ctest in the template build (conformance.template)"
     "${cmake_bin}/ctest" --test-dir "${build}" --output-on-failure --no-tests=error
     -R "^conformance\\.template$")
if(installed_tool)
  step("installed bp-conformance --device template:0"
       "${BP_PYTHON}" "${BP_CHECK}" "${installed_tool}" ${expect}
       --expect "^PASS +abi\\.load\\[template\\].*${prefix}" -- --device template:0)
else()
  message(FATAL_ERROR "template: bp-conformance was not installed into ${prefix}/bin")
endif()
message(STATUS "template: ok")

# Note [Build progress under pip]
#   pip captures the output of a build backend and shows it only with `pip install -v .`, so a
#   plain `pip install .` would print nothing for the minutes the compiler runs. Under
#   scikit-build-core, every compile and link goes through tools/pip-progress.sh (in front of
#   any other launcher, such as ccache), which writes one line to the terminal pip runs in
#   (/dev/tty, when the build has one; nothing otherwise, as in CI):
#     backplane: compiling core/src/tensor/tensor_ops.cpp
#     backplane: linking backplane/lib/libbackplane.so
#   -Ccmake.define.BP_PIP_PROGRESS=OFF turns it off; `pip install -v .` shows the full build.
option(BP_PIP_PROGRESS "pip install: a line per compile and link on the terminal" ON)
if(BP_PIP_PROGRESS AND CMAKE_HOST_UNIX)
  get_filename_component(_bp_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
  set(_bp_progress sh "${_bp_root}/tools/pip-progress.sh" "${_bp_root}")
  foreach(_bp_lang C CXX)
    set(CMAKE_${_bp_lang}_COMPILER_LAUNCHER ${_bp_progress} compiling
        ${CMAKE_${_bp_lang}_COMPILER_LAUNCHER})
    set(CMAKE_${_bp_lang}_LINKER_LAUNCHER ${_bp_progress} linking
        ${CMAKE_${_bp_lang}_LINKER_LAUNCHER})
  endforeach()
endif()

# Runs PROGRAM with ARGS RUNS times, each with a new, empty POCL_CACHE_DIR (a cold kernel cache:
# PoCL then compiles every first launch on its own thread), and fails unless every run exits
# with 0 and prints EXPECT. Prints the number of runs and failures.
#   cmake -DPROGRAM=... -DARGS=a;b -DRUNS=n -DEXPECT=regex -DWORK=dir -P run_fresh_cache.cmake
set(_failed 0)
foreach(_i RANGE 1 ${RUNS})
  string(RANDOM LENGTH 12 _tag)
  set(_cache "${WORK}/pocl-cache-${_tag}")
  file(MAKE_DIRECTORY "${_cache}")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "POCL_CACHE_DIR=${_cache}" ${PROGRAM} ${ARGS}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  file(REMOVE_RECURSE "${_cache}")
  if(NOT _rc STREQUAL "0" OR NOT _out MATCHES "${EXPECT}")
    math(EXPR _failed "${_failed} + 1")
    message("run ${_i}: exit status ${_rc}\nstdout:\n${_out}\nstderr:\n${_err}")
  endif()
endforeach()
message("runs: ${RUNS}, failed: ${_failed}")
if(_failed GREATER 0)
  message(FATAL_ERROR "${_failed} of ${RUNS} runs of ${PROGRAM} ${ARGS} failed")
endif()

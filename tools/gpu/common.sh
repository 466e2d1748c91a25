# Shared by the tools/gpu scripts (source it after setting `out`): logged, timed steps and
# fresh seeds.
#
#   step NAME CMD...   runs CMD under `timeout $STEP_TIMEOUT` (default 240 s) with its output
#                      in $out/NAME.log, shows the log's last $STEP_TAIL lines (default 6) and
#                      adds "NAME rc=N Ts" to the `summary` array
#   seed               a fresh 64-bit seed
#   nvidia_opencl_dir  when NVIDIA's OpenCL driver is installed, writes $out/opencl-vendors/
#                      nvidia.icd naming it and prints that folder (for OCL_ICD_VENDORS)
summary=()
step() {
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout "${STEP_TIMEOUT:-240}" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n "${STEP_TAIL:-6}" "$out/$name.log"
  summary+=("$(printf '%-40s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
}
seed() { od -An -N8 -tu8 /dev/urandom | tr -d ' '; }
nvidia_opencl_dir() {
  local lib=/usr/local/nvidia/lib64/libnvidia-opencl.so.1
  [ -e "$lib" ] || return 1
  mkdir -p "$out/opencl-vendors"
  echo "$lib" >"$out/opencl-vendors/nvidia.icd"
  echo "$out/opencl-vendors"
}

#!/usr/bin/env bash
# Runs the whole GPU check on a machine that got a bundled build (see
# ../shared/tools/device-bundle): the device report, the walkthrough, every test program,
# bp-conformance on each device, and the benchmarks against PyTorch. Logs go to $OUT (or
# ./device-out). Usage: bash tools/device-check.sh [build-dir] [steps...]
#   steps: smi walkthrough tests conformance bench nn (default: all)
set -uo pipefail
build=${1:-.device/build}
shift || true
steps=${*:-smi walkthrough tests conformance bench nn}
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# NVIDIA's OpenCL driver is not registered with the ICD loader there. OCL_ICD_FILENAMES did not
# switch the loader to it (issue 17); a vendors folder named by OCL_ICD_VENDORS that holds an
# nvidia.icd naming the driver does. The system's own .icd files (PoCL, ...) are kept beside it.
nv_ocl=/usr/local/nvidia/lib64/libnvidia-opencl.so.1
if [ -e "$nv_ocl" ] && [ -z "${OCL_ICD_VENDORS:-}" ]; then
  icd_dir="$(cd "$out" && pwd)/opencl-vendors"
  mkdir -p "$icd_dir"
  cp /etc/OpenCL/vendors/*.icd "$icd_dir"/ 2>/dev/null || true
  echo "$nv_ocl" > "$icd_dir/nvidia.icd"
  export OCL_ICD_VENDORS="$icd_dir"
  echo "OpenCL: OCL_ICD_VENDORS=$icd_dir ($(ls "$icd_dir" | tr '\n' ' '))"
fi
summary=()
step() {  # step NAME CMD...
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log"
  summary+=("$name rc=$rc $((SECONDS - t0))s")
}
has() { [[ " $steps " == *" $1 "* ]]; }

has smi && step smi "$build/tools/bp-smi"
has walkthrough && step walkthrough bash -c "'$build/bin/example-devices' && '$build/bin/example-tensors'"
if has tests; then
  step unit "$build/bin/bp_unit_tests" --gtest_brief=1
  step device_tests "$build/bin/bp_device_tests" --gtest_brief=1
  for t in "$build"/bin/*_plugin_test "$build"/bin/*_native_test "$build"/backends/*/*_plugin_test \
    "$build"/bin/bp_nn_tests; do
    [ -x "$t" ] && step "$(basename "$t")" "$t" --gtest_brief=1
  done
fi
if has conformance && [ -x "$build/bin/bp-conformance" ]; then
  step conformance "$build/bin/bp-conformance" --json "$out/conformance.json" \
    --junit "$out/conformance.xml"
fi
has bench && step bench python3 bench/compare.py --bp "$build/bin/bp-bench" --json "$out/bench.json"
if has nn; then
  [ -x "$build/bin/bp-bench-mlp" ] && step bench_mlp "$build/bin/bp-bench-mlp"
  [ -f tests/nn/torch_roundtrip.py ] && step torch_roundtrip python3 tests/nn/torch_roundtrip.py "$build"
fi
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"

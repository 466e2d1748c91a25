#!/usr/bin/env bash
# Issue 32: runs each test of the given pytest files alone, in its own interpreter, and prints
# which ones end with nanobind's leak report (the whole file reports it on the GPU machine with
# PyTorch loaded; a standalone program does not). Then the whole file again,
# with -p no:cacheprovider and -p no:faulthandler, to tell pytest's plugins apart. The single
# tests run LEAK_JOBS (8) at a time.
#   source .device/env.sh
#   bash tools/gpu/leak_bisect.sh BUILD_DIR python/tests/test_interop_gpu.py ...
set -uo pipefail
build=${1:?usage: bash tools/gpu/leak_bisect.sh BUILD_DIR TEST_FILE...}
shift
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
py=${BP_PYTHON:-python3}
one() {
  local log rc
  log=$("$py" -m pytest -q -x "$@" 2>&1)
  rc=$?
  printf '%-90s rc=%s leak-lines=%s\n' "$*" "$rc" "$(grep -c "leaked" <<<"$log")"
  grep -m3 "leaked" <<<"$log" | sed 's/^/    /'
  return 0
}
for f in "$@"; do
  one "$f"
  one -p no:cacheprovider -p no:faulthandler "$f"
  mapfile -t ids < <("$py" -m pytest -q --collect-only "$f" 2>/dev/null | grep '::')
  export -f one
  export py
  printf '%s\n' "${ids[@]}" | xargs -P "${LEAK_JOBS:-8}" -I{} bash -c 'one "$1"' _ {}
done

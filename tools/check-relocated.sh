#!/usr/bin/env bash
# Shows that a build tree works after being copied elsewhere (issue 17): every test program
# finds its plugins, fixtures and helper tools relative to itself. Copies BUILD_DIR to a
# temporary folder and runs the test programs there while the original build tree AND the
# source tree are hidden (an empty folder bind-mounted over them in a private mount namespace;
# needs root or user namespaces). Usage:
#
#   bash tools/check-relocated.sh [BUILD_DIR=build]
#
# Exit status 0 when every program passed; a summary table at the end.
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
copy=$(mktemp -d /tmp/bp-relocated.XXXXXX)
empty=$(mktemp -d /tmp/bp-empty.XXXXXX)
trap 'rm -rf "$copy" "$empty"' EXIT
cp -a "$build/." "$copy/"
echo "copied $build to $copy; hiding $build and $src while the tests run"

programs=()
for p in bp_unit_tests bp_device_tests bp_nn_tests bp_stress_tests cpu_plugin_test \
  opencl_plugin_test cuda_nodriver_test cuda_plugin_test bp_readme_example; do
  [ -x "$copy/bin/$p" ] && programs+=("$p")
done

# Runs inside the namespace: hide, then run each program, print "name rc seconds".
inner=$(cat <<'INNER'
set -u
mount --bind "$EMPTY" "$SRC" || exit 90
if [ -d "$BUILD" ]; then mount --bind "$EMPTY" "$BUILD" 2>/dev/null || true; fi
[ -z "$(ls -A "$SRC")" ] || exit 91
cd "$COPY"
for p in $PROGRAMS; do
  t0=$(date +%s)
  "$COPY/bin/$p" --gtest_brief=1 > "$COPY/$p.log" 2>&1
  echo "$p $? $(( $(date +%s) - t0 ))"
done
"$COPY/bin/bp-conformance" --device cpu:0 --filter 'kernels.add*' > "$COPY/conformance.log" 2>&1
echo "bp-conformance(cpu:0,kernels.add*) $? 0"
INNER
)
results=$(EMPTY=$empty SRC=$src BUILD=$build COPY=$copy PROGRAMS="${programs[*]}" \
  unshare -m --propagation private bash -c "$inner")
rc=$?
if [ $rc -ge 90 ]; then
  echo "could not hide the original trees (unshare/mount needs root or user namespaces)" >&2
  exit 2
fi
status=0
printf '%-36s %4s %8s  %s\n' program rc seconds result
while read -r name prc secs; do
  log="$copy/${name%%(*}.log"
  [ "${name%%(*}" = bp-conformance ] && log="$copy/conformance.log"
  res=$(grep -E '^\[  PASSED  \]|^[0-9]+ PASS' "$log" 2>/dev/null | tail -1)
  printf '%-36s %4s %8s  %s\n' "$name" "$prc" "$secs" "$res"
  if [ "$prc" != 0 ]; then
    status=1
    tail -20 "$copy/$name.log" 2>/dev/null
  fi
done <<<"$results"
exit $status

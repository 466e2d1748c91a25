#!/bin/sh
# Compiler and linker launcher of `pip install .`: writes "backplane: <what> <file>" to the
# terminal when there is one, then runs the command (Note [Build progress under pip] in
# cmake/PipProgress.cmake). Usage: pip-progress.sh <source root> compiling|linking command...
root=$1
what=$2
shift 2
file=
prev=
for a in "$@"; do
  case $what:$prev in
    compiling:-c) file=$a ;;
    linking:-o) file=$a ;;
  esac
  prev=$a
done
if true 2>/dev/null >/dev/tty; then
  printf 'backplane: %s %s\n' "$what" "${file#"$root"/}" >/dev/tty 2>/dev/null
fi
exec "$@"

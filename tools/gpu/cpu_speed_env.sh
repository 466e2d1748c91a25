# source tools/gpu/cpu_speed_env.sh BUILD_DIR
# Unpacks BUILD_DIR/cpu-speed-libs.tar.xz (written by `tools/gpu/cpu_speed.sh --pack`) into a
# temporary folder once, exports BP_CPU_LIBS (that folder) and puts its "linked" libraries
# (oneDNN, OpenBLAS) first on LD_LIBRARY_PATH, so a bundle that dropped their uncompressed
# copies runs the cpu plugin. Does nothing when there is no such file.
_bp_pack="${1:-.device/build}/cpu-speed-libs.tar.xz"
if [ -f "$_bp_pack" ] && [ -z "${BP_CPU_LIBS:-}" ]; then
  BP_CPU_LIBS=$(mktemp -d)
  export BP_CPU_LIBS
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
    "$_bp_pack" "$BP_CPU_LIBS"
  export LD_LIBRARY_PATH="$BP_CPU_LIBS/linked${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
unset _bp_pack

// What the backends' ABI-level test programs (backends/*/tests) share: finding files relative to
// the test binary (so a copied build tree passes), loading a plugin through libbackplane's
// loader, and the host encoding of every dtype; the run's random seed is seed.hpp's. The comparison
// with the float64 reference is compare.hpp's.
//
// Header-only; not thread-safe where it says "the run's" (tests set up on one thread).
#ifndef BACKPLANE_TEST_PLUGIN_TEST_HPP_
#define BACKPLANE_TEST_PLUGIN_TEST_HPP_

#include <backplane/abi/half.h>
#include <backplane/abi/plugin_abi.h>
#include <backplane_test/dtype_io.h>
#include <backplane_test/seed.hpp>
#include <plugin_host.hpp>  // core/src/runtime/host: the loader's tables (links backplane_host)

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace bp_test {

// ---- Files relative to the test binary ----------------------------------------------------------

// The folder of the running executable (/proc/self/exe), without a trailing '/'.
inline std::string exe_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

// `relative` (a path from the test binary's folder, as CMake computed it with
// $<PATH:RELATIVE_PATH,...>) made absolute; `env_override`, when set and not empty, wins.
inline std::string beside_exe(const char* relative, const char* env_override = nullptr) {
  if (env_override) {
    const char* v = std::getenv(env_override);
    if (v && *v) return v;
  }
  if (relative[0] == '/') return relative;
  return exe_dir() + "/" + relative;
}

// ---- Loading a plugin --------------------------------------------------------------------------

struct LoadedPlugin {
  const bp_plugin_api* api = nullptr;  // NULL when loading failed
  std::string error;                   // why, when api is NULL
};

// The plugin through libbackplane's loader (bp::host::load_plugin): every check of the registry
// (the entry symbol, the ABI version, struct_size, init once per process), so a test program
// sees the plugin exactly as the host does. Never unloaded.
inline LoadedPlugin load_plugin(const std::string& path) {
  LoadedPlugin p;
  bp::host::LoadedPlugin l = bp::host::load_plugin(path);
  if (l.report.status != bp::PluginReport::Status::loaded || !l.api) {
    p.error = path + ": " + l.report.decision + ": " + l.report.reason;
    return p;
  }
  p.api = l.api;
  return p;
}

// ---- Host encoding of every dtype --------------------------------------------------------------

// Float -> integer as the op catalogue's cast defines it: truncation toward zero, NaN 0,
// saturation at the int64 range.
inline int64_t trunc_i64(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return static_cast<int64_t>(v);
}

// An int64 wrapped to a narrower integer dtype (two's complement); bool is v != 0.
inline int64_t wrap_int(int32_t dtype, int64_t v) {
  switch (dtype) {
    case BP_DTYPE_I32:
      return static_cast<int32_t>(static_cast<uint32_t>(v));
    case BP_DTYPE_U8:
      return static_cast<uint8_t>(v);
    case BP_DTYPE_BOOL:
      return v != 0;
    default:
      return v;
  }
}

// Writes x as one element of `dtype` at p: round to nearest for floats, trunc_i64 then wrap_int
// for integers, x != 0 for bool.
inline void encode(int32_t dtype, double x, void* p) {
  auto put = [p](auto v) { std::memcpy(p, &v, sizeof v); };
  switch (dtype) {
    case BP_DTYPE_F32:
      put(static_cast<float>(x));
      break;
    case BP_DTYPE_F64:
      put(x);
      break;
    case BP_DTYPE_F16:
      put(bp_float_to_f16(static_cast<float>(x)));
      break;
    case BP_DTYPE_BF16:
      put(bp_float_to_bf16(static_cast<float>(x)));
      break;
    case BP_DTYPE_I32:
      put(static_cast<int32_t>(wrap_int(dtype, trunc_i64(x))));
      break;
    case BP_DTYPE_I64:
      put(trunc_i64(x));
      break;
    case BP_DTYPE_U8:
      put(static_cast<uint8_t>(wrap_int(dtype, trunc_i64(x))));
      break;
    default:
      put(static_cast<uint8_t>(x != 0.0));
      break;
  }
}

// One element of `dtype` at p as a double.
inline double decode(int32_t dtype, const void* p) {
  return bp_load_element(p, dtype, 0);
}

// The value `dtype` stores for x (encode then decode).
inline double quantize(int32_t dtype, double x) {
  unsigned char b[8];
  encode(dtype, x, b);
  return decode(dtype, b);
}

}  // namespace bp_test

#endif  // BACKPLANE_TEST_PLUGIN_TEST_HPP_

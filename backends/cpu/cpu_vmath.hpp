// Vectorised transcendental functions for the CPU kernels, from SLEEF, on dense arrays; and
// the f32 sums (Note [CPU f32 sums]) that need wider vectors than the x86-64 baseline has.
//
// Note [CPU vector math]
//   exp, log, tanh, sigmoid, sin, cos, erf and pow of f32 and f64 go through SLEEF's vector
//   functions of its 1.0-ulp family (Sleef_expf16_u10avx512f, Sleef_expf8_u10avx2,
//   Sleef_expf4_u10sse2, ...; sigmoid is 1 / (1 + exp(-x)) on those vectors). The loops exist three
//   times, in cpu_vmath_sse2.cpp (the x86-64 baseline), cpu_vmath_avx2.cpp (compiled with -mavx2
//   -mfma) and cpu_vmath_avx512.cpp (-mavx512f); the first call picks the widest one the CPU and
//   the OS support (__builtin_cpu_supports), so the plugin runs on any x86-64 machine.
//   BACKPLANE_CPU_ISA=sse2|avx2|avx512 caps the choice (the tests run every level; asking for
//   a level the CPU lacks falls back to the widest it has). Those three files are compiled with
//   different instruction sets, so they use only intrinsics, SLEEF and their own functions with
//   internal linkage: an inline function shared with other files (anything from <algorithm>,
//   say) could be merged by the linker into one copy that uses AVX-512 everywhere.
//   Every element of every layout (dense, strided, broadcast, f16/bf16 through f32 chunks) goes
//   through these functions, so a value gives the same result whatever its layout.
//   Accuracy against the float64 (long double for f64) reference, README "Vector math".
//
// Note [CPU f32 sums]
//   Dense f32 sums and sums of squares add blocks of 16 x 8 vectors' worth of floats (2048 with
//   AVX-512) in eight float vector accumulators, 16 elements a lane, combine the eight pairwise,
//   and add each block's lanes into double accumulators. A float add per element keeps the loop
//   at the cache's bandwidth (converting every element to double held a 16-thread Xeon's
//   in-cache sum of 2^26 floats to ~100 GB/s, against ~280 GB/s this way and PyTorch's ~170),
//   and the error stays below 20 float roundings (20 * 2^-24) of the sum of magnitudes at any
//   length, since no float accumulator ever takes more than 19 additions (tested in
//   cpu_vmath_test). PyTorch's CPU sum accumulates f32 in float too (cascade sum).
#ifndef BACKPLANE_CPU_VMATH_HPP_
#define BACKPLANE_CPU_VMATH_HPP_

#include <cstdint>

namespace bp::cpu::vmath {

enum Fn : int { kExp, kLog, kTanh, kSigmoid, kSin, kCos, kErf, kNumFns };

// One instruction-set level's loops. out[i] = f(in[i]) / pow(a[i], b[i]) for i < n; in and
// out may be the same array (in place) but must not overlap otherwise.
struct Table {
  const char* isa;  // "avx512", "avx2", "sse2"
  void (*unary_f32[kNumFns])(const float* in, float* out, int64_t n);
  void (*unary_f64[kNumFns])(const double* in, double* out, int64_t n);
  void (*pow_f32)(const float* a, const float* b, float* out, int64_t n);
  void (*pow_f64)(const double* a, const double* b, double* out, int64_t n);
  // Sum and sum of squares of n floats (Note [CPU f32 sums]).
  double (*sum_f32)(const float* p, int64_t n);
  double (*sumsq_f32)(const float* p, int64_t n);
};

// The tables of cpu_vmath_<isa>.cpp.
extern const Table kSse2Table;
extern const Table kAvx2Table;
extern const Table kAvx512Table;

// The table in use: chosen once (thread-safe), as Note [CPU vector math] says.
const Table& table();

inline void unary(Fn f, const float* in, float* out, int64_t n) {
  table().unary_f32[f](in, out, n);
}
inline void unary(Fn f, const double* in, double* out, int64_t n) {
  table().unary_f64[f](in, out, n);
}
inline void pow(const float* a, const float* b, float* out, int64_t n) {
  table().pow_f32(a, b, out, n);
}
inline void pow(const double* a, const double* b, double* out, int64_t n) {
  table().pow_f64(a, b, out, n);
}

inline double sum(const float* p, int64_t n) {
  return table().sum_f32(p, n);
}
inline double sum_of_squares(const float* p, int64_t n) {
  return table().sumsq_f32(p, n);
}

}  // namespace bp::cpu::vmath

#endif  // BACKPLANE_CPU_VMATH_HPP_

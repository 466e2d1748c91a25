// SLEEF's vector math for sse2, compiled with the x86-64 baseline (SSE2). Note [CPU vector math] in
// cpu_vmath.hpp: this file may use nothing but intrinsics, SLEEF and cpu_vmath_impl.inc.
#include "cpu_vmath.hpp"

#include <immintrin.h>
#include <sleef.h>

#define BP_VM_TABLE kSse2Table
#define BP_VM_ISA "sse2"
#define BP_VM_SLEEF_F(fn) Sleef_##fn##f4_u10sse2
#define BP_VM_SLEEF_D(fn) Sleef_##fn##d2_u10sse2

namespace {

using VF = __m128;
using VD = __m128d;
constexpr int kWF = 4, kWD = 2;

inline VF loadf(const float* p) {
  return _mm_loadu_ps(p);
}
inline void storef(float* p, VF v) {
  _mm_storeu_ps(p, v);
}
inline VF set1f(float v) {
  return _mm_set1_ps(v);
}
inline VF addf(VF a, VF b) {
  return _mm_add_ps(a, b);
}
inline VF divf(VF a, VF b) {
  return _mm_div_ps(a, b);
}
inline VF absf(VF x) {
  return _mm_andnot_ps(_mm_set1_ps(-0.0f), x);
}
// x < 0 ? neg : pos, lane by lane
inline VF select_negf(VF x, VF neg, VF pos) {
  const VF m = _mm_cmplt_ps(x, _mm_setzero_ps());
  return _mm_or_ps(_mm_and_ps(m, neg), _mm_andnot_ps(m, pos));
}
inline VD loadd(const double* p) {
  return _mm_loadu_pd(p);
}
inline void stored(double* p, VD v) {
  _mm_storeu_pd(p, v);
}
inline VD set1d(double v) {
  return _mm_set1_pd(v);
}
inline VD addd(VD a, VD b) {
  return _mm_add_pd(a, b);
}
inline VD divd(VD a, VD b) {
  return _mm_div_pd(a, b);
}
inline VD absd(VD x) {
  return _mm_andnot_pd(_mm_set1_pd(-0.0), x);
}
inline VD select_negd(VD x, VD neg, VD pos) {
  const VD m = _mm_cmplt_pd(x, _mm_setzero_pd());
  return _mm_or_pd(_mm_and_pd(m, neg), _mm_andnot_pd(m, pos));
}

// Adds p[0..4) to two double accumulators (4 floats per step).
inline void widen_add(const float* p, VD& a, VD& b) {
  const VF x = _mm_loadu_ps(p);
  a = _mm_add_pd(a, _mm_cvtps_pd(x));
  b = _mm_add_pd(b, _mm_cvtps_pd(_mm_movehl_ps(x, x)));
}
inline double hsumd(VD v) {
  alignas(16) double t[2];
  _mm_store_pd(t, v);
  return t[0] + t[1];
}
inline VD zerod() {
  return _mm_setzero_pd();
}

}  // namespace

#include "cpu_vmath_impl.inc"

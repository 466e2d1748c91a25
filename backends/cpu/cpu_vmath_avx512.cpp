// SLEEF's vector math for avx512, compiled with -mavx512f (CMakeLists.txt). Note [CPU vector math]
// in cpu_vmath.hpp: this file may use nothing but intrinsics, SLEEF and cpu_vmath_impl.inc.
#include "cpu_vmath.hpp"

// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized in _mm512_cvtps_pd (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <sleef.h>

#define BP_VM_TABLE kAvx512Table
#define BP_VM_ISA "avx512"
#define BP_VM_SLEEF_F(fn) Sleef_##fn##f16_u10avx512f
#define BP_VM_SLEEF_D(fn) Sleef_##fn##d8_u10avx512f

namespace {

using VF = __m512;
using VD = __m512d;
constexpr int kWF = 16, kWD = 8;

inline VF loadf(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void storef(float* p, VF v) {
  _mm512_storeu_ps(p, v);
}
inline VF set1f(float v) {
  return _mm512_set1_ps(v);
}
inline VF addf(VF a, VF b) {
  return _mm512_add_ps(a, b);
}
inline VF divf(VF a, VF b) {
  return _mm512_div_ps(a, b);
}
inline VF absf(VF x) {
  return _mm512_abs_ps(x);
}
// x < 0 ? neg : pos, lane by lane
inline VF select_negf(VF x, VF neg, VF pos) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), pos, neg);
}
inline VD loadd(const double* p) {
  return _mm512_loadu_pd(p);
}
inline void stored(double* p, VD v) {
  _mm512_storeu_pd(p, v);
}
inline VD set1d(double v) {
  return _mm512_set1_pd(v);
}
inline VD addd(VD a, VD b) {
  return _mm512_add_pd(a, b);
}
inline VD divd(VD a, VD b) {
  return _mm512_div_pd(a, b);
}
inline VD absd(VD x) {
  return _mm512_abs_pd(x);
}
inline VD select_negd(VD x, VD neg, VD pos) {
  return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_LT_OQ), pos, neg);
}

// Adds p[0..16) to two double accumulators (16 floats per step).
inline void widen_add(const float* p, VD& a, VD& b) {
  a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm256_loadu_ps(p)));
  b = _mm512_add_pd(b, _mm512_cvtps_pd(_mm256_loadu_ps(p + 8)));
}
inline double hsumd(VD v) {
  alignas(64) double t[8];
  _mm512_store_pd(t, v);
  return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}
inline VD zerod() {
  return _mm512_setzero_pd();
}

}  // namespace

#include "cpu_vmath_impl.inc"

// SLEEF's vector math for avx2, compiled with -mavx2 -mfma (CMakeLists.txt). Note [CPU vector math]
// in cpu_vmath.hpp: this file may use nothing but intrinsics, SLEEF and cpu_vmath_impl.inc.
#include "cpu_vmath.hpp"

#include <immintrin.h>
#include <sleef.h>

#define BP_VM_TABLE kAvx2Table
#define BP_VM_ISA "avx2"
#define BP_VM_SLEEF_F(fn) Sleef_##fn##f8_u10avx2
#define BP_VM_SLEEF_D(fn) Sleef_##fn##d4_u10avx2

namespace {

using VF = __m256;
using VD = __m256d;
constexpr int kWF = 8, kWD = 4;

inline VF loadf(const float* p) {
  return _mm256_loadu_ps(p);
}
inline void storef(float* p, VF v) {
  _mm256_storeu_ps(p, v);
}
inline VF set1f(float v) {
  return _mm256_set1_ps(v);
}
inline VF addf(VF a, VF b) {
  return _mm256_add_ps(a, b);
}
inline VF divf(VF a, VF b) {
  return _mm256_div_ps(a, b);
}
inline VF absf(VF x) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}
// x < 0 ? neg : pos, lane by lane
inline VF select_negf(VF x, VF neg, VF pos) {
  const VF m = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_or_ps(_mm256_and_ps(m, neg), _mm256_andnot_ps(m, pos));
}
inline VD loadd(const double* p) {
  return _mm256_loadu_pd(p);
}
inline void stored(double* p, VD v) {
  _mm256_storeu_pd(p, v);
}
inline VD set1d(double v) {
  return _mm256_set1_pd(v);
}
inline VD addd(VD a, VD b) {
  return _mm256_add_pd(a, b);
}
inline VD divd(VD a, VD b) {
  return _mm256_div_pd(a, b);
}
inline VD absd(VD x) {
  return _mm256_andnot_pd(_mm256_set1_pd(-0.0), x);
}
inline VD select_negd(VD x, VD neg, VD pos) {
  const VD m = _mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_LT_OQ);
  return _mm256_or_pd(_mm256_and_pd(m, neg), _mm256_andnot_pd(m, pos));
}

// Adds p[0..8) to two double accumulators (8 floats per step).
inline void widen_add(const float* p, VD& a, VD& b) {
  a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm_loadu_ps(p)));
  b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm_loadu_ps(p + 4)));
}
inline double hsumd(VD v) {
  alignas(32) double t[4];
  _mm256_store_pd(t, v);
  return (t[0] + t[2]) + (t[1] + t[3]);
}
inline VD zerod() {
  return _mm256_setzero_pd();
}

}  // namespace

#include "cpu_vmath_impl.inc"

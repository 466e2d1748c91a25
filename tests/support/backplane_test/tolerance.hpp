// The one tolerance table of Backplane's tests: what every comparison with a float64 reference
// allows a result of each dtype and op class (Note [Tolerance over the whole range] in
// compare.hpp says how it is applied: relative above the dtype's smallest normal, absolute --
// rtol * smallest normal, a fixed number of subnormal spacings -- below it). bp-conformance,
// tests/support's compare.hpp and the backends' test programs all read it from here; a test
// that needs more (a statistic, a long chain of ops) says so with Tolerance::scale or atol at
// the call, never with a number of its own for a dtype.
//
// Header-only, constexpr, no state.
#ifndef BACKPLANE_TEST_TOLERANCE_HPP_
#define BACKPLANE_TEST_TOLERANCE_HPP_

#include <backplane/abi/plugin_abi.h>

#include <cstdint>
#include <initializer_list>

namespace bp_test {

// Format facts of a floating dtype: unit roundoff spacing at 1 (eps), smallest positive normal
// and smallest positive subnormal. All zero for integer and bool dtypes.
struct FloatFormat {
  double eps = 0, min_normal = 0, denorm_min = 0;
};

constexpr FloatFormat float_format(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F16:  // 1 + 10 bits, exponent bias 15
      return {0x1p-10, 0x1p-14, 0x1p-24};
    case BP_DTYPE_BF16:  // 1 + 7 bits, float's exponent
      return {0x1p-7, 0x1p-126, 0x1p-133};
    case BP_DTYPE_F32:
      return {0x1p-23, 0x1p-126, 0x1p-149};
    case BP_DTYPE_F64:
      return {0x1p-52, 0x1p-1022, 0x1p-1074};
    default:
      return {};
  }
}

constexpr bool is_float_dtype(int32_t dtype) {
  return dtype == BP_DTYPE_F32 || dtype == BP_DTYPE_F64 || dtype == BP_DTYPE_F16 ||
         dtype == BP_DTYPE_BF16;
}

// What produced a result, as far as its error is concerned.
enum class OpClass {
  // One rounding of an exact or correctly computed value (fill, copy, cast, arithmetic,
  // comparisons, where), or a transcendental function's approximation (exp, log, tanh, ...);
  // also random numbers' transforms of the Philox stream.
  elementwise,
  // An accumulation whose reference carries the magnitude of its terms (sum, mean, max; see
  // Tolerance::magnitude): the same rtol, measured against that magnitude.
  reduction,
  // A matrix product: K products accumulated in the kernel's order and blocking; f32 may use
  // fused multiply-adds and a different association than the float64 reference.
  matmul,
};

// The table: relative tolerance of a result of `dtype` from an op of class `c`; 0 (exact) for
// integer and bool dtypes.
//                elementwise  reduction  matmul
//   f16          2e-3         2e-3       2e-3     (2.05 eps)
//   bf16         1e-2         1e-2       1e-2     (1.28 eps)
//   f32          1e-5         1e-5       1e-4     (84 eps: transcendental approximations)
//   f64          1e-12        1e-12      1e-12
constexpr double rtol(int32_t dtype, OpClass c = OpClass::elementwise) {
  switch (dtype) {
    case BP_DTYPE_F16:
      return 2e-3;
    case BP_DTYPE_BF16:
      return 1e-2;
    case BP_DTYPE_F32:
      return c == OpClass::matmul ? 1e-4 : 1e-5;
    case BP_DTYPE_F64:
      return 1e-12;
    default:
      return 0;
  }
}

// The elementwise entry: one result computed in at least its own precision and rounded once.
constexpr double default_rtol(int32_t dtype) {
  return rtol(dtype, OpClass::elementwise);
}

// A correctly rounded result must pass: every entry is at least one unit of roundoff.
constexpr bool table_covers_rounding() {
  for (int32_t dt : {BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F32, BP_DTYPE_F64})
    for (OpClass c : {OpClass::elementwise, OpClass::reduction, OpClass::matmul})
      if (rtol(dt, c) < float_format(dt).eps) return false;
  return true;
}
static_assert(table_covers_rounding(),
              "Note [Tolerance over the whole range]: a correctly rounded result must pass");

}  // namespace bp_test

#endif  // BACKPLANE_TEST_TOLERANCE_HPP_

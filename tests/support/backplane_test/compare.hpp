// The one numerical comparison of every Backplane test suite and of bp-conformance: a device
// result against a float64 reference, with a tolerance that is right for the result's dtype over
// its whole range (Note [Tolerance over the whole range]).
//
// Header-only, no test framework: it returns a verdict with a message, and gtest_compare.hpp
// turns that into a gtest assertion. Thread-safe (no state).
//
// Note [Tolerance over the whole range]
//   A relative tolerance cannot hold near zero: a result that is correctly rounded to f16 but
//   lands on a subnormal (|x| < 2^-14) can be off from the float64 reference by half the
//   subnormal spacing 2^-24, which is a large relative error (issue 17: mean_f16 = 8.46e-06
//   against 8.49e-06). So every element is measured against its scale
//
//       scale_i = max(|ref_i|, magnitude_i, smallest normal of the dtype)
//
//   i.e. relative above the smallest normal and absolute (rtol * smallest normal, a fixed
//   number of subnormal spacings) below it. magnitude_i is optional: tests of accumulations
//   (reductions, matmul) pass the L2 norm of the terms that produced element i, so a sum that
//   cancels to near zero is judged against the size of what was summed, not against its
//   cancelled result. The verdict is the norm form of docs/hardening.md,
//
//       ||got - ref||_2 <= rtol * ||scale||_2          (Mode::kNorm, the default)
//
//   or |got_i - ref_i| <= rtol * scale_i for every element (Mode::kElementwise). The rtol comes
//   from the one table of tolerance.hpp (per dtype and op class). Every rtol there is at least
//   one unit of roundoff of its dtype (eps, checked there), so a result within
//   half an ulp of the reference -- any correctly rounded result, subnormal or not -- passes in
//   both modes by construction: |got_i - ref_i| <= eps/2 * max(|ref_i|, smallest normal).
//   NaN must meet NaN and an infinity the same infinity, in place. Integer and bool dtypes
//   compare exactly.
#ifndef BACKPLANE_TEST_COMPARE_HPP_
#define BACKPLANE_TEST_COMPARE_HPP_

#include <backplane/abi/plugin_abi.h>
#include <backplane_test/tolerance.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace bp_test {

enum class Mode { kNorm, kElementwise };

struct Tolerance {
  double rtol = -1;  // < 0: rtol(dtype, op_class) * scale (tolerance.hpp, the one table)
  OpClass op_class = OpClass::elementwise;
  double scale = 1;  // multiplies the default rtol (accumulation orders, approximations)
  double atol = 0;   // an absolute allowance added to every element (statistical checks)
  Mode mode = Mode::kNorm;
  // Optional, one per element: the L2 norm of the terms accumulated into it (reductions,
  // matmul). Empty: the reference's own magnitude.
  std::span<const double> magnitude = {};
};

struct Verdict {
  bool ok = true;
  std::string message;  // why not, naming the dtype, the error and the worst element
  double error = 0;     // relative error (kNorm) or worst error/allowance ratio (kElementwise)
  double rtol = 0;      // the tolerance applied
  explicit operator bool() const { return ok; }
};

namespace detail {

inline std::string num(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

inline std::string element(size_t i, double got, double ref) {
  return "element " + std::to_string(i) + ": got " + num(got) + ", expected " + num(ref);
}

inline const char* dtype_name(int32_t dtype) {
  return bp_dtype_name(dtype);
}

}  // namespace detail

// The scale element i is measured against (Note [Tolerance over the whole range]).
inline double scale_of(int32_t dtype, double ref, double magnitude = 0) {
  return std::max({std::fabs(ref), std::fabs(magnitude), float_format(dtype).min_normal});
}

// Compares `got` with the float64 reference `ref` as results of `dtype`.
inline Verdict compare(int32_t dtype, std::span<const double> got, std::span<const double> ref,
                       const Tolerance& tol = {}) {
  Verdict v;
  const char* dn = detail::dtype_name(dtype);
  if (got.size() != ref.size()) {
    v.ok = false;
    v.message = std::string(dn) + ": " + std::to_string(got.size()) + " values, expected " +
                std::to_string(ref.size());
    return v;
  }
  if (!tol.magnitude.empty() && tol.magnitude.size() != ref.size()) {
    v.ok = false;
    v.message = "compare: " + std::to_string(tol.magnitude.size()) + " magnitudes for " +
                std::to_string(ref.size()) + " values";
    return v;
  }
  const bool fp = is_float_dtype(dtype);
  v.rtol = tol.rtol >= 0 ? tol.rtol : rtol(dtype, tol.op_class) * tol.scale;
  if (!fp && tol.atol == 0 && tol.rtol <= 0) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool same = got[i] == ref[i] || (std::isnan(got[i]) && std::isnan(ref[i]));
      if (!same && bad++ == 0) first = i;
    }
    if (bad) {
      v.ok = false;
      v.error = static_cast<double>(bad);
      v.message = std::string(dn) + ": " + std::to_string(bad) + " of " +
                  std::to_string(got.size()) + " values differ (exact dtype); first " +
                  detail::element(first, got[first], ref[first]);
    }
    return v;
  }
  long double err2 = 0, scale2 = 0, atol2 = 0;
  double worst_ratio = 0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    if (std::isnan(r) || std::isinf(r) || std::isnan(g) || std::isinf(g)) {
      const bool same = std::isnan(r) ? std::isnan(g) : g == r;
      if (!same) {
        v.ok = false;
        v.error = INFINITY;
        v.message = std::string(dn) + " " + detail::element(i, g, r) +
                    " (NaN and infinities must match in place)";
        return v;
      }
      continue;
    }
    const double s = fp ? scale_of(dtype, r, tol.magnitude.empty() ? 0 : tol.magnitude[i])
                        : std::max(std::fabs(r), tol.magnitude.empty() ? 0 : tol.magnitude[i]);
    const double d = std::fabs(g - r);
    const double allowed = v.rtol * s + tol.atol;
    const double ratio = allowed > 0 ? d / allowed : (d > 0 ? INFINITY : 0);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
    err2 += static_cast<long double>(d) * d;
    scale2 += static_cast<long double>(s) * s;
    atol2 += static_cast<long double>(tol.atol) * tol.atol;
  }
  if (tol.mode == Mode::kElementwise) {
    v.error = worst_ratio;
    v.ok = worst_ratio <= 1;
  } else {
    // ||got - ref|| <= rtol * ||scale|| + ||atol||, reported as a relative error. In long
    // double: the squares of f64 subnormals underflow in double.
    const long double err = std::sqrt(err2), sc = std::sqrt(scale2), at = std::sqrt(atol2);
    v.error = static_cast<double>(sc > 0 ? err / sc : err);
    v.ok = err <= static_cast<long double>(v.rtol) * sc + at;
  }
  if (!v.ok) {
    char b[200];
    if (tol.mode == Mode::kElementwise)
      std::snprintf(b, sizeof b, " error %.3g times the allowance (rtol %.3g, atol %.3g)", v.error,
                    v.rtol, tol.atol);
    else
      std::snprintf(b, sizeof b, " relative error %.3g > %.3g%s", v.error, v.rtol,
                    tol.atol > 0 ? " (plus atol)" : "");
    v.message = std::string(dn) + b + " over " + std::to_string(got.size()) + " values; worst " +
                detail::element(worst, got[worst], ref[worst]) + " (scale " +
                detail::num(fp ? scale_of(dtype, ref[worst],
                                          tol.magnitude.empty() ? 0 : tol.magnitude[worst])
                               : std::fabs(ref[worst])) +
                ")";
  }
  return v;
}

inline Verdict compare(int32_t dtype, const std::vector<double>& got,
                       const std::vector<double>& ref, const Tolerance& tol = {}) {
  return compare(dtype, std::span<const double>(got), std::span<const double>(ref), tol);
}

// One scalar.
inline Verdict compare_scalar(int32_t dtype, double got, double ref, const Tolerance& tol = {}) {
  return compare(dtype, std::span<const double>(&got, 1), std::span<const double>(&ref, 1), tol);
}

}  // namespace bp_test

#endif  // BACKPLANE_TEST_COMPARE_HPP_

// The shared comparison (backplane_test/compare.hpp): a correctly rounded result of any floating
// dtype passes over the whole range, subnormals included, and wrong ones fail
// (Note [Tolerance over the whole range]).
#include <backplane_test/gtest_compare.hpp>
#include <backplane_test/plugin_test.hpp>
#include <backplane_test/seed.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using bp_test::compare;
using bp_test::Mode;

const int32_t kFloats[] = {BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F32, BP_DTYPE_F64};

// The neighbour of x one step toward +inf (dir > 0) or -inf in dtype `dt`.
double step(int32_t dt, double x, int dir) {
  const double inf = dir > 0 ? INFINITY : -INFINITY;
  switch (dt) {
    case BP_DTYPE_F64:
      return std::nextafter(x, inf);
    case BP_DTYPE_F32:
      return std::nextafter(static_cast<float>(x), static_cast<float>(inf));
    default: {
      // Half types: walk the bit pattern.
      unsigned char b[8];
      bp_test::encode(dt, x, b);
      uint16_t h;
      std::memcpy(&h, b, 2);
      const bool neg = (h & 0x8000) != 0;
      if ((h & 0x7fff) == 0)
        return dir > 0 ? bp_test::float_format(dt).denorm_min
                       : -bp_test::float_format(dt).denorm_min;
      h = static_cast<uint16_t>((dir > 0) != neg ? h + 1 : h - 1);
      std::memcpy(b, &h, 2);
      return bp_test::decode(dt, b);
    }
  }
}

// Log-uniform magnitudes from the dtype's smallest subnormal to `top`, both signs; every
// fourth one in the subnormal range.
std::vector<double> spread(int32_t dt, size_t n, double top) {
  const auto fmt = bp_test::float_format(dt);
  const double lo = std::log2(fmt.denorm_min), hi = std::log2(top);
  std::uniform_real_distribution<double> e(lo, hi), sub(lo, std::log2(fmt.min_normal));
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    auto& g = bp_test::rng("bp_unit_tests");
    v[i] = std::exp2(i % 4 == 0 ? sub(g) : e(g)) * (i % 2 ? -1 : 1);
  }
  return v;
}

double top_of(int32_t dt) {
  switch (dt) {
    case BP_DTYPE_F16:
      return 30000;
    case BP_DTYPE_F64:
      return 1e300;
    default:
      return 1e37;
  }
}

TEST(Compare, TheIssue17CaseIsAccepted) {
  // mean_f16 of LargeInnerAndOuter: the correctly rounded f16 value is a subnormal.
  const double got = 8.4638595581054688e-06, ref = 8.4863218622218196e-06;
  EXPECT_GT(std::fabs(got - ref) / ref, bp_test::default_rtol(BP_DTYPE_F16))
      << "a purely relative tolerance rejects it";
  EXPECT_EQ(got, bp_test::quantize(BP_DTYPE_F16, ref));
  EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F16, got, ref));
  EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F16, got, ref, {.mode = Mode::kElementwise}));
}

TEST(Compare, CorrectlyRoundedResultsPassOverTheWholeRange) {
  for (int32_t dt : kFloats) {
    SCOPED_TRACE(bp_dtype_name(dt));
    const std::vector<double> ref = spread(dt, 20000, top_of(dt));
    std::vector<double> rounded(ref.size()), up(ref.size()), down(ref.size());
    size_t subnormal = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      rounded[i] = bp_test::quantize(dt, ref[i]);
      up[i] = step(dt, rounded[i], +1);
      down[i] = step(dt, rounded[i], -1);
      if (std::fabs(rounded[i]) < bp_test::float_format(dt).min_normal) ++subnormal;
    }
    EXPECT_GT(subnormal, ref.size() / 5) << "the spread must reach the subnormals";
    for (Mode m : {Mode::kNorm, Mode::kElementwise}) {
      EXPECT_TRUE(bp_test::all_close(dt, rounded, ref, {.mode = m}));
      // One unit in the last place either way: every default rtol is at least eps.
      EXPECT_TRUE(bp_test::all_close(dt, up, rounded, {.mode = m}));
      EXPECT_TRUE(bp_test::all_close(dt, down, rounded, {.mode = m}));
    }
  }
}

TEST(Compare, WrongResultsFail) {
  for (int32_t dt : kFloats) {
    SCOPED_TRACE(bp_dtype_name(dt));
    const auto fmt = bp_test::float_format(dt);
    const double rtol = bp_test::default_rtol(dt);
    // Normal values off by three tolerances.
    std::vector<double> ref = {1.5, -3.25, 1000, 0.125}, bad(ref);
    for (double& x : bad) x *= 1 + 3 * rtol;
    for (Mode m : {Mode::kNorm, Mode::kElementwise})
      EXPECT_FALSE(compare(dt, bad, ref, {.mode = m}).ok);
    // A subnormal result off by three times the floor.
    const double tiny = 3 * fmt.denorm_min;
    EXPECT_FALSE(compare(dt, {tiny + 3 * rtol * fmt.min_normal}, {tiny}).ok);
    // A normal value flushed to zero.
    EXPECT_FALSE(compare(dt, {0.0}, {4 * fmt.min_normal}).ok);
    // One wrong element among many fails element by element.
    std::vector<double> many(1000, 1.0), one(many);
    one[17] = 1 + 10 * rtol;
    bp_test::Verdict v = compare(dt, one, many, {.mode = Mode::kElementwise});
    EXPECT_FALSE(v.ok);
    EXPECT_NE(v.message.find("element 17"), std::string::npos) << v.message;
    EXPECT_NE(v.message.find(bp_dtype_name(dt)), std::string::npos) << v.message;
  }
}

TEST(Compare, NanAndInfinitiesMustMatchInPlace) {
  const double nan = std::nan("");
  EXPECT_TRUE(compare(BP_DTYPE_F32, {nan, INFINITY, 1}, {nan, INFINITY, 1}).ok);
  EXPECT_FALSE(compare(BP_DTYPE_F32, {1, INFINITY, 1}, {nan, INFINITY, 1}).ok);
  EXPECT_FALSE(compare(BP_DTYPE_F32, {nan, INFINITY, 1}, {nan, -INFINITY, 1}).ok);
  bp_test::Verdict v = compare(BP_DTYPE_F16, {nan}, {2.0});
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.message.find("NaN"), std::string::npos) << v.message;
}

TEST(Compare, IntegersAreExactAndSizesMustAgree) {
  for (int32_t dt : {BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8, BP_DTYPE_BOOL}) {
    EXPECT_TRUE(compare(dt, {1, 2, 3}, {1, 2, 3}).ok);
    bp_test::Verdict v = compare(dt, {1, 2, 4}, {1, 2, 3});
    EXPECT_FALSE(v.ok);
    EXPECT_NE(v.message.find("1 of 3 values differ"), std::string::npos) << v.message;
  }
  bp_test::Verdict v = compare(BP_DTYPE_F32, {1, 2}, {1, 2, 3});
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.message.find("2 values, expected 3"), std::string::npos) << v.message;
}

TEST(Compare, MagnitudeJudgesCancelledSumsByWhatWasSummed) {
  // A float sum of +-1000 terms that cancels to 1e-3: its rounding error is about the
  // accumulator's eps times the terms, not times the result.
  const double ref = 1e-3, got = 1e-3 + 2e-5;
  EXPECT_FALSE(compare(BP_DTYPE_F32, {got}, {ref}).ok);
  const std::vector<double> magnitude = {31.6};  // L2 norm of 1000 terms of size 1
  EXPECT_TRUE(compare(BP_DTYPE_F32, std::vector<double>{got}, std::vector<double>{ref},
                      {.magnitude = magnitude})
                  .ok);
}

TEST(Compare, ExplicitAbsoluteAllowance) {
  EXPECT_TRUE(compare(BP_DTYPE_F64, {0.52}, {0.5}, {.rtol = 0, .atol = 0.05}).ok);
  EXPECT_FALSE(compare(BP_DTYPE_F64, {0.56}, {0.5}, {.rtol = 0, .atol = 0.05}).ok);
}

}  // namespace

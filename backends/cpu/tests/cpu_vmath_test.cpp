// Accuracy of the CPU backend's vector math (Note [CPU vector math] in cpu_vmath.hpp), in ulp,
// against a float64 reference for f32 (long double for f64), for every instruction-set table
// this CPU can run (the others are skipped with the reason): fresh random inputs over each
// function's whole range, subnormal inputs and results, every special value, and every tail
// length. The bounds asserted here are the ones backends/cpu/README.md documents. The seed is
// printed; BP_TEST_SEED=<n> reproduces a run.
#include "../cpu_vmath.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using bp::cpu::vmath::Fn;
using bp::cpu::vmath::Table;

uint64_t seed() {
  static const uint64_t s = [] {
    uint64_t v = std::random_device{}();
    if (const char* e = std::getenv("BP_TEST_SEED")) v = std::strtoull(e, nullptr, 10);
    std::fprintf(stderr, "cpu_vmath_test: random seed %llu (rerun with BP_TEST_SEED=%llu)\n",
                 static_cast<unsigned long long>(v), static_cast<unsigned long long>(v));
    return v;
  }();
  return s;
}

// Documented bounds (ulp): SLEEF's u10 functions are within 1.0 ulp (tanh a hair above near 0:
// 1.0005 measured); sigmoid adds the rounding of 1 + exp(-|x|) and of the division (2.1
// measured); sin and cos are SLEEF's u10 with full range reduction; erf is SLEEF's u10, whose SSE2
// form (no FMA) reaches 1.53 ulp among the f32 subnormals.
constexpr double kBound[bp::cpu::vmath::kNumFns] = {1.0, 1.0, 1.01, 3.0, 1.0, 1.0, 2.0};
constexpr double kPowBound = 1.0;
const char* const kNames[] = {"exp", "log", "tanh", "sigmoid", "sin", "cos", "erf"};

// Distance of `got` from the exact value `ref` in units of ulp(ref) = 2^(floor(log2|ref|) - p + 1)
// for T's precision p; for T's subnormals the smallest spacing, so the bound is absolute
// there. NaN must give NaN; past T's largest finite value, an infinity of the right sign is
// exact.
template <class T, class R>
double ulp_error(T got, R ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0 : INFINITY;
  if (std::isnan(got)) return INFINITY;
  if (std::fabs(ref) > static_cast<R>(std::numeric_limits<T>::max()) && std::isinf(got) &&
      std::signbit(got) == std::signbit(ref))
    return 0;
  if (std::isinf(ref) || std::isinf(got)) return got == ref ? 0 : INFINITY;
  int e = 0;
  std::frexp(ref, &e);
  e = std::max(e, std::numeric_limits<T>::min_exponent);
  const R ulp = std::ldexp(R(1), e - std::numeric_limits<T>::digits);
  return static_cast<double>(std::fabs(static_cast<R>(got) - ref) / ulp);
}

long double reference(Fn f, long double x) {
  switch (f) {
    case bp::cpu::vmath::kExp:
      return std::exp(x);
    case bp::cpu::vmath::kLog:
      return std::log(x);
    case bp::cpu::vmath::kTanh:
      return std::tanh(x);
    case bp::cpu::vmath::kSin:
      return std::sin(x);
    case bp::cpu::vmath::kCos:
      return std::cos(x);
    case bp::cpu::vmath::kErf:
      return std::erf(x);
    default:
      return 1.0L / (1.0L + std::exp(-x));
  }
}

// Random inputs covering the function's domain for T, plus the special values.
template <class T>
std::vector<T> inputs(Fn f, std::mt19937_64& rng) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  std::vector<T> v;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const T tiny = std::numeric_limits<T>::denorm_min(), least = std::numeric_limits<T>::min();
  v.insert(v.end(), {T(0), -T(0), inf, -inf, nan, tiny, -tiny, least, -least, T(1), T(-1),
                     std::numeric_limits<T>::max(), std::numeric_limits<T>::lowest()});
  const bool f32 = sizeof(T) == 4;
  const T lim = f32 ? T(89) : T(710);  // just past exp's overflow
  std::uniform_real_distribution<T> wide(-lim * T(1.2), lim);
  std::uniform_real_distribution<T> small(-T(20), T(20));
  std::uniform_int_distribution<Bits> bits;
  for (int i = 0; i < 40000; ++i) {
    T x;
    if (f == bp::cpu::vmath::kLog) {  // every positive float: random bit patterns
      Bits b = bits(rng) & (std::numeric_limits<Bits>::max() >> 1);
      std::memcpy(&x, &b, sizeof x);
      if (!std::isfinite(x)) x = T(2);
      if (i % 4 == 0) x = T(0.5) + std::uniform_real_distribution<T>(0, 1)(rng);  // near 1
    } else if (f == bp::cpu::vmath::kTanh || f == bp::cpu::vmath::kErf) {
      // erf and tanh saturate past |x| ~ 4 and 9: mostly the range where they do not.
      x = f == bp::cpu::vmath::kErf && i % 3 == 1 ? std::uniform_real_distribution<T>(-5, 5)(rng)
                                                  : small(rng);
      if (i % 3 == 0) {  // tiny magnitudes, where tanh(x) ~ x and erf(x) ~ 2x / sqrt(pi)
        Bits b = bits(rng);
        std::memcpy(&x, &b, sizeof x);
        if (!std::isfinite(x) || std::fabs(x) > T(1)) x = T(0.25);
      }
    } else {
      x = i % 2 ? wide(rng) : small(rng);
    }
    v.push_back(x);
  }
  return v;
}

std::vector<const Table*> tables() {
  return {&bp::cpu::vmath::kSse2Table, &bp::cpu::vmath::kAvx2Table, &bp::cpu::vmath::kAvx512Table};
}

bool runnable(const Table& t) {
  const std::string isa = t.isa;
  if (isa == "avx512") return __builtin_cpu_supports("avx512f");
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return true;
}

class VmathTest : public ::testing::TestWithParam<const Table*> {
 protected:
  void SetUp() override {
    if (!runnable(*GetParam())) GTEST_SKIP() << "this CPU lacks " << GetParam()->isa;
  }
};

template <class T>
void check_unary(const Table& t, Fn f) {
  std::mt19937_64 rng(seed() + static_cast<uint64_t>(f) * 7919 + sizeof(T));
  const std::vector<T> x = inputs<T>(f, rng);
  std::vector<T> y(x.size());
  if constexpr (sizeof(T) == 4) {
    t.unary_f32[f](x.data(), y.data(), static_cast<int64_t>(x.size()));
  } else {
    t.unary_f64[f](x.data(), y.data(), static_cast<int64_t>(x.size()));
  }
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    // f32 against double (exact enough: its own error is 2^-29 of an f32 ulp), f64 against
    // long double.
    using R = std::conditional_t<sizeof(T) == 4, double, long double>;
    const R ref = static_cast<R>(reference(f, static_cast<long double>(x[i])));
    const double e = ulp_error<T, R>(y[i], ref);
    if (e > worst) worst = e, at = i;
  }
  std::printf("  %s %s %s: max error %.3f ulp over %zu inputs (at x = %.9g)\n", t.isa, kNames[f],
              sizeof(T) == 4 ? "f32" : "f64", worst, x.size(), static_cast<double>(x[at]));
  EXPECT_LE(worst, kBound[f]) << t.isa << " " << kNames[f] << " at x = " << x[at] << " gave "
                              << y[at];
}

TEST_P(VmathTest, UnaryF32WithinDocumentedUlp) {
  for (int f = 0; f < bp::cpu::vmath::kNumFns; ++f) check_unary<float>(*GetParam(), Fn(f));
}

TEST_P(VmathTest, UnaryF64WithinDocumentedUlp) {
  for (int f = 0; f < bp::cpu::vmath::kNumFns; ++f) check_unary<double>(*GetParam(), Fn(f));
}

template <class T>
void check_pow(const Table& t) {
  using R = std::conditional_t<sizeof(T) == 4, double, long double>;
  std::mt19937_64 rng(seed() + 31 + sizeof(T));
  std::vector<T> a, b;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  // Special pairs of C's pow: pow(x, 0) = 1 even for NaN, pow(1, y) = 1, negative bases with
  // integer exponents, zeros and infinities.
  const T sa[] = {T(0), -T(0), T(1), T(-1), T(2), T(-2), inf, -inf, nan, T(0.5)};
  const T sb[] = {T(0), T(1), T(2), T(3), T(-1), T(-2), T(0.5), inf, -inf, nan};
  for (T x : sa)
    for (T y : sb) a.push_back(x), b.push_back(y);
  std::uniform_real_distribution<T> lg(-20, 20), ex(-6, 6), base(-50, 50);
  std::uniform_int_distribution<int> integer(-12, 12);
  for (int i = 0; i < 40000; ++i) {
    if (i % 4 == 0) {  // negative bases need integer exponents
      a.push_back(base(rng));
      b.push_back(T(integer(rng)));
    } else {
      a.push_back(std::exp2(lg(rng)));
      b.push_back(ex(rng));
    }
  }
  std::vector<T> y(a.size());
  if constexpr (sizeof(T) == 4) {
    t.pow_f32(a.data(), b.data(), y.data(), static_cast<int64_t>(a.size()));
  } else {
    t.pow_f64(a.data(), b.data(), y.data(), static_cast<int64_t>(a.size()));
  }
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const R ref =
        static_cast<R>(std::pow(static_cast<long double>(a[i]), static_cast<long double>(b[i])));
    const double e = ulp_error<T, R>(y[i], ref);
    if (e > worst) worst = e, at = i;
  }
  std::printf("  %s pow %s: max error %.3f ulp over %zu inputs (at %.9g ^ %.9g)\n", t.isa,
              sizeof(T) == 4 ? "f32" : "f64", worst, a.size(), static_cast<double>(a[at]),
              static_cast<double>(b[at]));
  EXPECT_LE(worst, kPowBound) << t.isa << " pow(" << a[at] << ", " << b[at] << ") gave " << y[at];
}

TEST_P(VmathTest, PowWithinDocumentedUlp) {
  check_pow<float>(*GetParam());
  check_pow<double>(*GetParam());
}

// Every length from 0 to three vectors, in place and out of place: the tail path computes what
// the vector path does, and nothing past n is written.
TEST_P(VmathTest, TailsAndInPlaceMatchTheVectorPath) {
  const Table& t = *GetParam();
  std::mt19937_64 rng(seed() + 97);
  std::uniform_real_distribution<float> u(-5, 5);
  std::vector<float> x(64 + 8), full(64 + 8);
  for (float& v : x) v = u(rng);
  for (int f = 0; f < bp::cpu::vmath::kNumFns; ++f) {
    // log of negative numbers is NaN; compare bit patterns of |x| there
    std::vector<float> in = x;
    if (f == bp::cpu::vmath::kLog)
      for (float& v : in) v = std::fabs(v) + 0.01f;
    t.unary_f32[f](in.data(), full.data(), 64);
    for (int64_t n = 0; n <= 48; ++n) {
      std::vector<float> out(n + 8, 12345.0f);
      t.unary_f32[f](in.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(std::memcmp(&out[i], &full[i], 4), 0) << kNames[f] << " n=" << n << " i=" << i;
      for (int64_t i = n; i < n + 8; ++i) ASSERT_EQ(out[i], 12345.0f) << "wrote past n=" << n;
      std::vector<float> inplace(in.begin(), in.begin() + n);
      t.unary_f32[f](inplace.data(), inplace.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(std::memcmp(&inplace[i], &full[i], 4), 0);
    }
  }
}

// f32 sums and sums of squares (Note [CPU f32 sums]): against a long double sum, the error stays
// below 20 float roundings (20 * 2^-24) of the sum of magnitudes for every length (tails
// included) up to 2^20, on values spread over 2^-20..2^20 of both signs and on positive values
// near 1 (where one float accumulator per lane over 2^20 elements would miss the bound).
TEST_P(VmathTest, SumsStayWithinTwentyRoundings) {
  const Table& t = *GetParam();
  std::mt19937_64 rng(seed() + 211);
  std::uniform_real_distribution<float> u(-1, 1), pos(0.5f, 1.0f);
  std::uniform_int_distribution<int> ex(-20, 20);
  std::vector<float> spread(1 << 20), near_one(1 << 20);
  for (float& v : spread) v = std::ldexp(u(rng), ex(rng));
  for (float& v : near_one) v = pos(rng);
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 70; ++n) lengths.push_back(n);
  lengths.insert(lengths.end(), {1000, 2047, 2048, 2049, 4097, 65536 + 13, int64_t(1) << 20});
  const long double bound = 20.0L * std::ldexp(1.0L, -24);
  for (const std::vector<float>* data : {&spread, &near_one}) {
    const float* x = data->data();
    for (int64_t n : lengths) {
      long double ref = 0, ref_sq = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += x[i];
        ref_sq += static_cast<long double>(x[i]) * x[i];
        mag += std::fabs(static_cast<long double>(x[i]));
      }
      const char* which = data == &spread ? "spread" : "near one";
      EXPECT_LE(std::fabs(t.sum_f32(x, n) - ref), bound * mag)
          << t.isa << " " << which << " n=" << n;
      EXPECT_LE(std::fabs(t.sumsq_f32(x, n) - ref_sq), bound * ref_sq)
          << t.isa << " " << which << " n=" << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, VmathTest, ::testing::ValuesIn(tables()),
                         [](const ::testing::TestParamInfo<const Table*>& i) {
                           return std::string(i.param->isa);
                         });

TEST(VmathDispatch, ChoosesARunnableTable) {
  const Table& t = bp::cpu::vmath::table();
  EXPECT_TRUE(runnable(t)) << t.isa;
  std::printf("  dispatched to %s\n", t.isa);
}

}  // namespace

// nn::cross_entropy with its options on every device: the fused op (catalogue cross_entropy,
// Note [Fused cross entropy]) against a float64 host reference of the loss and its gradient for
// every reduction, ignore_index and label_smoothing, [N, C, d] logits, f16/bf16 logits under
// autocast (no cast of the logits), the launches a step makes, and the errors.
#include "nn_test_support.hpp"

#include <backplane/autocast.hpp>
#include <backplane/profiler.hpp>
#include <backplane/train.hpp>
#include <backplane_test/throws.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace {

using bp::DType;
using bp::Shape;
using bp::Tensor;
using bp::nn::CrossEntropyOptions;

class CrossEntropyTest : public ::testing::TestWithParam<std::string> {
 protected:
  bp::Device& dev() { return bp::device(GetParam()); }
};

// Per-row loss and d(loss_row)/d(x) of row-major logits x [n, c] with targets t, in float64.
struct Reference {
  std::vector<double> rows, grad;  // grad: d rows[r] / d x[r, k], written per row
};

Reference reference(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t n,
                    int64_t c, const CrossEntropyOptions& o) {
  Reference r{std::vector<double>(static_cast<size_t>(n)),
              std::vector<double>(static_cast<size_t>(n * c))};
  const double e = o.label_smoothing;
  for (int64_t i = 0; i < n; ++i) {
    const double* xr = &x[static_cast<size_t>(i * c)];
    double m = -std::numeric_limits<double>::infinity(), s = 0, sx = 0;
    for (int64_t k = 0; k < c; ++k) m = std::max(m, xr[k]);
    for (int64_t k = 0; k < c; ++k) s += std::exp(xr[k] - m), sx += xr[k];
    const double lse = m + std::log(s);
    const int64_t ti = t[static_cast<size_t>(i)];
    if (ti == o.ignore_index) continue;  // loss 0, gradient 0
    r.rows[static_cast<size_t>(i)] = lse - (1 - e) * xr[ti] - e / static_cast<double>(c) * sx;
    for (int64_t k = 0; k < c; ++k)
      r.grad[static_cast<size_t>(i * c + k)] =
          std::exp(xr[k] - lse) - (1 - e) * (k == ti ? 1 : 0) - e / static_cast<double>(c);
  }
  return r;
}

std::vector<int64_t> random_targets(int64_t n, int64_t c, int64_t ignore_index, int ignored) {
  std::mt19937_64 g(static_cast<uint64_t>(bp_test::test_seed()) + static_cast<uint64_t>(n * c));
  std::uniform_int_distribution<int64_t> cls(0, c - 1);
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = cls(g);
  for (int k = 0; k < ignored && k < n; ++k) t[static_cast<size_t>(k * 3 % n)] = ignore_index;
  return t;
}

// Loss and logits gradient for one option set against the reference; the gradient of 'mean'
// and 'sum' is d(total)/dx, of 'none' d(sum of rows * w)/dx with random row weights w.
void check(bp::Device& dev, int64_t n, int64_t c, const CrossEntropyOptions& o, int ignored) {
  SCOPED_TRACE("n=" + std::to_string(n) + " c=" + std::to_string(c) + " reduction=" + o.reduction +
               " ignore_index=" + std::to_string(o.ignore_index) +
               " label_smoothing=" + std::to_string(o.label_smoothing));
  std::vector<double> xv = nntest::as_f32(nntest::random_values(static_cast<size_t>(n * c), -4, 4));
  std::vector<int64_t> tv = random_targets(n, c, o.ignore_index, ignored);
  Reference ref = reference(xv, tv, n, c, o);
  Tensor x = nntest::make(xv, {n, c}, dev).requires_grad_(true);
  Tensor t = bp::from_vector(tv, {n}, dev);
  Tensor loss = bp::nn::cross_entropy(x, t, o);
  int64_t kept = 0;
  for (int64_t v : tv) kept += v != o.ignore_index;
  std::vector<double> w(static_cast<size_t>(n), 1.0);
  double scale = 1.0;
  if (o.reduction == "none") {
    ASSERT_EQ(loss.shape(), Shape({n}));
    EXPECT_TRUE(nntest::close(loss.to_vector<double>(), ref.rows, 2e-5));
    w = nntest::random_values(static_cast<size_t>(n));
    loss.backward(nntest::make(w, {n}, dev));
  } else {
    ASSERT_EQ(loss.rank(), 0);
    double total = 0;
    for (double v : ref.rows) total += v;
    if (o.reduction == "mean") scale = 1.0 / static_cast<double>(kept);
    EXPECT_TRUE(nntest::close({loss.item<double>()}, {total * scale}, 2e-5));
    loss.backward();
  }
  std::vector<double> want(ref.grad.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k) {
      const auto at = static_cast<size_t>(i * c + k);
      want[at] = ref.grad[at] * w[static_cast<size_t>(i)] * scale;
    }
  EXPECT_TRUE(nntest::close(x.grad().to_vector<double>(), want, 2e-5));
}

TEST_P(CrossEntropyTest, EveryReductionIgnoreIndexAndSmoothingMatchTheReference) {
  for (const char* red : {"mean", "sum", "none"}) {
    check(dev(), 7, 5, {red, -100, 0.0}, 0);
    check(dev(), 9, 13, {red, -100, 0.0}, 2);   // rows with torch's default ignore_index
    check(dev(), 6, 4, {red, 2, 0.1}, 1);       // an ignore_index that is also a class
    check(dev(), 5, 1100, {red, -1, 0.25}, 1);  // wider than a warp's rows on cuda
    check(dev(), 3, 7, {red, -100, 1.0}, 0);
  }
  check(dev(), 1, 1, {"mean", -100, 0.0}, 0);  // one class: loss 0, gradient 0
}

// Logits [N, C, d]: the classes on dim 1, one target per (n, d), as torch.
TEST_P(CrossEntropyTest, ClassesOnDimOneOfHigherRankLogits) {
  const int64_t n = 3, c = 4, d = 5;
  std::vector<double> xv = nntest::as_f32(nntest::random_values(n * c * d));
  std::vector<int64_t> tv = random_targets(n * d, c, -100, 2);
  // Rows (n, j) of the [N, d, C] transpose for the reference.
  std::vector<double> rows_x(static_cast<size_t>(n * d * c));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t j = 0; j < d; ++j)
        rows_x[static_cast<size_t>((i * d + j) * c + k)] =
            xv[static_cast<size_t>((i * c + k) * d + j)];
  Reference ref = reference(rows_x, tv, n * d, c, {"none", -100, 0.0});
  Tensor x = nntest::make(xv, {n, c, d}, dev());
  Tensor t = bp::from_vector(tv, {n, d}, dev());
  Tensor none = bp::nn::cross_entropy(x, t, {"none", -100, 0.0});
  ASSERT_EQ(none.shape(), Shape({n, d}));
  EXPECT_TRUE(nntest::close(none.to_vector<double>(), ref.rows, 2e-5));
  double total = 0;
  for (double v : ref.rows) total += v;
  EXPECT_TRUE(nntest::close({bp::nn::cross_entropy(x, t).item<double>()},
                            {total / static_cast<double>(n * d - 2)}, 2e-5));
}

// 'mean' over only ignored rows is 0 / 0, as torch.
TEST_P(CrossEntropyTest, MeanOfOnlyIgnoredRowsIsNaN) {
  Tensor x = nntest::make(nntest::random_values(12), {3, 4}, dev());
  Tensor t = bp::from_vector(std::vector<int64_t>{-100, -100, -100}, {3}, dev());
  EXPECT_TRUE(std::isnan(bp::nn::cross_entropy(x, t).item<double>()));
  EXPECT_EQ(bp::nn::cross_entropy(x, t, {"sum", -100, 0.0}).item<double>(), 0.0);
}

// Large logits stay finite (the row maximum is subtracted); a -inf logit off the target adds
// nothing.
TEST_P(CrossEntropyTest, LargeAndMinusInfiniteLogits) {
  std::vector<double> xv = {1e4, -1e4, 3.0, -std::numeric_limits<double>::infinity(), 2.0, 1.0};
  Tensor x = nntest::make(xv, {2, 3}, dev());
  Tensor t = bp::from_vector(std::vector<int64_t>{0, 1}, {2}, dev());
  std::vector<double> got = bp::nn::cross_entropy(x, t, {"none", -100, 0.0}).to_vector<double>();
  const double want1 = std::log(std::exp(2.0) + std::exp(1.0)) - 2.0;
  EXPECT_TRUE(nntest::close(got, {0.0, want1}, 1e-5));
}

// Under autocast, f16/bf16 logits go to the fused op as they are: the loss is f32 (autocast's
// f32 policy), the gradient keeps the logits' dtype, and nothing casts the [N, C] logits.
TEST_P(CrossEntropyTest, HalfLogitsUnderAutocastAreNotCast) {
  if (!dev().supports(bp::Op::cross_entropy, DType::bf16)) GTEST_SKIP() << "no fused op";
  for (DType dt : {DType::bf16, DType::f16}) {
    const int64_t n = 6, c = 40;
    std::vector<double> xv = nntest::random_values(n * c, -3, 3);
    Tensor x = nntest::make(xv, {n, c}, dev(), dt).requires_grad_(true);
    std::vector<double> rounded = x.to_vector<double>();
    std::vector<int64_t> tv = random_targets(n, c, -100, 0);
    Tensor t = bp::from_vector(tv, {n}, dev());
    Tensor loss;
    bp::profiler::start();
    {
      std::vector<DType> ok = bp::autocast_supported_dtypes(dev().type());
      bp::autocast ac(dev().type(), dt, std::find(ok.begin(), ok.end(), dt) != ok.end());
      loss = bp::nn::cross_entropy(x, t, {"sum", -100, 0.1});
    }
    loss.backward();
    dev().synchronize();
    bp::profiler::stop();
    int64_t fused = 0, casts = 0;
    for (const bp::profiler::OpSummary& r : bp::profiler::key_averages()) {
      if (r.name == "cross_entropy" || r.name == "cross_entropy_backward") fused += r.calls;
      if (r.name == "cast") casts += r.calls;
    }
    EXPECT_EQ(fused, 2) << bp::profiler::table();
    EXPECT_EQ(casts, 0) << bp::profiler::table();
    EXPECT_EQ(loss.dtype(), DType::f32);
    EXPECT_EQ(x.grad().dtype(), dt);
    Reference ref = reference(rounded, tv, n, c, {"sum", -100, 0.1});
    double total = 0;
    for (double v : ref.rows) total += v;
    EXPECT_TRUE(nntest::close({loss.item<double>()}, {total}, 1e-5));
    EXPECT_TRUE(bp_test::all_close(static_cast<int32_t>(dt), x.grad().to_vector<double>(), ref.grad,
                                   {.rtol = 1e-2}));
  }
}

TEST_P(CrossEntropyTest, BadArgumentsAreNamed) {
  Tensor x = nntest::make(nntest::random_values(12), {3, 4}, dev());
  Tensor t = bp::from_vector(std::vector<int64_t>{0, 1, 2}, {3}, dev());
  const int64_t bad = 4 + static_cast<int64_t>(bp_test::test_seed() % 50);
  Tensor tb = bp::from_vector(std::vector<int64_t>{0, bad, 2}, {3}, dev());
  // A bad class: an IndexError at the op, or an AsyncError at the read on devices that find it
  // on the device; either names the value.
  try {
    (void)bp::nn::cross_entropy(x, tb, {"none", -100, 0.0}).to_vector<double>();
    ADD_FAILURE() << "no error for target " << bad;
  } catch (const bp::IndexError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
  } catch (const bp::AsyncError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
  }
  dev().synchronize();
  EXPECT_HAS(bp_test::expect_throw<bp::Error>([&] {
               bp::nn::cross_entropy(x, t, {"avg", -100, 0.0});
             }),
             "reduction must be 'mean', 'sum' or 'none', got 'avg'");
  EXPECT_HAS(bp_test::expect_throw<bp::Error>([&] {
               bp::nn::cross_entropy(x, t, {"mean", -100, 1.5});
             }),
             "label_smoothing must be in [0, 1]");
  EXPECT_HAS(bp_test::expect_throw<bp::ShapeError>([&] {
               bp::nn::cross_entropy(x, t.reshape({3, 1}));
             }),
             "labels must have shape 3 for logits of shape 3x4 (the classes on dim 1), got 3x1");
  EXPECT_HAS(
      bp_test::expect_throw<bp::DTypeError>([&] { bp::nn::cross_entropy(x, t.to(DType::f32)); }),
      "i64 or i32 class indices");
  EXPECT_HAS(bp_test::expect_throw<bp::ShapeError>([&] {
               bp::nn::cross_entropy(nntest::make({}, {3, 0}, dev()), t);
             }),
             "have no classes");
}

INSTANTIATE_TEST_SUITE_P(Devices, CrossEntropyTest, ::testing::ValuesIn(nntest::device_strings()),
                         nntest::param_name);

}  // namespace

// Gradient checks: every differentiable op's backward against central finite differences in
// float64 on fresh random inputs, on every device that supports f64 (others are skipped with
// a message). The checked scalar is sum(f(inputs) * W) with a fixed random W, so every output
// element carries a different weight.
#include "nn_test_support.hpp"

#include <backplane/profiler.hpp>
#include <backplane/train.hpp>

#include <functional>
#include <map>

namespace {

using bp::Shape;
using bp::Tensor;

struct Input {
  Shape shape;
  double lo = -2, hi = 2;
  double min_abs = 0;  // keep |x| at least this (away from kinks and poles)
};

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

class GradCheckTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!dev().properties().supports_f64)
      GTEST_SKIP() << dev().str() << " does not support f64; gradient checks need it";
  }
  bp::Device& dev() { return bp::device(GetParam()); }

  static int64_t numel(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  }

  std::vector<double> draw(const Input& in) {
    auto v = nntest::random_values(static_cast<size_t>(numel(in.shape)), in.lo, in.hi);
    for (double& x : v)
      if (std::fabs(x) < in.min_abs) x = x < 0 ? x - in.min_abs : x + in.min_abs;
    return v;
  }

  // Checks d sum(f(x) * W) / dx for every input against central differences.
  void check(const std::string& name, const Fn& f, const std::vector<Input>& inputs,
             double tol = 1e-6, double eps = 1e-6,
             const std::vector<std::vector<double>>& fixed = {}) {
    SCOPED_TRACE(name + " on " + dev().str());
    std::vector<std::vector<double>> values;
    for (size_t k = 0; k < inputs.size(); ++k)
      values.push_back(k < fixed.size() && !fixed[k].empty() ? fixed[k] : draw(inputs[k]));
    auto build = [&](const std::vector<std::vector<double>>& vals, bool grad) {
      std::vector<Tensor> ts;
      for (size_t k = 0; k < inputs.size(); ++k) {
        Tensor t = bp::from_vector(vals[k], inputs[k].shape, dev());
        if (grad) t.requires_grad_(true);
        ts.push_back(t);
      }
      return ts;
    };
    std::vector<Tensor> leaves = build(values, true);
    Tensor out = f(leaves);
    ASSERT_TRUE(out.requires_grad()) << "the output does not require grad";
    EXPECT_EQ(&out.device(), &dev());
    Tensor w = nntest::make(nntest::random_values(static_cast<size_t>(out.numel()), 0.5, 1.5),
                            out.shape(), dev(), bp::DType::f64);
    (out * w).sum().backward();
    auto value = [&](const std::vector<std::vector<double>>& vals) {
      bp::NoGradGuard no_grad;
      return (f(build(vals, false)) * w).sum().item<double>();
    };
    for (size_t k = 0; k < inputs.size(); ++k) {
      Tensor g = leaves[k].grad();
      ASSERT_TRUE(g.defined()) << "input " << k << " got no gradient";
      ASSERT_EQ(g.shape(), inputs[k].shape) << "gradient shape of input " << k;
      EXPECT_EQ(&g.device(), &dev());
      std::vector<double> analytic = g.to_vector<double>(), numeric(values[k].size());
      for (size_t i = 0; i < values[k].size(); ++i) {
        auto plus = values, minus = values;
        plus[k][i] += eps;
        minus[k][i] -= eps;
        numeric[i] = (value(plus) - value(minus)) / (2 * eps);
      }
      for (size_t i = 0; i < numeric.size(); ++i)
        EXPECT_TRUE(nntest::near(analytic[i], numeric[i], tol * (1 + std::fabs(numeric[i]))))
            << "input " << k << " element " << i;
    }
  }
};

TEST_P(GradCheckTest, ArithmeticWithBroadcasting) {
  // [2, 3, 4] op [3, 1]: the second gradient must be summed back over the broadcast dims.
  std::vector<Input> in = {{{2, 3, 4}}, {{3, 1}, 0.5, 2}};
  check(
      "add", [](auto& x) { return x[0] + x[1]; }, in);
  check(
      "sub", [](auto& x) { return x[0] - x[1]; }, in);
  check(
      "mul", [](auto& x) { return x[0] * x[1]; }, in);
  check(
      "div", [](auto& x) { return x[0] / x[1]; }, in);
  check(
      "sub reversed broadcast", [](auto& x) { return x[1] - x[0]; }, in);
  check("add same shape", [](auto& x) { return x[0] + x[1]; }, {{{3, 4}}, {{3, 4}}});
  check("mul scalar-shaped", [](auto& x) { return x[0] * x[1]; }, {{{3, 4}}, {{}}});
  check("neg", [](auto& x) { return -x[0]; }, {{{5}}});
}

TEST_P(GradCheckTest, ScalarOperands) {
  std::vector<Input> in = {{{3, 4}, 0.5, 2}};
  check(
      "x + s", [](auto& x) { return x[0] + 1.5; }, in);
  check(
      "s + x", [](auto& x) { return 1.5 + x[0]; }, in);
  check(
      "x - s", [](auto& x) { return x[0] - 1.5; }, in);
  check(
      "s - x", [](auto& x) { return 1.5 - x[0]; }, in);
  check(
      "x * s", [](auto& x) { return x[0] * -2.5; }, in);
  check(
      "s * x", [](auto& x) { return -2.5 * x[0]; }, in);
  check(
      "x / s", [](auto& x) { return x[0] / 3.0; }, in);
  check(
      "s / x", [](auto& x) { return 3.0 / x[0]; }, in);
}

TEST_P(GradCheckTest, Powers) {
  check("pow scalar 2.5", [](auto& x) { return x[0].pow(2.5); }, {{{3, 4}, 0.5, 2}});
  check("pow scalar -1.5", [](auto& x) { return bp::pow(x[0], -1.5); }, {{{3, 4}, 0.5, 2}});
  check("pow scalar 2 (negative base)", [](auto& x) { return x[0].pow(2.0); }, {{{3, 4}}});
  check("pow tensor", [](auto& x) { return x[0].pow(x[1]); }, {{{3, 4}, 0.5, 2}, {{3, 4}}});
  check("pow tensor broadcast", [](auto& x) { return bp::pow(x[0], x[1]); },
        {{{3, 4}, 0.5, 2}, {{4}, -1, 2}});
}

TEST_P(GradCheckTest, MaximumMinimumWhere) {
  // Inputs far apart so that no finite-difference step crosses a tie.
  std::vector<double> a(12), b(12);
  auto r = nntest::random_values(24, -1, 1);
  for (size_t i = 0; i < 12; ++i) {
    a[i] = r[i];
    b[i] = r[i] + (r[12 + i] > 0 ? 0.5 : -0.5);
  }
  std::vector<Input> in = {{{3, 4}}, {{3, 4}}};
  check("maximum", [](auto& x) { return bp::maximum(x[0], x[1]); }, in, 1e-6, 1e-6, {a, b});
  check("minimum", [](auto& x) { return bp::minimum(x[0], x[1]); }, in, 1e-6, 1e-6, {a, b});
  check("maximum broadcast", [](auto& x) { return bp::maximum(x[0], x[1]); },
        {{{3, 4}, 0.5, 2}, {{4}, -2, -0.5}});
  check("maximum scalar", [](auto& x) { return bp::maximum(x[0], 0.25); }, {{{3, 4}, -2, 2, 0.3}},
        1e-6, 1e-6, {});
  check("minimum scalar", [](auto& x) { return bp::minimum(x[0], -0.25); }, {{{3, 4}, -2, 2, 0.3}});
  auto cond_of = [this] {
    auto v = nntest::random_values(12);
    std::vector<bool> c(12);
    for (size_t i = 0; i < 12; ++i) c[i] = v[i] > 0;
    c[0] = true;
    c[1] = false;
    return bp::from_vector(c, {3, 4}, dev());
  };
  Tensor cond = cond_of();
  check(
      "where", [&](auto& x) { return bp::where(cond, x[0], x[1]); }, in);
  check("where broadcast", [&](auto& x) { return bp::where(cond, x[0], x[1]); },
        {{{3, 4}}, {{1, 4}}});
}

TEST_P(GradCheckTest, Matmul) {
  auto mm = [](auto& x) { return x[0].matmul(x[1]); };
  check("matmul 2d", mm, {{{3, 4}}, {{4, 2}}});
  check("matmul batched", mm, {{{2, 3, 4}}, {{2, 4, 5}}});
  // A matrix rhs under a dense batched lhs is folded into one 2-D product (Note [Folded
  // matmul]); a strided lhs is not.
  check("matmul broadcast rhs", mm, {{{2, 3, 4}}, {{4, 5}}});
  check("matmul broadcast rhs 4-d", mm, {{{2, 2, 3, 4}}, {{4, 5}}});
  check("matmul broadcast rhs strided lhs",
        [](auto& x) { return x[0].transpose(0, 1).matmul(x[1]); }, {{{3, 2, 4}}, {{4, 5}}});
  check("matmul broadcast lhs", mm, {{{3, 4}}, {{2, 4, 5}}});
  check("matmul broadcast batch dims", mm, {{{2, 1, 3, 4}}, {{3, 4, 2}}});
  check("matmul vector-matrix", mm, {{{4}}, {{4, 3}}});
  check("matmul matrix-vector", mm, {{{3, 4}}, {{4}}});
  check("matmul batched-vector", mm, {{{2, 3, 4}}, {{4}}});
  check("matmul vector-vector", mm, {{{4}}, {{4}}});
  check("matmul transposed operand", [](auto& x) { return x[0].t().matmul(x[1]); },
        {{{4, 3}}, {{4, 2}}});
}

TEST_P(GradCheckTest, UnaryFunctions) {
  check("exp", [](auto& x) { return x[0].exp(); }, {{{3, 5}}});
  check("log", [](auto& x) { return x[0].log(); }, {{{3, 5}, 0.2, 3}});
  check("sqrt", [](auto& x) { return x[0].sqrt(); }, {{{3, 5}, 0.2, 3}});
  check("relu", [](auto& x) { return x[0].relu(); }, {{{3, 5}, -2, 2, 0.1}});
  check("sigmoid", [](auto& x) { return x[0].sigmoid(); }, {{{3, 5}, -4, 4}});
  check("tanh", [](auto& x) { return x[0].tanh(); }, {{{3, 5}}});
  check("abs", [](auto& x) { return x[0].abs(); }, {{{3, 5}, -2, 2, 0.1}});
  check("norm", [](auto& x) { return x[0].norm(); }, {{{3, 5}}});
}

TEST_P(GradCheckTest, Reductions) {
  std::vector<Input> in = {{{3, 4, 5}}};
  check(
      "sum all", [](auto& x) { return x[0].sum(); }, in);
  check(
      "sum axis 1", [](auto& x) { return x[0].sum(1); }, in);
  check(
      "sum axis -1 keepdim", [](auto& x) { return x[0].sum(-1, true); }, in);
  check(
      "mean all", [](auto& x) { return x[0].mean(); }, in);
  check(
      "mean axis 0", [](auto& x) { return x[0].mean(0); }, in);
  check(
      "mean axis 2 keepdim", [](auto& x) { return x[0].mean(2, true); }, in);
  // Distinct values: every maximum is unique and stays so under a small step.
  std::vector<double> v(60);
  auto r = nntest::random_values(60, 0, 0.4);
  for (size_t i = 0; i < 60; ++i) v[i] = static_cast<double>((i * 37) % 60) + r[i];
  check("max all", [](auto& x) { return x[0].max(); }, in, 1e-6, 1e-6, {v});
  check("max axis 1", [](auto& x) { return x[0].max(1); }, in, 1e-6, 1e-6, {v});
  check("max axis 0 keepdim", [](auto& x) { return x[0].max(0, true); }, in, 1e-6, 1e-6, {v});
  check("sum of a 1-d tensor", [](auto& x) { return x[0].sum(0); }, {{{7}}});
}

TEST_P(GradCheckTest, Views) {
  std::vector<Input> in = {{{2, 3, 4}}};
  check(
      "reshape",
      [](auto& x) {
        return x[0].reshape({4, 6});
      },
      in);
  check(
      "reshape -1", [](auto& x) { return x[0].reshape({-1}); }, in);
  check(
      "view",
      [](auto& x) {
        return x[0].view({6, 4});
      },
      in);
  check(
      "transpose", [](auto& x) { return x[0].transpose(0, 2); }, in);
  check("t", [](auto& x) { return x[0].t(); }, {{{3, 5}}});
  check(
      "permute",
      [](auto& x) {
        return x[0].permute({2, 0, 1});
      },
      in);
  check(
      "slice", [](auto& x) { return x[0].slice(2, 1, 4); }, in);
  check(
      "slice with step", [](auto& x) { return x[0].slice(1, 0, 3, 2); }, in);
  check(
      "select", [](auto& x) { return x[0].select(1, -1); }, in);
  check("expand", [](auto& x) { return x[0].expand({2, 3, 4}); }, {{{3, 1}}});
  check("expand new dims", [](auto& x) { return x[0].expand({5, 2, 4}); }, {{{4}}});
  check(
      "unsqueeze + squeeze", [](auto& x) { return x[0].unsqueeze(1).squeeze(1); }, in);
  check("non-contiguous then contiguous", [](auto& x) { return x[0].t().contiguous(); },
        {{{3, 5}}});
  check("reshape of a transposed view (copies)", [](auto& x) { return x[0].t().reshape({-1}); },
        {{{3, 5}}});
}

// Several slices of one tensor (Note [Slice gradients]): disjoint ones are written into one
// gradient buffer; overlapping ones, other axes or steps, and uses of the whole tensor take the
// general path. Each order of arrival is covered by the expression's shape.
TEST_P(GradCheckTest, SlicesOfOneTensor) {
  const std::vector<Input> in = {{{4, 9}}};
  auto s = [](const Tensor& x, int axis, int64_t a, int64_t b, int64_t step = 1) {
    return x.slice(axis, a, b, step);
  };
  check(
      "disjoint thirds (q, k, v)",
      [&](auto& x) { return s(x[0], 1, 0, 3) * s(x[0], 1, 3, 6) + s(x[0], 1, 6, 9) * 3.0; }, in);
  check(
      "disjoint, out of order and with a gap",
      [&](auto& x) { return s(x[0], 1, 6, 9) * s(x[0], 1, 0, 3).exp(); }, in);
  check(
      "overlapping", [&](auto& x) { return s(x[0], 1, 0, 5) * s(x[0], 1, 3, 8); }, in);
  check(
      "the same region twice", [&](auto& x) { return s(x[0], 1, 2, 5) * s(x[0], 1, 2, 5); }, in);
  check(
      "slices along two axes",
      [&](auto& x) { return s(x[0], 0, 0, 2).sum() * s(x[0], 1, 4, 6).sum() + s(x[0], 0, 2, 4); },
      in);
  check(
      "strided slices",
      [&](auto& x) { return s(x[0], 1, 0, 9, 2).sum(1) * s(x[0], 1, 1, 9, 2).sum(1); }, in);
  check(
      "slices and the whole tensor",
      [&](auto& x) { return (s(x[0], 1, 0, 3) * s(x[0], 1, 6, 9)).sum() + x[0] * 2.0; }, in);
  check(
      "the whole tensor, then slices",
      [&](auto& x) { return x[0].exp() + (s(x[0], 1, 0, 4) * s(x[0], 1, 5, 9)).sum(); }, in);
}

// The point of Note [Slice gradients]: three disjoint slices' gradients land in one zero buffer
// (one fill, as for a single slice) with no full-size add.
TEST_P(GradCheckTest, DisjointSlicesShareOneGradientBuffer) {
  auto launches = [&](int parts) {
    Tensor x = nntest::make(nntest::random_values(8 * 12), {8, 12}, dev()).requires_grad_(true);
    Tensor loss;
    for (int p = 0; p < parts; ++p) {
      Tensor part = (x.slice(1, 4 * p, 4 * p + 4) * static_cast<double>(p + 2)).sum();
      loss = loss.defined() ? loss + part : part;
    }
    bp::profiler::start();
    loss.backward();
    dev().synchronize();
    bp::profiler::stop();
    std::map<std::string, int64_t> calls;
    for (const bp::profiler::OpSummary& r : bp::profiler::key_averages()) calls[r.name] += r.calls;
    std::vector<double> want(8 * 12);
    for (size_t i = 0; i < want.size(); ++i)
      want[i] = static_cast<int>(i % 12) < 4 * parts ? static_cast<double>(i % 12 / 4 + 2) : 0.0;
    EXPECT_EQ(x.grad().to_vector<double>(), want);
    return calls;
  };
  std::map<std::string, int64_t> one = launches(1), three = launches(3);
  EXPECT_EQ(three["fill"], one["fill"]) << bp::profiler::table();
  EXPECT_EQ(three["add"], 0) << bp::profiler::table();
  EXPECT_EQ(three["copy"], 3) << bp::profiler::table();
}

TEST_P(GradCheckTest, DTypeAndDeviceMoves) {
  // Through f32 and back: the cast is the identity up to f32 rounding, so the step is large.
  check(
      "to f32 and back", [](auto& x) { return x[0].to(bp::DType::f32).to(bp::DType::f64) * 2.0; },
      {{{3, 4}}}, 1e-4, 1e-2);
  for (bp::Device* other : bp::devices()) {
    if (!other->properties().supports_f64) continue;
    check("through " + other->str(),
          [&](auto& x) { return (x[0].to(*other).exp() * 2.0).to(dev()); }, {{{3, 4}}});
  }
}

TEST_P(GradCheckTest, CompositesUsedByTraining) {
  bp::nn::Linear lin(4, 3, true, dev(), bp::DType::f64);
  check("linear + relu + sum", [&](auto& x) { return lin(x[0]).relu().sum(1); }, {{{5, 4}, -2, 2}});
  auto labels = bp::from_vector(std::vector<int64_t>{2, 0, 1, 2}, {4}, dev());
  check("cross_entropy", [&](auto& x) { return bp::nn::cross_entropy(x[0], labels); },
        {{{4, 3}, -3, 3}});
  check("mse_loss", [&](auto& x) { return bp::nn::mse_loss(x[0], x[1]); }, {{{4, 2}}, {{4, 2}}});
  check("x used twice", [](auto& x) { return x[0] * x[0] + x[0].exp(); }, {{{6}}});
}

INSTANTIATE_TEST_SUITE_P(Devices, GradCheckTest, ::testing::ValuesIn(nntest::device_strings()),
                         nntest::param_name);

}  // namespace

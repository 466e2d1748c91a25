// The fused ops of issue 14 on every device: one-pass sumsq/norm (whole tensor, one axis,
// views) and linear (x w^T + b, optional ReLU) against float64 host references on fresh random
// data, their gradients against the unfused composition, nn::Sequential's Linear+ReLU fusion,
// and the errors for bad operands.
#include "device_params.hpp"

#include <backplane/nn.hpp>

#include <cmath>

namespace {

class FusedTest : public bptest::FloatDeviceTest {};

TEST_P(FusedTest, DeviceHasTheFusedKernels) {
  // cpu, cuda and opencl implement all three for every floating dtype they have.
  for (bp::DType dt : float_types())
    for (bp::Op op : {bp::Op::sumsq, bp::Op::norm, bp::Op::linear})
      EXPECT_TRUE(dev().supports(op, dt))
          << bp::op_name(op) << " " << bp::dtype_name(dt) << " on " << dev().str();
}

TEST_P(FusedTest, NormsMatchTheFloat64Reference) {
  for (bp::DType dt : float_types()) {
    auto v = bptest::rounded(bptest::random_values(7 * 9 * 11, -2.0, 2.0), dt);
    auto t = make(v, {7, 9, 11}, dt);
    double squares = 0;
    for (double x : v) squares += x * x;
    const double scale = dt == bp::DType::f32 ? 10 : 1;
    expect_close(t.sumsq(), {squares}, dt, "sumsq", 50 * scale);
    expect_close(t.norm(), {std::sqrt(squares)}, dt, "norm", 50 * scale);
    EXPECT_EQ(t.norm().rank(), 0);
    // Along the middle axis, with and without keepdim.
    std::vector<double> q1(7 * 11, 0.0);
    for (int i = 0; i < 7; ++i)
      for (int j = 0; j < 9; ++j)
        for (int k = 0; k < 11; ++k)
          q1[i * 11 + k] += v[(i * 9 + j) * 11 + k] * v[(i * 9 + j) * 11 + k];
    auto s1 = t.sumsq(1);
    EXPECT_EQ(s1.shape(), (bp::Shape{7, 11}));
    expect_close(s1, q1, dt, "sumsq axis 1", 10);
    std::vector<double> n1(q1);
    for (auto& x : n1) x = std::sqrt(x);
    auto nk = t.norm(-2, true);
    EXPECT_EQ(nk.shape(), (bp::Shape{7, 1, 11}));
    expect_close(nk, n1, dt, "norm axis 1 keepdim", 10);
    // A transposed view, reduced along its last axis (strided reads).
    std::vector<double> r(11 * 9, 0.0);
    for (int i = 0; i < 7; ++i)
      for (int j = 0; j < 9; ++j)
        for (int k = 0; k < 11; ++k)
          r[k * 9 + j] += v[(i * 9 + j) * 11 + k] * v[(i * 9 + j) * 11 + k];
    for (auto& x : r) x = std::sqrt(x);
    expect_close(t.transpose(0, 2).norm(2), r, dt, "norm of a transposed view", 10);
  }
  // Zero elements: 0, like a sum.
  EXPECT_EQ(bp::empty({0, 3}, dev()).norm().item<double>(), 0.0);
  EXPECT_EQ(bp::empty({4, 0}, dev()).sumsq(1).to_vector<double>(), std::vector<double>(4, 0.0));
}

TEST_P(FusedTest, NormOfALongVector) {
  // Long enough to take each backend's split (multi-pass / multi-thread) path.
  const size_t n = (size_t{1} << 20) + 37;
  auto v = bptest::rounded(bptest::random_values(n, -1.0, 1.0), bp::DType::f32);
  double squares = 0;
  for (double x : v) squares += x * x;
  auto t = make(v, {static_cast<int64_t>(n)});
  expect_close(t.norm(), {std::sqrt(squares)}, bp::DType::f32, "norm of 2^20+37", 50);
}

TEST_P(FusedTest, NormGradients) {
  auto v = bptest::random_values(6 * 5, -2.0, 2.0);
  auto x = make(v, {6, 5}).requires_grad_();
  x.norm().backward();
  double squares = 0;
  for (double e : v) squares += e * e;
  std::vector<double> want(v.size());
  for (size_t i = 0; i < v.size(); ++i) want[i] = v[i] / std::sqrt(squares);
  expect_close(x.grad(), bptest::rounded(want, bp::DType::f32), bp::DType::f32, "d norm / dx", 4);

  auto y = make(v, {6, 5}).requires_grad_();
  y.sumsq(1).sum().backward();
  std::vector<double> twice(v.size());
  for (size_t i = 0; i < v.size(); ++i) twice[i] = 2 * bptest::rounded({v[i]}, bp::DType::f32)[0];
  expect_close(y.grad(), twice, bp::DType::f32, "d sumsq / dx");

  // At |x| == 0 the gradient is 0, not NaN (as PyTorch).
  auto z = bp::zeros({3}, dev()).requires_grad_();
  z.norm().backward();
  EXPECT_EQ(z.grad().to_vector<double>(), std::vector<double>(3, 0.0));
}

TEST_P(FusedTest, NormNeedsAFloatingDtype) {
  auto i = bp::ones({3}, dev(), bp::DType::i32);
  try {
    (void)i.norm();
    FAIL() << "norm of i32 did not throw";
  } catch (const bp::DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a floating dtype, got i32"), std::string::npos)
        << e.what();
  }
}

// x [rows, k] w [n, k] (+ b) (+ ReLU), in float64.
std::vector<double> linear_ref(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>* b, bool relu, int64_t rows, int64_t k,
                               int64_t n, std::vector<double>& mag) {
  std::vector<double> out(static_cast<size_t>(rows * n));
  mag.assign(out.size(), 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = b ? (*b)[static_cast<size_t>(j)] : 0.0, sq = s * s;
      for (int64_t q = 0; q < k; ++q) {
        const double t = x[static_cast<size_t>(i * k + q)] * w[static_cast<size_t>(j * k + q)];
        s += t;
        sq += t * t;
      }
      out[static_cast<size_t>(i * n + j)] = relu && s < 0 ? 0.0 : s;
      mag[static_cast<size_t>(i * n + j)] = std::sqrt(sq);
    }
  return out;
}

TEST_P(FusedTest, LinearMatchesTheFloat64Reference) {
  for (bp::DType dt : float_types()) {
    const double tol = dt == bp::DType::f32 ? 50 : 5;
    auto vx = bptest::rounded(bptest::random_values(3 * 5 * 13), dt);
    auto vw = bptest::rounded(bptest::random_values(11 * 13), dt);
    auto vb = bptest::rounded(bptest::random_values(11), dt);
    auto x = make(vx, {3, 5, 13}, dt), w = make(vw, {11, 13}, dt), b = make(vb, {11}, dt);
    std::vector<double> mag;
    for (bool relu : {false, true}) {
      const auto act = relu ? bp::Activation::relu : bp::Activation::none;
      auto ref = linear_ref(vx, vw, &vb, relu, 15, 13, 11, mag);
      auto y = bp::linear(x, w, b, act);
      EXPECT_EQ(y.shape(), (bp::Shape{3, 5, 11}));
      expect_close(y, ref, dt, relu ? "linear+relu" : "linear", tol, mag);
      auto ref_nb = linear_ref(vx, vw, nullptr, relu, 15, 13, 11, mag);
      expect_close(bp::linear(x, w, bp::Tensor(), act), ref_nb, dt, "linear without bias", tol,
                   mag);
    }
    // A weight stored transposed ([k, n] memory viewed as [n, k]) and a strided bias.
    auto wt = make(vw, {11, 13}, dt).t().contiguous().t();
    auto vb2 = bptest::rounded(bptest::random_values(22), dt);
    auto b2 = make(vb2, {22}, dt).slice(0, 0, 22, 2);
    std::vector<double> vb2s(11);
    for (int j = 0; j < 11; ++j) vb2s[j] = vb2[2 * j];
    auto ref = linear_ref(vx, vw, &vb2s, true, 15, 13, 11, mag);
    expect_close(bp::linear(x, wt, b2, bp::Activation::relu), ref, dt,
                 "linear with w^T^T and a strided bias", tol, mag);
  }
  // K == 0: the bias alone (then the ReLU).
  auto vb = bptest::random_values(4);
  auto b = make(vb, {4});
  auto y = bp::linear(bp::empty({2, 0}, dev()), bp::empty({4, 0}, dev()), b, bp::Activation::relu);
  std::vector<double> want;
  for (int i = 0; i < 2; ++i)
    for (double e : bptest::rounded(vb, bp::DType::f32)) want.push_back(e > 0 ? e : 0.0);
  EXPECT_EQ(y.to_vector<double>(), want);
}

TEST_P(FusedTest, LinearGradientsMatchTheComposition) {
  auto vx = bptest::random_values(6 * 7), vw = bptest::random_values(5 * 7),
       vb = bptest::random_values(5), vg = bptest::random_values(6 * 5);
  for (bool relu : {false, true}) {
    auto x1 = make(vx, {6, 7}).requires_grad_(), w1 = make(vw, {5, 7}).requires_grad_(),
         b1 = make(vb, {5}).requires_grad_();
    auto x2 = make(vx, {6, 7}).requires_grad_(), w2 = make(vw, {5, 7}).requires_grad_(),
         b2 = make(vb, {5}).requires_grad_();
    auto g = make(vg, {6, 5});
    (bp::linear(x1, w1, b1, relu ? bp::Activation::relu : bp::Activation::none) * g)
        .sum()
        .backward();
    auto y2 = bp::matmul(x2, w2.t()) + b2;
    ((relu ? y2.relu() : y2) * g).sum().backward();
    const char* what = relu ? "linear+relu" : "linear";
    for (auto [a, e, name] : {std::tuple{x1, x2, "dx"}, {w1, w2, "dw"}, {b1, b2, "db"}})
      expect_close(a.grad(), e.grad().to_vector<double>(), bp::DType::f32,
                   std::string(what) + " " + name, 20);
  }
}

TEST_P(FusedTest, SequentialFusesLinearAndReLU) {
  bp::manual_seed(bp_test::test_seed("bp_device_tests") ^ 0x5eed);
  bp::nn::Sequential net;
  auto& l1 = net.add<bp::nn::Linear>(9, 8, true, dev());
  net.add<bp::nn::ReLU>();
  auto& l2 = net.add<bp::nn::Linear>(8, 3, true, dev());
  auto vx = bptest::random_values(4 * 9);
  auto x = make(vx, {4, 9});
  auto y = net(x);
  // The same layers unfused.
  auto h = (bp::matmul(x, l1.weight().t()) + l1.bias()).relu();
  auto ref = bp::matmul(h, l2.weight().t()) + l2.bias();
  expect_close(y, ref.to_vector<double>(), bp::DType::f32, "Sequential(Linear, ReLU, Linear)", 20);
  y.sum().backward();
  auto gw = l1.weight().grad().to_vector<double>();
  for (bp::Tensor p : net.parameters()) p.set_grad(bp::Tensor());
  ref =
      bp::matmul((bp::matmul(x, l1.weight().t()) + l1.bias()).relu(), l2.weight().t()) + l2.bias();
  ref.sum().backward();
  EXPECT_TRUE(
      bptest::close(bp::DType::f32, gw, l1.weight().grad().to_vector<double>(), {.scale = 20}))
      << "first layer's weight gradient, fused vs unfused";
}

TEST_P(FusedTest, LinearErrors) {
  auto x = bp::ones({2, 3}, dev()), w = bp::ones({4, 3}, dev());
  auto expect = [&](auto fn, const char* fragment) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one containing '" << fragment << "'";
    } catch (const bp::ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect([&] { (void)bp::linear(bp::ones({2, 5}, dev()), w); }, "does not end in in_features=3");
  expect(
      [&] {
        (void)bp::linear(x, bp::ones({4, 3, 1}, dev()));
      },
      "weight must be [out_features, in_features]");
  expect([&] { (void)bp::linear(x, w, bp::ones({3}, dev())); }, "bias must be [4]");
  bp::Tensor w16 = w.to(bp::DType::f16);
  // Let the cast finish: PoCL 3.1 compiles a kernel on its first run on its own thread, and a
  // process that exits while that compile is pending aborts inside LLVM (backends/opencl
  // README.md, "Known PoCL limitations").
  bp::synchronize();
  try {
    (void)bp::linear(x, w16);
    ADD_FAILURE() << "mixed dtypes did not throw";
  } catch (const bp::DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("linear"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(AllDevices, FusedTest, ::testing::ValuesIn(bptest::device_strings()),
                         bptest::param_name);

}  // namespace

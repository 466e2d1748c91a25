// Mixed precision on every device (BP_TEST_DEVICES restricts them): bp::autocast's op lists
// (Note [Autocast op lists]), nesting, gradients through the casts, a small MLP trained in
// autocast against its f32 run, GradScaler's skipping, backoff, growth and state, and the
// refusals with their exact error types and messages.
#include <backplane_test/seed.hpp>
#include <backplane_test/throws.hpp>
#include <backplane_test/tolerance.hpp>
#include "autograd/autograd_internal.hpp"
#include "nn_test_support.hpp"

#include <backplane/autocast.hpp>
#include <backplane/grad_scaler.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace F = bp::nn::functional;
using bp::DType;

namespace {

using Param = std::tuple<std::string, DType>;

std::string amp_name(const ::testing::TestParamInfo<Param>& info) {
  return nntest::sanitize(std::get<0>(info.param)) + "_" +
         std::string(bp::dtype_name(std::get<1>(info.param)));
}

std::vector<Param> amp_params() {
  std::vector<Param> out;
  for (const std::string& d : nntest::device_strings())
    for (DType t : {DType::bf16, DType::f16}) out.emplace_back(d, t);
  return out;
}

bool supports(const std::string& type, DType t) {
  std::vector<DType> s = bp::autocast_supported_dtypes(type);
  return std::find(s.begin(), s.end(), t) != s.end();
}

// A (device, autocast dtype) pair; tests skip (with the reason) where the device type does not
// run autocast in that dtype: Refusal checks that case.
class AutocastTest : public ::testing::TestWithParam<Param> {
 protected:
  bp::Device& dev() { return bp::device(std::get<0>(GetParam())); }
  DType dt() const { return std::get<1>(GetParam()); }
  const std::string& type() { return dev().type(); }
  void SetUp() override {
    if (!supports(type(), dt()))
      GTEST_SKIP() << type() << " does not run autocast in " << bp::dtype_name(dt())
                   << " (checked by Refusal)";
  }
  bp::Tensor rand(const bp::Shape& s, DType t = DType::f32, double lo = -2.0, double hi = 2.0) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return nntest::make(nntest::random_values(static_cast<size_t>(n), lo, hi), s, dev(), t);
  }
};

TEST_P(AutocastTest, OpsRunInTheDtypeOfTheirList) {
  bp::Tensor a = rand({4, 8}), b = rand({8, 5}), w = rand({5, 8}), bias = rand({5});
  bp::Tensor img = rand({2, 3, 6, 6}), k = rand({4, 3, 3, 3});
  bp::Tensor q = rand({2, 2, 4, 8}), kk = rand({2, 2, 4, 8}), v = rand({2, 2, 4, 8});
  bp::Tensor low = rand({4, 8}).to(dt());
  bp::Tensor labels = bp::from_vector(std::vector<int64_t>{0, 3, 7, 1}, {4}, dev());
  {
    bp::autocast scope(type(), dt());
    EXPECT_TRUE(bp::is_autocast_enabled(type()));
    EXPECT_EQ(bp::get_autocast_dtype(type()), dt());
    // lower precision
    EXPECT_EQ(bp::matmul(a, b).dtype(), dt());
    EXPECT_EQ(a.matmul(b).dtype(), dt());
    EXPECT_EQ(bp::matmul(a.unsqueeze(0).expand({3, 4, 8}), b).dtype(), dt());  // batched
    EXPECT_EQ(bp::linear(a, w, bias).dtype(), dt());
    EXPECT_EQ(F::conv2d(img, k, bp::Tensor(), 1, 1).dtype(), dt());
    EXPECT_EQ(F::scaled_dot_product_attention(q, kk, v, bp::Tensor(), 0.0, true).dtype(), dt());
    // f32
    EXPECT_EQ(bp::softmax(low, 1).dtype(), DType::f32);
    EXPECT_EQ(bp::log_softmax(low, 1).dtype(), DType::f32);
    EXPECT_EQ(F::layer_norm(low, {8}).dtype(), DType::f32);
    // batch_norm is on no list (PyTorch's): a low-precision input stays low, statistics f32.
    EXPECT_EQ(
        F::batch_norm(low, bp::Tensor(), bp::Tensor(), bp::Tensor(), bp::Tensor(), true).dtype(),
        dt());
    EXPECT_EQ(low.exp().dtype(), DType::f32);
    EXPECT_EQ(bp::abs(low).log().dtype(), DType::f32);
    EXPECT_EQ((bp::abs(low) + 1.0).pow(0.5).dtype(), DType::f32);
    EXPECT_EQ(low.sum().dtype(), DType::f32);
    EXPECT_EQ(low.sum(1).dtype(), DType::f32);
    EXPECT_EQ(low.norm().dtype(), DType::f32);
    EXPECT_EQ(bp::cumsum(low, 1).dtype(), DType::f32);
    EXPECT_EQ(bp::nn::cross_entropy(low, labels).dtype(), DType::f32);
    EXPECT_EQ(bp::nn::mse_loss(low, low).dtype(), DType::f32);
    // promote: the widest operand
    EXPECT_EQ((low + a).dtype(), DType::f32);
    EXPECT_EQ(bp::cat({low, a}, 0).dtype(), DType::f32);
    // unlisted: the input's dtype
    EXPECT_EQ(low.relu().dtype(), dt());
    EXPECT_EQ(low.mean().dtype(), dt());
    EXPECT_EQ(a.relu().dtype(), DType::f32);
    if (dev().properties().supports_f64) {  // f64 is never cast
      EXPECT_EQ(bp::matmul(a.to(DType::f64), b.to(DType::f64)).dtype(), DType::f64);
    }
  }
  EXPECT_FALSE(bp::is_autocast_enabled(type()));
  EXPECT_EQ(bp::matmul(a, b).dtype(), DType::f32);
  EXPECT_EQ(bp::softmax(low, 1).dtype(), dt());
}

TEST_P(AutocastTest, MatmulValuesAreTheProductOfTheCastOperands) {
  const int64_t M = 16, K = 32, N = 12;
  std::vector<double> av = nntest::random_values(M * K), bv = nntest::random_values(K * N);
  bp::Tensor a = nntest::make(av, {M, K}, dev()), b = nntest::make(bv, {K, N}, dev());
  bp::Tensor out;
  {
    bp::autocast scope(type(), dt());
    out = bp::matmul(a, b);
  }
  ASSERT_EQ(out.dtype(), dt());
  std::vector<double> ar = bptest::rounded(nntest::as_f32(av), dt());
  std::vector<double> br = bptest::rounded(nntest::as_f32(bv), dt());
  std::vector<double> ref(M * N, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t p = 0; p < K; ++p) ref[i * N + j] += ar[i * K + p] * br[p * N + j];
  EXPECT_TRUE(
      bptest::close(dt(), out.to_vector<double>(), ref, {.op_class = bp_test::OpClass::matmul}));
}

TEST_P(AutocastTest, ScopesNestAndDisable) {
  bp::Tensor a = rand({3, 4}), b = rand({4, 2});
  const DType other = dt() == DType::bf16 ? DType::f16 : DType::bf16;
  {
    bp::autocast outer(type(), dt());
    {
      bp::autocast off(type(), dt(), false);
      EXPECT_FALSE(bp::is_autocast_enabled(type()));
      EXPECT_EQ(bp::matmul(a, b).dtype(), DType::f32);
      {
        bp::autocast again(type(), dt());
        EXPECT_EQ(bp::matmul(a, b).dtype(), dt());
      }
      EXPECT_EQ(bp::matmul(a, b).dtype(), DType::f32);
    }
    EXPECT_EQ(bp::matmul(a, b).dtype(), dt());
    if (supports(type(), other)) {
      bp::autocast inner(type(), other);
      EXPECT_EQ(bp::matmul(a, b).dtype(), other);
    }
    EXPECT_EQ(bp::matmul(a, b).dtype(), dt());
    EXPECT_EQ(bp::get_autocast_dtype(type()), dt());
    // The state is per thread: another thread runs in f32.
    DType seen = DType::i64;
    std::thread([&] { seen = bp::matmul(a, b).dtype(); }).join();
    EXPECT_EQ(seen, DType::f32);
  }
  EXPECT_FALSE(bp::is_autocast_enabled(type()));
  EXPECT_EQ(bp::matmul(a, b).dtype(), DType::f32);
}

// Gradients flow through the casts and reach each f32 leaf as f32, with the values of the
// lower-precision computation; backward() inside the scope gives the same as outside.
TEST_P(AutocastTest, GradientsOfF32LeavesAreF32) {
  const int64_t M = 6, K = 8, N = 5;
  std::vector<double> xv = nntest::random_values(M * K), wv = nntest::random_values(N * K);
  std::vector<double> bv = nntest::random_values(N);
  for (bool inside : {false, true}) {
    bp::Tensor x = nntest::make(xv, {M, K}, dev()).requires_grad_();
    bp::Tensor w = nntest::make(wv, {N, K}, dev()).requires_grad_();
    bp::Tensor b = nntest::make(bv, {N}, dev()).requires_grad_();
    bp::Tensor loss;
    {
      bp::autocast scope(type(), dt());
      bp::Tensor y = bp::linear(x, w, b);
      EXPECT_EQ(y.dtype(), dt());
      loss = (y * y).sum();  // sum is on the f32 list
      EXPECT_EQ(loss.dtype(), DType::f32);
      if (inside) loss.backward();
    }
    if (!inside) loss.backward();
    ASSERT_TRUE(w.grad().defined());
    EXPECT_EQ(x.grad().dtype(), DType::f32);
    EXPECT_EQ(w.grad().dtype(), DType::f32);
    EXPECT_EQ(b.grad().dtype(), DType::f32);
    // d/dW sum(y^2) = 2 y^T x, with x, W, b as the dtype holds them.
    std::vector<double> xr = bptest::rounded(nntest::as_f32(xv), dt());
    std::vector<double> wr = bptest::rounded(nntest::as_f32(wv), dt());
    std::vector<double> br = bptest::rounded(nntest::as_f32(bv), dt());
    std::vector<double> y(M * N), gw(N * K, 0.0), gb(N, 0.0);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = br[j];
        for (int64_t p = 0; p < K; ++p) s += xr[i * K + p] * wr[j * K + p];
        y[i * N + j] = s;
        gb[j] += 2 * s;
        for (int64_t p = 0; p < K; ++p) gw[j * K + p] += 2 * s * xr[i * K + p];
      }
    // Two products in the dtype (y, then y^T x): twice the matmul tolerance.
    EXPECT_TRUE(bptest::close(dt(), w.grad().to_vector<double>(), gw,
                              {.op_class = bp_test::OpClass::matmul, .scale = 2}));
    EXPECT_TRUE(bptest::close(dt(), b.grad().to_vector<double>(), gb,
                              {.op_class = bp_test::OpClass::matmul, .scale = 2}));
  }
}

// A parameter used twice in one scope (a tied head) is cast once and gets both gradients; a
// new scope sees the parameter's new value.
TEST_P(AutocastTest, WeightCacheIsPerScope) {
  bp::Tensor x = rand({3, 4});
  bp::Tensor w = rand({4, 4}).requires_grad_();
  bp::Tensor y1, y2;
  {
    bp::autocast scope(type(), dt());
    y1 = bp::linear(x, w);
    y2 = bp::linear(y1, w);
    (y2.to(DType::f32).sum()).backward();
  }
  // Both products take W's one cast: their nodes' weight edges reach the same CastBackward.
  ASSERT_TRUE(y1.grad_fn() && y2.grad_fn());
  ASSERT_EQ(y1.grad_fn()->next.size(), 2u);
  ASSERT_EQ(y2.grad_fn()->next.size(), 2u);
  EXPECT_EQ(std::string(y1.grad_fn()->next[1]->name()), "CastBackward");
  EXPECT_EQ(y1.grad_fn()->next[1], y2.grad_fn()->next[1]);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  // d/dW sum((x W^T) W^T) = 1 (x W^T)... checked through f64 autograd of the same rounded values.
  bp::Tensor x64 = x.to(dt()).to(DType::f64);
  bp::Tensor w64 = w.detach().to(dt()).to(DType::f64).requires_grad_();
  bp::Tensor h = bp::linear(x64, w64).to(dt()).to(DType::f64);
  bp::linear(h, w64).sum().backward();
  EXPECT_TRUE(bptest::close(dt(), w.grad().to_vector<double>(), w64.grad().to_vector<double>(),
                            {.op_class = bp_test::OpClass::matmul, .scale = 2}));
  {
    bp::NoGradGuard no_grad;
    w.mul_(2.0);
  }
  bp::autocast scope(type(), dt());
  bp::Tensor z = bp::linear(x, w);
  EXPECT_NE(z.grad_fn()->next[1], y1.grad_fn()->next[1]);  // the cache died with its scope
  bp::Tensor ref = bp::linear(x.to(dt()), w.detach().to(dt()));
  EXPECT_EQ(z.to_vector<double>(), ref.to_vector<double>());
}

// A two-layer MLP trained with SGD for a few steps under autocast follows its f32 run: the
// losses agree within the dtype's tolerance compounded over the steps, and both fall.
TEST_P(AutocastTest, MlpTrainsLikeItsF32Run) {
  const int64_t B = 32, I = 16, H = 32, O = 4;
  const int steps = 8;
  std::vector<double> xv = nntest::random_values(B * I), yv = nntest::random_values(B * O);
  std::vector<double> w1 = nntest::random_values(H * I, -0.25, 0.25);
  std::vector<double> w2 = nntest::random_values(O * H, -0.25, 0.25);
  auto run = [&](bool amp) {
    bp::Tensor x = nntest::make(xv, {B, I}, dev()), t = nntest::make(yv, {B, O}, dev());
    bp::Tensor a = nntest::make(w1, {H, I}, dev()).requires_grad_();
    bp::Tensor b = nntest::make(w2, {O, H}, dev()).requires_grad_();
    bp::optim::SGD opt({a, b}, {.lr = 0.1});
    // A scale at which no f16 gradient overflows (dW1 sums 32 rows): no step is skipped, so the
    // two runs stay step for step comparable.
    bp::amp::GradScaler scaler({.init_scale = 256.0, .enabled = amp && dt() == DType::f16});
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      bp::Tensor loss;
      {
        std::optional<bp::autocast> scope;
        if (amp) scope.emplace(type(), dt());
        loss = bp::nn::mse_loss(bp::linear(bp::linear(x, a).relu(), b), t);
      }
      EXPECT_EQ(loss.dtype(), DType::f32);
      scaler.scale(loss).backward();
      EXPECT_EQ(a.grad().dtype(), DType::f32);
      EXPECT_TRUE(scaler.step(opt));
      scaler.update();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  std::vector<double> ref = run(false), got = run(true);
  EXPECT_LT(ref.back(), ref.front());
  EXPECT_LT(got.back(), got.front());
  // Each step's loss comes from two products in the dtype on weights that drift by the dtype's
  // rounding each step: 2 * steps times the matmul tolerance, elementwise.
  EXPECT_TRUE(bptest::close(dt(), got, ref,
                            {.op_class = bp_test::OpClass::matmul,
                             .scale = 2.0 * steps,
                             .mode = bp_test::Mode::kElementwise}))
      << "f32 losses vs autocast losses";
}

// Autocast on one device type leaves the others alone.
TEST_P(AutocastTest, OtherDeviceTypesAreUnaffected) {
  bp::Tensor a = rand({3, 4}), b = rand({4, 2});
  const std::string other = type() == "cpu" ? "opencl" : "cpu";
  if (bp::num_devices(other) == 0) GTEST_SKIP() << "no " << other << " device";
  if (!supports(other, dt())) GTEST_SKIP() << other << " does not run autocast in this dtype";
  bp::autocast scope(other, dt());
  EXPECT_EQ(bp::matmul(a, b).dtype(), DType::f32);
  EXPECT_FALSE(bp::is_autocast_enabled(type()));
}

INSTANTIATE_TEST_SUITE_P(Devices, AutocastTest, ::testing::ValuesIn(amp_params()), amp_name);

// ---- refusals ---------------------------------------------------------------------------------

class AutocastRefusalTest : public ::testing::TestWithParam<std::string> {
 protected:
  bp::Device& dev() { return bp::device(GetParam()); }
};

TEST_P(AutocastRefusalTest, UnsupportedDtypesAndDevicesAreErrors) {
  const std::string type = dev().type();
  for (DType t : {DType::f32, DType::f64, DType::i64}) {
    std::string msg = bp_test::expect_throw<bp::DTypeError>([&] { bp::autocast s(type, t); });
    EXPECT_HAS(msg, "autocast: dtype " + std::string(bp::dtype_name(t)) + " on '" + type +
                        "' is not a lower-precision dtype");
    EXPECT_FALSE(bp::is_autocast_enabled(type));
  }
  std::string msg =
      bp_test::expect_throw<bp::DeviceError>([&] { bp::autocast s("nosuchdevice", DType::bf16); });
  EXPECT_HAS(msg, "autocast: no device of type 'nosuchdevice'");
  EXPECT_HAS(msg, "cpu");
  msg = bp_test::expect_throw<bp::DeviceError>([&] { bp::autocast s(dev().str(), DType::bf16); });
  EXPECT_HAS(msg, "'" + dev().str() + "' is a device; autocast takes a device type such as '" +
                      type + "'");
  // A dtype the device cannot run: refused with the device and what it supports, never an f32
  // run. Disabling is always allowed.
  const std::vector<DType> ok = bp::autocast_supported_dtypes(type);
  for (DType t : {DType::bf16, DType::f16}) {
    { bp::autocast off(type, t, false); }
    if (std::find(ok.begin(), ok.end(), t) != ok.end()) continue;
    msg = bp_test::expect_throw<bp::DTypeError>([&] { bp::autocast s(type, t); });
    EXPECT_HAS(msg, dev().str());
    EXPECT_HAS(msg, "in " + std::string(bp::dtype_name(t)));
    EXPECT_HAS(msg, "autocast on '" + type + "' supports: ");
    EXPECT_FALSE(bp::is_autocast_enabled(type));
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, AutocastRefusalTest,
                         ::testing::ValuesIn(nntest::device_strings()), nntest::param_name);

// ---- GradScaler -------------------------------------------------------------------------------

class GradScalerTest : public ::testing::TestWithParam<std::string> {
 protected:
  bp::Device& dev() { return bp::device(GetParam()); }
  bp::Tensor rand(const bp::Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return nntest::make(nntest::random_values(static_cast<size_t>(n)), s, dev());
  }
};

// A power-of-two scale is exact: scaled, unscaled and stepped parameters equal those of the same
// steps without a scaler (bit for bit on cpu), for SGD with param groups, Adam and AdamW.
TEST_P(GradScalerTest, FiniteStepsEqualUnscaledSteps) {
  bp::Tensor x = rand({8, 6}), t = rand({8, 3});
  bp::Tensor w0 = rand({3, 6}), b0 = rand({3});
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<std::vector<double>> finals;
    for (bool scaled : {false, true}) {
      bp::Tensor w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
      std::unique_ptr<bp::optim::Optimizer> opt;
      if (kind == 0)
        opt = std::make_unique<bp::optim::SGD>(
            std::vector<bp::optim::ParamGroup>{{{w}, {}}, {{b}, {{"lr", 0.05}}}},
            bp::optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      else if (kind == 1)
        opt = std::make_unique<bp::optim::Adam>(std::vector<bp::Tensor>{w, b},
                                                bp::optim::AdamOptions{.lr = 0.01});
      else
        opt = std::make_unique<bp::optim::AdamW>(std::vector<bp::Tensor>{w, b},
                                                 bp::optim::AdamWOptions{.lr = 0.01});
      bp::amp::GradScaler scaler({.init_scale = 1024.0, .enabled = scaled});
      for (int s = 0; s < 3; ++s) {
        opt->zero_grad();
        bp::Tensor loss = bp::nn::mse_loss(bp::linear(x, w, b), t);
        scaler.scale(loss).backward();
        if (scaled) {
          EXPECT_EQ(loss.item<float>() * 1024.0f, scaler.scale(loss).item<float>());
        }
        EXPECT_TRUE(scaler.step(*opt));
        scaler.update();
      }
      std::vector<double> v = w.to_vector<double>(), bv = b.to_vector<double>();
      v.insert(v.end(), bv.begin(), bv.end());
      finals.push_back(v);
    }
    // Exact on cpu; a device may reduce in another order run to run (atomics).
    EXPECT_TRUE(
        bptest::close(DType::f32, finals[1], finals[0], {.mode = bp_test::Mode::kElementwise}))
        << "optimiser " << kind;
  }
}

TEST_P(GradScalerTest, InfOrNanSkipsTheStepAndHalvesTheScale) {
  for (double bad :
       {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN()}) {
    bp::Tensor w = rand({4, 3}).requires_grad_(), b = rand({4}).requires_grad_();
    bp::Tensor x = rand({5, 3});
    bp::optim::SGD opt(std::vector<bp::optim::ParamGroup>{{{w}, {}}, {{b}, {}}}, {.lr = 0.1});
    bp::amp::GradScaler scaler;
    EXPECT_EQ(scaler.get_scale(), 65536.0);
    bp::Tensor loss = bp::linear(x, w, b).sum();
    scaler.scale(loss).backward();
    // Poison one element of the second group's gradient.
    std::vector<double> g = b.grad().to_vector<double>();
    g[2] = bad;
    b.set_grad(nntest::make(g, {4}, dev()));
    const std::vector<double> w_before = w.to_vector<double>(), b_before = b.to_vector<double>();
    EXPECT_FALSE(scaler.step(opt));
    EXPECT_EQ(w.to_vector<double>(), w_before);
    EXPECT_EQ(b.to_vector<double>(), b_before);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);
    // The next finite step runs, with the gradients divided by the new scale.
    opt.zero_grad();
    scaler.scale(bp::linear(x, w, b).sum()).backward();
    scaler.unscale_(opt);
    std::vector<double> gb = b.grad().to_vector<double>();
    for (double v : gb) EXPECT_DOUBLE_EQ(v, 5.0);  // d/db sum over 5 rows
    EXPECT_TRUE(scaler.step(opt));
    EXPECT_NE(w.to_vector<double>(), w_before);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    EXPECT_EQ(scaler.growth_tracker(), 1);
  }
}

TEST_P(GradScalerTest, ScaleGrowsAfterGrowthIntervalFiniteSteps) {
  bp::Tensor w = rand({2, 3}).requires_grad_(), x = rand({4, 3});
  bp::optim::Adam opt({w}, {.lr = 1e-3});
  bp::amp::GradScaler scaler({.init_scale = 8.0, .growth_interval = 3});
  std::vector<double> scales;
  for (int s = 0; s < 7; ++s) {
    opt.zero_grad();
    scaler.scale(bp::linear(x, w).sum()).backward();
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
    scales.push_back(scaler.get_scale());
  }
  EXPECT_EQ(scales, (std::vector<double>{8, 8, 16, 16, 16, 32, 32}));
  EXPECT_EQ(scaler.growth_tracker(), 1);
  scaler.update(4.0);  // an explicit scale needs no step
  EXPECT_EQ(scaler.get_scale(), 4.0);
}

// clip_grad_norm_ between unscale_ and step sees the unscaled gradients.
TEST_P(GradScalerTest, ClippingAfterUnscaleSeesTrueGradients) {
  bp::Tensor x = rand({6, 4});
  bp::Tensor w0 = rand({3, 4});
  std::vector<std::vector<double>> finals;
  std::vector<double> norms;
  for (bool scaled : {false, true}) {
    bp::Tensor w = w0.clone().requires_grad_();
    bp::optim::SGD opt({w}, {.lr = 0.1});
    bp::amp::GradScaler scaler({.init_scale = 4096.0, .enabled = scaled});
    scaler.scale((bp::linear(x, w) * 3.0).sum()).backward();
    scaler.unscale_(opt);
    norms.push_back(bp::nn::clip_grad_norm_({w}, 0.5).item<double>());
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
    finals.push_back(w.to_vector<double>());
  }
  EXPECT_TRUE(bptest::close(DType::f32, {norms[1]}, {norms[0]}));
  EXPECT_GT(norms[0], 0.5);
  EXPECT_TRUE(
      bptest::close(DType::f32, finals[1], finals[0], {.mode = bp_test::Mode::kElementwise}));
}

TEST_P(GradScalerTest, StateDictRoundTripsAndOrderIsChecked) {
  bp::Tensor w = rand({2, 2}).requires_grad_(), x = rand({3, 2});
  bp::optim::SGD opt({w}, {.lr = 0.1});
  bp::amp::GradScaler scaler({.init_scale = 256.0, .growth_interval = 5});
  for (int s = 0; s < 2; ++s) {
    opt.zero_grad();
    scaler.scale(bp::linear(x, w).sum()).backward();
    scaler.step(opt);
    scaler.update();
  }
  std::map<std::string, double> sd = scaler.state_dict();
  EXPECT_EQ(sd, (std::map<std::string, double>{{"scale", 256.0},
                                               {"growth_factor", 2.0},
                                               {"backoff_factor", 0.5},
                                               {"growth_interval", 5.0},
                                               {"_growth_tracker", 2.0}}));
  bp::amp::GradScaler other;
  other.load_state_dict(sd);
  EXPECT_EQ(other.state_dict(), sd);

  // Order and argument errors.
  opt.zero_grad();
  scaler.scale(bp::linear(x, w).sum()).backward();
  scaler.unscale_(opt);
  EXPECT_HAS(bp_test::expect_throw<bp::Error>([&] { scaler.unscale_(opt); }),
             "unscale_: already called on this optimizer since the last update()");
  scaler.step(opt);
  EXPECT_HAS(bp_test::expect_throw<bp::Error>([&] { scaler.step(opt); }),
             "step: already called for this optimizer since the last update()");
  scaler.update();
  EXPECT_HAS(bp_test::expect_throw<bp::Error>([&] { scaler.update(); }),
             "update: no optimizer was unscaled or stepped");
  std::map<std::string, double> bad = sd;
  bad.erase("growth_factor");
  EXPECT_HAS(bp_test::expect_throw<bp::Error>([&] { other.load_state_dict(bad); }),
             "missing key \"growth_factor\"");
  bad = sd;
  bad["backoff_factor"] = 1.5;
  EXPECT_HAS(bp_test::expect_throw<bp::Error>([&] { other.load_state_dict(bad); }),
             "backoff_factor must be in (0, 1), got 1.5");
  EXPECT_EQ(other.state_dict(), sd);  // nothing changed
  EXPECT_HAS(
      bp_test::expect_throw<bp::Error>([] { bp::amp::GradScaler s({.growth_factor = 1.0}); }),
      "growth_factor must be > 1");
  EXPECT_HAS(
      bp_test::expect_throw<bp::Error>([] { bp::amp::GradScaler s({.growth_interval = 0}); }),
      "growth_interval must be a whole number >= 1");
  // f16 gradients are refused before any gradient changes.
  bp::Tensor h = rand({2, 2}).to(DType::f16).requires_grad_();
  bp::optim::SGD hopt({h}, {.lr = 0.1});
  bp::amp::GradScaler s16({.init_scale = 2.0});
  s16.scale(h.sum()).backward();
  const std::vector<double> g = h.grad().to_vector<double>();
  EXPECT_HAS(bp_test::expect_throw<bp::DTypeError>([&] { s16.unscale_(hopt); }), "f16 gradient");
  EXPECT_EQ(h.grad().to_vector<double>(), g);
  // A step with no gradient at all.
  bp::Tensor fresh = rand({2}).requires_grad_();
  bp::optim::SGD fopt({fresh}, {.lr = 0.1});
  bp::amp::GradScaler s2;
  EXPECT_HAS(bp_test::expect_throw<bp::Error>([&] { s2.step(fopt); }),
             "no parameter of this optimizer has a gradient");
}

INSTANTIATE_TEST_SUITE_P(Devices, GradScalerTest, ::testing::ValuesIn(nntest::device_strings()),
                         nntest::param_name);

}  // namespace

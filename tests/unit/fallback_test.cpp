// Fallbacks (Note [Fallback policy] in runtime.hpp) on the reference backend with fault no_conv
// (device ref_noconv:0): the template's fill, copy, add, mul, sum and its window, norm, index
// and softmax ops, no matmul and no convolution. An MLP and a small CNN run there through
// core's decompositions (matmul as mul and sum, conv2d and its gradients by im2col and matmul)
// and through runs of the ops it lacks on cpu:0, and give what they give on cpu:0: outputs,
// loss and every gradient. Then the policy: warnings once, error, counters, graph captures.
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane_test/gtest_compare.hpp>
#include <backplane_test/plugin_test.hpp>
#include <backplane_test/seed.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

const std::string kRefNoConv = bp_test::beside_exe(BP_REF_NOCONV_REL);

bp::Registry& registry() {
  static bp::Registry* reg = [] {
    bp::RegistryOptions o;
    o.plugin_paths = {kRefNoConv};
    return new bp::Registry(o);
  }();
  return *reg;
}
bp::Device& ref() {
  return registry().device("ref_noconv:0");
}
bp::Device& cpu() {
  return registry().device("cpu:0");
}

// Sets the process-wide policy for one scope and puts back warn, the default.
struct PolicyGuard {
  explicit PolicyGuard(bp::FallbackPolicy p) { bp::set_fallback_policy(p); }
  ~PolicyGuard() { bp::set_fallback_policy(bp::FallbackPolicy::warn); }
};

std::vector<float> random_values(size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(bp_test::rng("bp_unit_tests"));
  return v;
}

const bp::FallbackStats* stats_for(const std::vector<bp::FallbackStats>& s, const std::string& op,
                                   const std::string& action_start) {
  for (const auto& f : s)
    if (f.device == "ref_noconv:0" && f.op == op && f.action.rfind(action_start, 0) == 0) return &f;
  return nullptr;
}

// Compares every value of `got` (on ref_noconv:0) with `want` (on cpu:0).
::testing::AssertionResult same(const bp::Tensor& got, const bp::Tensor& want,
                                bp_test::OpClass c = bp_test::OpClass::matmul) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << got << " vs " << want;
  bp_test::Tolerance tol;
  tol.op_class = c;
  return bp_test::all_close(static_cast<int32_t>(bp::DType::f32), got.to_vector<double>(),
                            want.to_vector<double>(), tol);
}

// One network built on a device from explicit parameter values (the same on both devices).
struct Case {
  bp::nn::Sequential net;
  bp::Tensor x, y;
};

void set_parameters(bp::nn::Sequential& net, bp::Device& d, std::vector<std::vector<float>>& vals) {
  bool fresh = vals.empty();
  size_t k = 0;
  bp::NoGradGuard no_grad;
  for (auto& [name, p] : net.named_parameters()) {
    if (fresh) {
      std::vector<float> v = random_values(static_cast<size_t>(p.numel()));
      for (auto& e : v) e *= 0.3f;
      vals.push_back(v);
    }
    p.copy_(bp::from_vector<float>(vals[k++], p.shape(), d));
  }
}

struct Grads {
  bp::Tensor out, loss;
  std::vector<bp::Tensor> grads;
};

Grads run(bp::nn::Sequential& net, const bp::Tensor& x, const bp::Tensor& y) {
  Grads g;
  g.out = net(x);
  g.loss = bp::nn::cross_entropy(g.out, y);
  g.loss.backward();
  for (auto& p : net.parameters()) g.grads.push_back(p.grad());
  return g;
}

void expect_same_training_step(const std::function<void(bp::nn::Sequential&, bp::Device&)>& build,
                               const bp::Shape& x_shape, int64_t classes) {
  std::vector<std::vector<float>> vals;
  int64_t n = 1;
  for (int64_t s : x_shape) n *= s;
  std::vector<float> xv = random_values(static_cast<size_t>(n));
  std::vector<int64_t> yv;
  std::uniform_int_distribution<int64_t> label(0, classes - 1);
  for (int64_t i = 0; i < x_shape[0]; ++i) yv.push_back(label(bp_test::rng("bp_unit_tests")));

  bp::nn::Sequential on_cpu, on_ref;
  build(on_cpu, cpu());
  build(on_ref, ref());
  set_parameters(on_cpu, cpu(), vals);
  set_parameters(on_ref, ref(), vals);
  Grads want = run(on_cpu, bp::from_vector<float>(xv, x_shape, cpu()),
                   bp::from_vector<int64_t>(yv, {x_shape[0]}, cpu()));
  Grads got = run(on_ref, bp::from_vector<float>(xv, x_shape, ref()),
                  bp::from_vector<int64_t>(yv, {x_shape[0]}, ref()));
  EXPECT_EQ(got.out.device().str(), "ref_noconv:0");
  EXPECT_TRUE(same(got.out, want.out)) << "outputs";
  EXPECT_TRUE(same(got.loss, want.loss)) << "loss";
  ASSERT_EQ(got.grads.size(), want.grads.size());
  auto names = on_cpu.named_parameters();
  for (size_t k = 0; k < got.grads.size(); ++k)
    EXPECT_TRUE(same(got.grads[k], want.grads[k])) << "gradient of " << names[k].first;
}

TEST(Fallback, MlpWithoutMatmulMatchesCpu) {
  ASSERT_FALSE(ref().supports(bp::Op::matmul, bp::DType::f32));
  ASSERT_FALSE(ref().supports(bp::Op::relu, bp::DType::f32));
  bp::reset_fallback_stats();
  expect_same_training_step(
      [](bp::nn::Sequential& net, bp::Device& d) {
        net.add<bp::nn::Linear>(20, 32, true, d);
        net.add<bp::nn::ReLU>();
        net.add<bp::nn::Linear>(32, 10, true, d);
      },
      {8, 20}, 10);
  auto s = bp::fallback_stats();
  const bp::FallbackStats* mm = stats_for(s, "matmul", "decomposition into mul and sum");
  ASSERT_NE(mm, nullptr) << bp::fallback_table();
  EXPECT_GE(mm->count, 2u);
  EXPECT_EQ(mm->bytes_copied, 0u);
  const bp::FallbackStats* relu = stats_for(s, "relu", "a run on cpu:0");
  ASSERT_NE(relu, nullptr) << bp::fallback_table();
  // Each run copies its input and output there and its output back: 3 * [8, 32] f32.
  EXPECT_GE(relu->count, 1u);
  EXPECT_EQ(relu->bytes_copied, relu->count * 3u * 8u * 32u * sizeof(float));
  EXPECT_NE(bp::fallback_table().find("ref_noconv:0"), std::string::npos);
}

TEST(Fallback, CnnWithoutConvolutionMatchesCpu) {
  for (bp::Op op : {bp::Op::conv2d, bp::Op::conv2d_backward_input, bp::Op::conv2d_backward_weight})
    ASSERT_FALSE(ref().supports(op, bp::DType::f32)) << bp::op_name(op);
  bp::reset_fallback_stats();
  expect_same_training_step(
      [](bp::nn::Sequential& net, bp::Device& d) {
        net.add<bp::nn::Conv2d>(3, 4, 3, 1, 1, 1, 1, true, d);  // padding 1
        net.add<bp::nn::ReLU>();
        net.add<bp::nn::MaxPool2d>(2);
        net.add<bp::nn::Conv2d>(4, 6, 3, 2, 1, 2, 2, false, d);  // stride 2, dilation 2, groups 2
        net.add<bp::nn::Flatten>();
        net.add<bp::nn::Linear>(6 * 1 * 1, 5, true, d);
      },
      {3, 3, 8, 7}, 5);
  auto s = bp::fallback_stats();
  for (const char* op : {"conv2d", "conv2d_backward_input", "conv2d_backward_weight"})
    EXPECT_NE(stats_for(s, op, "decomposition into"), nullptr) << op << "\n"
                                                               << bp::fallback_table();
}

// cross_entropy without the fused op (log_softmax, a gather and where) against cpu:0's fused op,
// loss and logits gradient, for every reduction with ignore_index and label smoothing.
TEST(Fallback, CrossEntropyDecompositionMatchesTheFusedOp) {
  ASSERT_FALSE(ref().supports(bp::Op::cross_entropy, bp::DType::f32));
  ASSERT_TRUE(cpu().supports(bp::Op::cross_entropy, bp::DType::f32));
  PolicyGuard allow(bp::FallbackPolicy::allow);
  bp::reset_fallback_stats();
  const int64_t n = 7, c = 9;
  const std::vector<float> xv = random_values(static_cast<size_t>(n * c));
  std::vector<int64_t> tv(static_cast<size_t>(n));
  std::uniform_int_distribution<int64_t> label(0, c - 1);
  for (auto& t : tv) t = label(bp_test::rng("bp_unit_tests"));
  tv[3] = 2;  // ignore_index 2 below: this row adds nothing
  for (const char* reduction : {"mean", "sum", "none"})
    for (double smoothing : {0.0, 0.2}) {
      const bp::nn::CrossEntropyOptions o{reduction, 2, smoothing};
      auto loss = [&](bp::Device& d, bp::Tensor& x) {
        x = bp::from_vector<float>(xv, {n, c}, d).requires_grad_();
        bp::Tensor l = bp::nn::cross_entropy(x, bp::from_vector<int64_t>(tv, {n}, d), o);
        (l * l).sum().backward();
        return l;
      };
      bp::Tensor xc, xr;
      bp::Tensor want = loss(cpu(), xc), got = loss(ref(), xr);
      const std::string what =
          std::string("reduction ") + reduction + ", label_smoothing " + std::to_string(smoothing);
      EXPECT_TRUE(same(got, want, bp_test::OpClass::reduction)) << what;
      EXPECT_TRUE(same(xr.grad(), xc.grad(), bp_test::OpClass::reduction)) << what;
    }
  EXPECT_NE(stats_for(bp::fallback_stats(), "cross_entropy", "decomposition into"), nullptr)
      << bp::fallback_table();
}

// Each decomposition alone against cpu:0 on odd sizes: strides, padding, dilation, groups.
TEST(Fallback, ConvolutionDecompositionCoversTheWindowAttributes) {
  PolicyGuard allow(bp::FallbackPolicy::allow);
  struct Geo {
    int64_t n, c, h, w, k, r, s, stride, pad, dil, groups;
  } cases[] = {{2, 3, 7, 6, 4, 3, 2, 1, 0, 1, 1},
               {1, 4, 9, 9, 6, 3, 3, 2, 2, 1, 2},
               {2, 2, 8, 5, 2, 2, 3, 3, 1, 2, 2},
               {1, 1, 5, 5, 3, 5, 5, 1, 0, 1, 1}};
  for (const Geo& g : cases) {
    auto xv = random_values(static_cast<size_t>(g.n * g.c * g.h * g.w));
    auto wv = random_values(static_cast<size_t>(g.k * (g.c / g.groups) * g.r * g.s));
    auto bv = random_values(static_cast<size_t>(g.k));
    auto conv = [&](bp::Device& d, bp::Tensor& x, bp::Tensor& w) {
      x = bp::from_vector<float>(xv, {g.n, g.c, g.h, g.w}, d).requires_grad_();
      w = bp::from_vector<float>(wv, {g.k, g.c / g.groups, g.r, g.s}, d).requires_grad_();
      bp::Tensor b = bp::from_vector<float>(bv, {g.k}, d);
      bp::Tensor y = bp::nn::functional::conv2d(x, w, b, {g.stride, g.stride}, {g.pad, g.pad},
                                                {g.dil, g.dil}, g.groups);
      (y * y).sum().backward();
      return y;
    };
    bp::Tensor xc, wc, xr, wr;
    bp::Tensor want = conv(cpu(), xc, wc);
    bp::Tensor got = conv(ref(), xr, wr);
    std::string geo = "x " + std::to_string(g.n) + "x" + std::to_string(g.c) + "x" +
                      std::to_string(g.h) + "x" + std::to_string(g.w) + ", stride " +
                      std::to_string(g.stride) + ", pad " + std::to_string(g.pad) + ", dilation " +
                      std::to_string(g.dil) + ", groups " + std::to_string(g.groups);
    EXPECT_TRUE(same(got, want)) << geo;
    EXPECT_TRUE(same(xr.grad(), xc.grad())) << "input gradient, " << geo;
    EXPECT_TRUE(same(wr.grad(), wc.grad())) << "weight gradient, " << geo;
  }
}

TEST(Fallback, MatmulDecompositionBroadcastsBatchesAndVectors) {
  PolicyGuard allow(bp::FallbackPolicy::allow);
  auto av = random_values(2 * 3 * 5 * 7), bv = random_values(3 * 7 * 4), vv = random_values(7);
  auto both = [&](auto f) { return std::make_pair(f(cpu()), f(ref())); };
  auto [w1, g1] = both([&](bp::Device& d) {
    return bp::matmul(bp::from_vector<float>(av, {2, 3, 5, 7}, d),
                      bp::from_vector<float>(bv, {3, 7, 4}, d));
  });
  EXPECT_TRUE(same(g1, w1)) << "[2,3,5,7] @ [3,7,4]";
  auto [w2, g2] = both([&](bp::Device& d) {
    return bp::matmul(bp::from_vector<float>(av, {30, 7}, d), bp::from_vector<float>(vv, {7}, d));
  });
  EXPECT_TRUE(same(g2, w2)) << "[30,7] @ [7]";
  auto [w3, g3] = both([&](bp::Device& d) {
    return bp::matmul(bp::from_vector<float>(av, {2, 3, 5, 7}, d).transpose(-1, -2),
                      bp::from_vector<float>(av, {2, 3, 5, 7}, d));
  });
  EXPECT_TRUE(same(g3, w3)) << "a transposed view";
}

TEST(Fallback, WarnsOncePerOpDtypeAndDevice) {
  bp::Tensor t = bp::from_vector<float>(random_values(12), {3, 4}, ref());
  ::testing::internal::CaptureStderr();
  bp::Tensor a = t.sumsq();
  (void)t.sumsq(1);
  std::string err = ::testing::internal::GetCapturedStderr();
  const std::string line =
      "backplane: warning: op 'sumsq' (f32) is not implemented on ref_noconv:0 (backend "
      "ref_noconv); fallback: decomposition into mul and sum";
  size_t first = err.find(line);
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find(line, first + 1), std::string::npos) << "warned twice:\n" << err;
  std::vector<float> v = t.to_vector<float>();
  double ref_sum = 0;
  for (float x : v) ref_sum += double(x) * x;
  EXPECT_TRUE(bp_test::scalar_close(static_cast<int32_t>(bp::DType::f32), a.item<double>(), ref_sum,
                                    {.op_class = bp_test::OpClass::reduction}));
}

TEST(Fallback, ErrorPolicyRefusesNamingOpDeviceAndWhatWouldHaveBeenDone) {
  bp::Tensor a = bp::from_vector<float>(random_values(6), {2, 3}, ref());
  PolicyGuard error(bp::FallbackPolicy::error);
  EXPECT_EQ(bp::fallback_policy(bp::Op::matmul), bp::FallbackPolicy::error);
  bp::reset_fallback_stats();
  try {
    bp::matmul(a, a.t());
    FAIL() << "matmul fell back under the error policy";
  } catch (const bp::UnsupportedError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("op 'matmul' (f32) is not implemented on ref_noconv:0 (backend "
                       "ref_noconv); its fallback (decomposition into mul and sum) is refused: "
                       "the fallback policy is error (from bp::set_fallback_policy)"),
              std::string::npos)
        << msg;
  }
  try {
    (void)a.relu();
    FAIL() << "relu ran on cpu:0 under the error policy";
  } catch (const bp::UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("its fallback (a run on cpu:0, its operands copied there "
                                         "and back) is refused"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(bp::fallback_stats().empty()) << bp::fallback_table();
}

// Under allow an op the plugin lacks runs on cpu:0 without a word, and is counted.
TEST(Fallback, AllowRunsSilentlyAndCountsBytes) {
  PolicyGuard allow(bp::FallbackPolicy::allow);
  bp::reset_fallback_stats();
  auto v = random_values(10);
  bp::Tensor t = bp::from_vector<float>(v, {10}, ref());
  ::testing::internal::CaptureStderr();
  bp::Tensor e = t.exp();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "");
  std::vector<double> want;
  for (float x : v) want.push_back(std::exp(double(x)));
  EXPECT_TRUE(
      bp_test::all_close(static_cast<int32_t>(bp::DType::f32), e.to_vector<double>(), want));
  auto s = bp::fallback_stats();
  const bp::FallbackStats* f = stats_for(s, "exp", "a run on cpu:0");
  ASSERT_NE(f, nullptr) << bp::fallback_table();
  EXPECT_EQ(f->count, 1u);
  EXPECT_EQ(f->bytes_copied, 3u * 10u * sizeof(float));  // input and output there, output back
}

TEST(Fallback, NeverInsideAGraphCapture) {
  PolicyGuard allow(bp::FallbackPolicy::allow);
  bp::Tensor a = bp::from_vector<float>(random_values(6), {2, 3}, ref());
  bp::Tensor b = bp::from_vector<float>(random_values(6), {3, 2}, ref());
  try {
    bp::Graph g = bp::capture(ref(), [&] { (void)bp::matmul(a, b); });
    FAIL() << "a fallback was captured";
  } catch (const bp::CaptureError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
    EXPECT_NE(msg.find("its fallback (decomposition into mul and sum) is never captured"),
              std::string::npos)
        << msg;
  }
  // The device is usable afterwards.
  EXPECT_EQ(bp::matmul(a, b).shape(), (bp::Shape{2, 2}));
}

}  // namespace

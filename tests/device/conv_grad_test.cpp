// Autograd of the convolutional family: on cpu:0 in f64, every op's gradient against central
// finite differences of its own forward; on every device in f32, forward values and gradients
// against those f64 results from the same inputs (the analytic formulas as cpu:0 computes them
// in f64). Inputs are fresh random values from the printed seed (BP_TEST_SEED replays).
// BP_TEST_REFERENCE_DEVICE names another f64 device to play cpu:0's part (the reference backend,
// reference:0, checks the formulas independently of the cpu backend's kernels).
#include "device_params.hpp"

#include <backplane/nn_conv.hpp>

#include <functional>
#include <numeric>

namespace F = bp::nn::functional;

namespace {

using Inputs = std::vector<bp::Tensor>;
using Fn = std::function<bp::Tensor(const Inputs&)>;

struct Case {
  std::string name;
  std::vector<bp::Shape> shapes;  // the differentiable inputs
  Fn f;
  std::vector<bp::Op> ops;  // what the device must have (else the case is skipped there)
  double spread = 2.0;      // inputs uniform in [-spread, spread)
  bool distinct = false;    // inputs a shuffled grid (no ties for max-like ops)
};

// Index tensors: fixed for the run, rebuilt on each device from host values.
std::vector<int64_t> random_indices(size_t n, int64_t bound) {
  std::vector<int64_t> v(n);
  std::uniform_int_distribution<int64_t> u(0, bound - 1);
  for (auto& x : v) x = u(bp_test::rng("bp_device_tests"));
  return v;
}

bp::Tensor index_tensor(const std::vector<int64_t>& v, const bp::Shape& s, bp::Device& d) {
  return bp::from_vector<int64_t>(v, s, d);
}

std::vector<Case> cases() {
  static const std::vector<int64_t> gidx = random_indices(3 * 4, 5);
  static const std::vector<int64_t> sidx = random_indices(2 * 6, 3);
  std::vector<Case> c;
  c.push_back({"conv2d_bias_stride_pad_dilation_groups",
               {{2, 4, 7, 6}, {6, 2, 3, 2}, {6}},
               [](const Inputs& in) {
                 return F::conv2d(in[0], in[1], in[2], {2, 1}, {1, 2}, {2, 1}, 2);
               },
               {bp::Op::conv2d, bp::Op::conv2d_backward_input, bp::Op::conv2d_backward_weight}});
  c.push_back({"conv2d_plain",
               {{1, 3, 5, 5}, {2, 3, 3, 3}},
               [](const Inputs& in) { return F::conv2d(in[0], in[1]); },
               {bp::Op::conv2d, bp::Op::conv2d_backward_input, bp::Op::conv2d_backward_weight}});
  c.push_back({"max_pool2d_pad_ceil",
               {{2, 3, 7, 6}},
               [](const Inputs& in) { return F::max_pool2d(in[0], 3, 2, 1, 1, true); },
               {bp::Op::max_pool2d, bp::Op::max_pool2d_backward},
               2.0,
               true});
  c.push_back({"avg_pool2d_ceil_exclude_pad",
               {{2, 3, 7, 6}},
               [](const Inputs& in) {
                 return F::avg_pool2d(in[0], {3, 2}, F::Pair2{2, 2}, {1, 1}, true, false);
               },
               {bp::Op::avg_pool2d, bp::Op::avg_pool2d_backward}});
  c.push_back({"avg_pool2d_include_pad",
               {{1, 2, 5, 5}},
               [](const Inputs& in) { return F::avg_pool2d(in[0], 3, 1, 1); },
               {bp::Op::avg_pool2d, bp::Op::avg_pool2d_backward}});
  c.push_back({"adaptive_avg_pool2d",
               {{2, 3, 5, 7}},
               [](const Inputs& in) {
                 return F::adaptive_avg_pool2d(in[0], {3, 2});
               },
               {bp::Op::adaptive_avg_pool2d, bp::Op::adaptive_avg_pool2d_backward}});
  c.push_back({"batch_norm_training",
               {{3, 4, 2, 3}, {4}, {4}},
               [](const Inputs& in) {
                 bp::Device& d = in[0].device();
                 bp::Tensor rm = bp::zeros({4}, d, in[0].dtype()),
                            rv = bp::ones({4}, d, in[0].dtype());
                 return F::batch_norm(in[0], rm, rv, in[1], in[2], true, 0.1, 1e-5);
               },
               {bp::Op::batch_norm, bp::Op::batch_norm_backward}});
  c.push_back(
      {"batch_norm_eval",
       {{3, 4, 5}, {4}, {4}},
       [](const Inputs& in) {
         bp::Device& d = in[0].device();
         bp::Tensor rm = bp::from_vector<double>({0.5, -0.25, 0.1, 0.0}, {4}, d).to(in[0].dtype());
         bp::Tensor rv = bp::from_vector<double>({1.5, 0.5, 2.0, 0.75}, {4}, d).to(in[0].dtype());
         return F::batch_norm(in[0], rm, rv, in[1], in[2], false, 0.1, 1e-5);
       },
       {bp::Op::batch_norm}});
  c.push_back({"dropout",
               {{5, 9}},
               [](const Inputs& in) {
                 bp::manual_seed(1234);
                 return F::dropout(in[0], 0.3, true);
               },
               {bp::Op::dropout}});
  c.push_back({"max_dim",
               {{3, 5, 4}},
               [](const Inputs& in) { return bp::max(in[0], 1).values; },
               {bp::Op::max_dim, bp::Op::scatter_add},
               2.0,
               true});
  c.push_back({"min_dim_keepdim",
               {{3, 5}},
               [](const Inputs& in) { return bp::min(in[0], -1, true).values; },
               {bp::Op::min_dim, bp::Op::scatter_add},
               2.0,
               true});
  c.push_back({"gather",
               {{3, 5}},
               [](const Inputs& in) {
                 return bp::gather(in[0], 1, index_tensor(gidx, {3, 4}, in[0].device()));
               },
               {bp::Op::gather, bp::Op::scatter_add}});
  c.push_back(
      {"scatter_add",
       {{3, 6}, {2, 6}},
       [](const Inputs& in) {
         return bp::scatter_add(in[0], 0, index_tensor(sidx, {2, 6}, in[0].device()), in[1]);
       },
       {bp::Op::scatter_add, bp::Op::gather}});
  c.push_back({"cat_stack",
               {{2, 3}, {2, 1}, {2, 3}},
               [](const Inputs& in) {
                 return bp::cat({bp::stack({in[0], in[2]}, 1).reshape({2, 6}), in[1]}, 1);
               },
               {}});
  c.push_back(
      {"clamp", {{4, 6}}, [](const Inputs& in) { return bp::clamp(in[0], -0.7, 0.9); }, {}});
  c.push_back({"var_std",
               {{4, 5}},
               [](const Inputs& in) { return bp::var(in[0], 1) + bp::std(in[0], std::nullopt, 0); },
               {}});
  c.push_back({"softmax",
               {{3, 7}},
               [](const Inputs& in) { return bp::softmax(in[0], 1); },
               {bp::Op::softmax, bp::Op::softmax_backward}});
  c.push_back({"log_softmax",
               {{4, 3, 2}},
               [](const Inputs& in) { return bp::log_softmax(in[0], 1); },
               {bp::Op::log_softmax, bp::Op::log_softmax_backward}});
  return c;
}

struct Values {
  std::vector<std::vector<double>> inputs;
  std::vector<double> weights;  // the loss is sum(out * weights)
};

Values make_values(const Case& c, size_t out_numel) {
  Values v;
  for (const bp::Shape& s : c.shapes) {
    size_t n = 1;
    for (int64_t d : s) n *= static_cast<size_t>(d);
    if (c.distinct) {
      std::vector<double> grid(n);
      for (size_t k = 0; k < n; ++k)
        grid[k] =
            -c.spread + 2 * c.spread * (static_cast<double>(k) + 0.5) / static_cast<double>(n);
      std::shuffle(grid.begin(), grid.end(), bp_test::rng("bp_device_tests"));
      v.inputs.push_back(grid);
    } else {
      v.inputs.push_back(bptest::random_values(n, -c.spread, c.spread));
    }
  }
  v.weights = bptest::random_values(out_numel, -1.0, 1.0);
  return v;
}

bp::Device& ref_device() {
  const char* name = std::getenv("BP_TEST_REFERENCE_DEVICE");
  return bp::device(name && *name ? name : "cpu:0");
}

bp::Tensor on(bp::Device& d, const std::vector<double>& v, const bp::Shape& s, bp::DType dt) {
  return bp::from_vector<double>(v, s, d).to(dt);
}

struct Result {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
};

Result run(const Case& c, const Values& v, bp::Device& d, bp::DType dt) {
  Inputs in;
  for (size_t k = 0; k < c.shapes.size(); ++k) {
    in.push_back(on(d, v.inputs[k], c.shapes[k], dt));
    in.back().requires_grad_();
  }
  bp::Tensor out = c.f(in);
  bp::Tensor w = on(d, v.weights, out.shape(), dt);
  (out * w).sum().backward();
  Result r{out.to_vector<double>(), {}};
  for (auto& t : in) r.grads.push_back(t.grad().to_vector<double>());
  return r;
}

double loss_f64(const Case& c, const Values& v, const std::vector<std::vector<double>>& xs) {
  bp::NoGradGuard no_grad;
  bp::Device& cpu = ref_device();
  Inputs in;
  for (size_t k = 0; k < c.shapes.size(); ++k)
    in.push_back(on(cpu, xs[k], c.shapes[k], bp::DType::f64));
  bp::Tensor out = c.f(in);
  return (out * on(cpu, v.weights, out.shape(), bp::DType::f64)).sum().item<double>();
}

size_t out_numel(const Case& c) {
  bp::NoGradGuard no_grad;
  Inputs in;
  for (const bp::Shape& s : c.shapes) in.push_back(bp::ones(s, ref_device(), bp::DType::f64));
  return static_cast<size_t>(c.f(in).numel());
}

bool supports(bp::Device& d, const Case& c, bp::DType dt) {
  for (bp::Op op : c.ops)
    if (!d.supports(op, dt)) return false;
  return true;
}

}  // namespace

// Every gradient against central differences of the f64 forward on cpu:0.
TEST(ConvGrad, FiniteDifferencesF64Cpu) {
  bp::Device& cpu = ref_device();
  for (const Case& c : cases()) {
    if (!supports(cpu, c, bp::DType::f64)) {
      ADD_FAILURE() << c.name << ": " << cpu.str() << " lacks an op of the case in f64";
      continue;
    }
    Values v = make_values(c, out_numel(c));
    Result r = run(c, v, cpu, bp::DType::f64);
    const double h = 1e-6;
    for (size_t k = 0; k < c.shapes.size(); ++k) {
      std::vector<double> fd(v.inputs[k].size()), mag(v.inputs[k].size());
      auto xs = v.inputs;
      for (size_t i = 0; i < fd.size(); ++i) {
        const double x0 = xs[k][i];
        xs[k][i] = x0 + h;
        const double lp = loss_f64(c, v, xs);
        xs[k][i] = x0 - h;
        const double lm = loss_f64(c, v, xs);
        xs[k][i] = x0;
        fd[i] = (lp - lm) / (2 * h);
        mag[i] = std::max(std::fabs(lp), 1.0);  // cancellation in lp - lm scales with the loss
      }
      EXPECT_TRUE(bp_test::all_close(static_cast<int32_t>(bp::DType::f64), r.grads[k], fd,
                                     {.rtol = 1e-6, .magnitude = mag}))
          << c.name << ": gradient of input " << k << " against finite differences";
    }
  }
}

class ConvGradDevice : public bptest::DeviceTest {};

// Forward values and gradients in f32 (and f64 where the device has it) against cpu:0's f64.
TEST_P(ConvGradDevice, MatchesF64Reference) {
  bp::Device& cpu = ref_device();
  std::vector<bp::DType> dts = {bp::DType::f32};
  if (has_f64()) dts.push_back(bp::DType::f64);
  int ran = 0;
  for (const Case& c : cases()) {
    if (!supports(cpu, c, bp::DType::f64)) {  // FiniteDifferencesF64Cpu reports it
      std::cout << "[ SKIPPED  ] " << c.name << ": the reference device " << cpu.str()
                << " lacks an op of the case in f64\n";
      continue;
    }
    Values v = make_values(c, out_numel(c));
    Result ref = run(c, v, cpu, bp::DType::f64);
    for (bp::DType dt : dts) {
      if (!supports(dev(), c, dt)) {
        std::cout << "[ SKIPPED  ] " << c.name << " on " << dev().str() << " " << bp::dtype_name(dt)
                  << ": the device lacks an op of the case\n";
        continue;
      }
      // Inputs as the dtype stores them, so the reference sees what the device sees.
      Values vr = v;
      for (auto& x : vr.inputs) x = bptest::rounded(x, dt);
      vr.weights = bptest::rounded(v.weights, dt);
      Result want = dt == bp::DType::f64 ? ref : run(c, vr, cpu, bp::DType::f64);
      Result got = run(c, vr, dev(), dt);
      ++ran;
      const bp_test::Tolerance tol{.op_class = bp_test::OpClass::matmul, .scale = 4};
      EXPECT_TRUE(bptest::close(dt, got.out, want.out, tol))
          << c.name << " forward on " << dev().str() << " " << bp::dtype_name(dt);
      for (size_t k = 0; k < got.grads.size(); ++k)
        EXPECT_TRUE(bptest::close(dt, got.grads[k], want.grads[k], tol))
            << c.name << " gradient of input " << k << " on " << dev().str() << " "
            << bp::dtype_name(dt);
    }
  }
  if (ran == 0) GTEST_SKIP() << dev().str() << " has none of the convolutional family's ops";
}

INSTANTIATE_TEST_SUITE_P(Devices, ConvGradDevice, ::testing::ValuesIn(bptest::device_strings()),
                         bptest::param_name);

// Batch norm's running statistics and BatchNorm2d's state as PyTorch updates them.
TEST_P(ConvGradDevice, BatchNormRunningStatistics) {
  if (!dev().supports(bp::Op::batch_norm, bp::DType::f32)) GTEST_SKIP() << "no batch_norm";
  const bp::Shape s = {4, 3, 2, 5};
  std::vector<double> x = bptest::random_values(120, -3, 3);
  bp::nn::BatchNorm2d bn(3, 1e-5, std::nullopt, true, true, dev());
  bp::Tensor t = make(x, s);
  bn(t);
  bn(t * 2.0);
  // Cumulative average (momentum None) over two batches: the mean of the two batch statistics.
  std::vector<double> mean(3, 0), var(3, 0);
  for (int k = 0; k < 2; ++k) {
    const double scale = k == 0 ? 1.0 : 2.0;
    for (int c = 0; c < 3; ++c) {
      double m = 0, q = 0;
      for (int n = 0; n < 4; ++n)
        for (int l = 0; l < 10; ++l) m += scale * x[static_cast<size_t>((n * 3 + c) * 10 + l)];
      m /= 40;
      for (int n = 0; n < 4; ++n)
        for (int l = 0; l < 10; ++l) {
          double d = scale * x[static_cast<size_t>((n * 3 + c) * 10 + l)] - m;
          q += d * d;
        }
      mean[static_cast<size_t>(c)] += m / 2;
      var[static_cast<size_t>(c)] += q / 39 / 2;
    }
  }
  // Factor 1/1 then 1/2: r = b1, then r = b1 / 2 + b2 / 2 (unbiased variances).
  EXPECT_TRUE(bptest::close(bp::DType::f32, bn.running_mean().to_vector<double>(), mean))
      << "running_mean on " << dev().str();
  EXPECT_TRUE(bptest::close(bp::DType::f32, bn.running_var().to_vector<double>(), var))
      << "running_var on " << dev().str();
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 2);
  bn.eval();
  bp::Tensor y = bn(t);
  std::vector<double> yv = y.to_vector<double>(), ref(120);
  for (size_t i = 0; i < 120; ++i) {
    const size_t c = (i / 10) % 3;
    ref[i] = (x[i] - mean[c]) / std::sqrt(var[c] + 1e-5);
  }
  EXPECT_TRUE(bptest::close(bp::DType::f32, yv, ref, {.scale = 4}))
      << "eval output on " << dev().str();
}

// A conv net's SGD step (Conv2d, BatchNorm2d in training, ReLU, MaxPool2d, Linear, cross
// entropy) captured in a bp::Graph and replayed gives the losses and weights of the same steps
// run eagerly (num_batches_tracked counts the replays).
TEST_P(ConvGradDevice, CapturedTrainingStepMatchesEager) {
  for (bp::Op op : {bp::Op::conv2d, bp::Op::conv2d_backward_weight, bp::Op::batch_norm_backward,
                    bp::Op::max_pool2d_backward, bp::Op::log_softmax})
    if (!dev().supports(op, bp::DType::f32))
      GTEST_SKIP() << dev().str() << " lacks " << bp::op_name(op);
  struct Net {
    bp::nn::Sequential net;
    bp::Tensor x, y, loss;
    std::unique_ptr<bp::optim::SGD> opt;
    explicit Net(bp::Device& d) {
      bp::manual_seed(5);
      net.add<bp::nn::Conv2d>(3, 4, 3, 1, 1, 1, 1, true, d);
      net.add<bp::nn::BatchNorm2d>(4, 1e-5, 0.1, true, true, d);
      net.add<bp::nn::ReLU>();
      net.add<bp::nn::MaxPool2d>(2);
      net.add<bp::nn::Flatten>();
      net.add<bp::nn::Linear>(4 * 4 * 4, 5, true, d);
      x = bp::randn({6, 3, 8, 8}, d);
      y = bp::from_vector<int64_t>({0, 1, 2, 3, 4, 0}, {6}, d);
      opt = std::make_unique<bp::optim::SGD>(net.parameters(),
                                             bp::optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    }
    void step() {
      opt->zero_grad();
      loss = bp::nn::cross_entropy(net(x), y);
      loss.backward();
      opt->step();
    }
  };
  Net eager(dev()), replayed(dev());
  eager.step();
  replayed.step();
  bp::Graph g = bp::capture(dev(), [&] { replayed.step(); });
  for (int k = 0; k < 4; ++k) {
    eager.step();
    g.replay();
    EXPECT_TRUE(
        bptest::close(bp::DType::f32, {replayed.loss.item<double>()}, {eager.loss.item<double>()}))
        << "step " << k + 2 << " on " << dev().str();
  }
  auto se = eager.net.state_dict(), sr = replayed.net.state_dict();
  for (const auto& [key, t] : se)
    EXPECT_TRUE(bptest::close(t.dtype(), sr.at(key).to_vector<double>(), t.to_vector<double>()))
        << key << " after the replays on " << dev().str();
}

// bp::nn modules on every device: layer outputs against a float64 host reference on fresh
// random data, LazyLinear inference, state names, to(device), modes, load_state_dict.
#include "nn_test_support.hpp"

#include <sstream>

namespace {

using bp::Shape;
using bp::Tensor;
using namespace bp::nn;

class NnTest : public ::testing::TestWithParam<std::string> {
 protected:
  bp::Device& dev() { return bp::device(GetParam()); }
  Tensor random(const Shape& shape, std::vector<double>* values = nullptr, double lo = -2,
                double hi = 2) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<double> v = nntest::as_f32(nntest::random_values(static_cast<size_t>(n), lo, hi));
    if (values) *values = v;
    return nntest::make(v, shape, dev());
  }
};

TEST_P(NnTest, LinearMatchesHostReference) {
  for (auto [batch, in, out] :
       {std::tuple<int64_t, int64_t, int64_t>{3, 5, 7}, {1, 1, 1}, {17, 33, 9}, {64, 130, 3}}) {
    Linear lin(in, out, true, dev());
    std::vector<double> xv;
    Tensor x = random({batch, in}, &xv);
    Tensor y = lin(x);
    ASSERT_EQ(y.shape(), (Shape{batch, out}));
    EXPECT_EQ(&y.device(), &dev());
    auto ref = nntest::linear_ref(xv, lin.weight().to_vector<double>(),
                                  lin.bias().to_vector<double>(), batch, in, out);
    EXPECT_TRUE(nntest::close(y.to_vector<double>(), ref, 1e-5))
        << batch << "x" << in << " -> " << out;
  }
}

TEST_P(NnTest, LinearWithoutBiasAndBatchedInput) {
  Linear lin(6, 4, false, dev());
  EXPECT_FALSE(lin.bias().defined());
  EXPECT_EQ(lin.parameters().size(), 1u);
  std::vector<double> xv;
  Tensor x = random({2, 3, 6}, &xv);
  Tensor y = lin(x);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  auto ref = nntest::linear_ref(xv, lin.weight().to_vector<double>(), {}, 6, 6, 4);
  EXPECT_TRUE(nntest::close(y.to_vector<double>(), ref, 1e-5));
}

TEST_P(NnTest, LinearInitialisationLikePyTorch) {
  bp::manual_seed(1234);
  Linear lin(50, 20, true, dev());
  double bound = 1.0 / std::sqrt(50.0);
  for (const Tensor& p : {lin.weight(), lin.bias()}) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_EQ(&p.device(), &dev());
    EXPECT_EQ(p.dtype(), bp::DType::f32);
    auto v = p.to_vector<double>();
    double lo = 1, hi = -1;
    for (double x : v) lo = std::min(lo, x), hi = std::max(hi, x);
    EXPECT_GE(lo, -bound);
    EXPECT_LT(hi, bound);
    EXPECT_GT(hi - lo, bound);  // spread out, not constant
  }
  EXPECT_EQ(lin.weight().shape(), (Shape{20, 50}));
  EXPECT_EQ(lin.bias().shape(), (Shape{20}));
}

TEST_P(NnTest, SameSeedSameParametersOnEveryDevice) {
  bp::manual_seed(42);
  Linear here(9, 5, true, dev());
  bp::manual_seed(42);
  Linear host(9, 5, true, bp::device("cpu:0"));
  EXPECT_EQ(here.weight().to_vector<float>(), host.weight().to_vector<float>());
  EXPECT_EQ(here.bias().to_vector<float>(), host.bias().to_vector<float>());
}

TEST_P(NnTest, ActivationsMatchHostReference) {
  std::vector<double> xv;
  Tensor x = random({7, 13}, &xv, -4, 4);
  struct Case {
    std::shared_ptr<Module> m;
    double (*ref)(double);
  } cases[] = {
      {std::make_shared<ReLU>(), [](double v) { return v > 0 ? v : 0.0; }},
      {std::make_shared<Sigmoid>(), [](double v) { return 1 / (1 + std::exp(-v)); }},
      {std::make_shared<Tanh>(), [](double v) { return std::tanh(v); }},
  };
  for (auto& c : cases) {
    std::vector<double> ref(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) ref[i] = c.ref(xv[i]);
    Tensor y = (*c.m)(x);
    EXPECT_EQ(&y.device(), &dev());
    EXPECT_TRUE(nntest::close(y.to_vector<double>(), ref, 1e-6)) << c.m->name();
    EXPECT_TRUE(c.m->parameters().empty());
  }
}

TEST_P(NnTest, SequentialMlpMatchesHostReference) {
  Sequential net;
  net.add<Linear>(5, 8, true, dev());
  net.add<ReLU>();
  net.add<Linear>(8, 3, true, dev());
  net.add<Tanh>();
  std::vector<double> xv;
  Tensor x = random({11, 5}, &xv);
  Tensor y = net(x);
  auto& l0 = net.get<Linear>(0);
  auto& l2 = net.get<Linear>(2);
  auto h = nntest::linear_ref(xv, l0.weight().to_vector<double>(), l0.bias().to_vector<double>(),
                              11, 5, 8);
  for (double& v : h) v = v > 0 ? v : 0;
  auto ref = nntest::linear_ref(h, l2.weight().to_vector<double>(), l2.bias().to_vector<double>(),
                                11, 8, 3);
  for (double& v : ref) v = std::tanh(v);
  EXPECT_TRUE(nntest::close(y.to_vector<double>(), ref, 1e-5));
}

TEST_P(NnTest, LazyLinearInfersInputSizeOnFirstCall) {
  Sequential net;
  net.add<LazyLinear>(1);
  auto& lazy = net.get<LazyLinear>(0);
  EXPECT_EQ(lazy.in_features(), -1);
  EXPECT_TRUE(net.has_uninitialized_parameters());
  EXPECT_TRUE(net.parameters().empty());
  auto spec = net.state_spec();
  ASSERT_EQ(spec.size(), 2u);
  EXPECT_EQ(spec[0].key, "0.weight");
  EXPECT_FALSE(spec[0].initialized);
  EXPECT_EQ(spec[0].shape, (Shape{1, -1}));

  std::vector<double> xv;
  Tensor x = random({4, 6}, &xv);
  Tensor y = net(x);
  EXPECT_EQ(y.shape(), (Shape{4, 1}));
  EXPECT_EQ(&y.device(), &dev());
  EXPECT_EQ(&net.get<Linear>(0).weight().device(), &dev());  // typed access through the base
  EXPECT_EQ(lazy.in_features(), 6);
  EXPECT_EQ(lazy.weight().shape(), (Shape{1, 6}));
  EXPECT_TRUE(lazy.weight().requires_grad());
  EXPECT_FALSE(net.has_uninitialized_parameters());
  EXPECT_EQ(net.parameters().size(), 2u);
  auto ref = nntest::linear_ref(xv, lazy.weight().to_vector<double>(),
                                lazy.bias().to_vector<double>(), 4, 6, 1);
  EXPECT_TRUE(nntest::close(y.to_vector<double>(), ref, 1e-5));
  // The inferred size is now fixed.
  EXPECT_THROW(net(random({4, 7})), bp::ShapeError);
}

TEST_P(NnTest, LazyLinearTakesTheInputDtype) {
  if (!dev().properties().supports_f64) GTEST_SKIP() << dev().str() << " has no f64";
  LazyLinear lazy(3);
  Tensor x = random({2, 4}).to(bp::DType::f64);
  EXPECT_EQ(lazy(x).dtype(), bp::DType::f64);
  EXPECT_EQ(lazy.weight().dtype(), bp::DType::f64);
  LazyLinear ints(3);
  EXPECT_THROW(ints(bp::zeros({2, 4}, dev(), bp::DType::i32)), bp::DTypeError);
}

TEST_P(NnTest, LinearRejectsWrongInputWidth) {
  Linear lin(3, 2, true, dev());
  try {
    lin(random({4, 5}));
    FAIL() << "expected ShapeError";
  } catch (const bp::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("in_features=3"), std::string::npos) << e.what();
  }
}

// A module with a nested child and a buffer, to check key names and placement.
class Block : public Module {
 public:
  explicit Block(bp::Device& d) {
    body_ = &register_module("block", std::make_shared<Sequential>());
    body_->add<Linear>(3, 4, true, d);
    body_->add<ReLU>();
    head_ = &register_module("head", std::make_shared<Linear>(4, 2, true, d));
    scale_ = register_buffer("scale", bp::full({2}, 0.5, d));
  }
  Tensor forward(const Tensor& x) override { return (*head_)((*body_)(x)) * slot(scale_); }
  std::string name() const override { return "Block"; }

 private:
  Sequential* body_;
  Linear* head_;
  size_t scale_;
};

TEST_P(NnTest, NamedParametersUsePyTorchKeys) {
  Sequential net;
  net.add<Linear>(3, 4, true, dev());
  net.add<ReLU>();
  net.add<Linear>(4, 1, true, dev());
  std::vector<std::string> keys;
  for (auto& [k, t] : net.named_parameters()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));

  Block block(dev());
  keys.clear();
  for (auto& [k, t] : block.named_parameters()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"block.0.weight", "block.0.bias", "head.weight",
                                            "head.bias"}));
  auto buffers = block.named_buffers();
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_EQ(buffers[0].first, "scale");
  EXPECT_FALSE(buffers[0].second.requires_grad());
  EXPECT_EQ(block.state_dict().size(), 5u);
}

TEST_P(NnTest, SequentialIndexingAndTypedAccess) {
  Sequential net;
  net.add<Linear>(2, 3, true, dev());
  net.add<ReLU>();
  EXPECT_EQ(net.size(), 2u);
  EXPECT_EQ(net[1].name(), "ReLU()");
  EXPECT_EQ(net.get<Linear>(0).out_features(), 3);
  EXPECT_THROW(net.get<Linear>(1), bp::Error);
  EXPECT_THROW(net[2], bp::Error);
  auto shared = std::make_shared<Sigmoid>();
  EXPECT_EQ(&net.add(shared), shared.get());
  EXPECT_EQ(net.size(), 3u);
}

TEST_P(NnTest, PrintsTheModuleTree) {
  Sequential net;
  net.add<LazyLinear>(1);
  net.add<ReLU>();
  std::ostringstream os;
  os << net;
  EXPECT_EQ(os.str(),
            "Sequential(\n  (0): LazyLinear(in_features=?, out_features=1, bias=true)\n"
            "  (1): ReLU()\n)");
}

TEST_P(NnTest, ToMovesEveryParameterAndBuffer) {
  bp::Device& cpu = bp::device("cpu:0");
  Block block(cpu);
  Tensor x = random({5, 3}).to(cpu);
  Tensor before = block(x);
  // Give one parameter a gradient; it moves with the parameter.
  before.sum().backward();
  ASSERT_TRUE(block.named_parameters()[0].second.grad().defined());
  std::vector<bp::Device*> route = {&dev()};
  for (bp::Device* d : bp::devices()) route.push_back(d);  // and across every device
  route.push_back(&dev());
  for (bp::Device* d : route) {
    EXPECT_EQ(&block.to(*d), &block);
    for (auto& [k, t] : block.state_dict()) EXPECT_EQ(&t.device(), d) << k << " -> " << d->str();
    for (auto& [k, t] : block.named_parameters()) {
      EXPECT_TRUE(t.requires_grad()) << k;
      EXPECT_TRUE(t.grad_fn() == nullptr) << k << " must stay a leaf";
      ASSERT_TRUE(t.grad().defined()) << k;
      EXPECT_EQ(&t.grad().device(), d) << k;
    }
  }
  Tensor after = block(x.to(dev()));
  EXPECT_EQ(&after.device(), &dev());
  EXPECT_TRUE(nntest::allclose(after.cpu(), before.detach(), 1e-5, 1e-6));
  // A moved model trains: gradients land on the device.
  block.zero_grad();
  after.sum().backward();
  for (const Tensor& p : block.parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(&p.grad().device(), &dev());
  }
}

// PyTorch's order: an optimiser built before to(device) keeps updating the model, because
// to() moves the parameters in place (Note [Module state]). Before, the optimiser held the
// old tensors and the model's weights never changed.
TEST_P(NnTest, OptimiserBuiltBeforeToKeepsWorking) {
  bp::Device& cpu = bp::device("cpu:0");
  Linear lin(4, 3, true, cpu);
  Tensor w_handle = lin.weight();
  bp::optim::SGD opt(lin.parameters(), {.lr = 0.1});
  lin.to(dev());
  EXPECT_TRUE(lin.weight().is_same(w_handle));
  EXPECT_EQ(&w_handle.device(), &dev());
  EXPECT_TRUE(w_handle.requires_grad());
  std::vector<double> xv;
  Tensor x = random({5, 4}, &xv);
  auto w0 = lin.weight().to_vector<double>();
  auto b0 = lin.bias().to_vector<double>();
  lin(x).sum().backward();
  opt.step();
  // d(sum y)/dW[o, i] = sum_b x[b, i]; d/db[o] = batch size.
  std::vector<double> w_ref(w0), b_ref(b0);
  for (int o = 0; o < 3; ++o) {
    b_ref[o] -= 0.1 * 5;
    for (int i = 0; i < 4; ++i)
      for (int b = 0; b < 5; ++b) w_ref[o * 4 + i] -= 0.1 * xv[b * 4 + i];
  }
  EXPECT_TRUE(nntest::close(lin.weight().to_vector<double>(), w_ref, 1e-5));
  EXPECT_TRUE(nntest::close(lin.bias().to_vector<double>(), b_ref, 1e-5));
  // load_state_dict keeps identity too.
  std::map<std::string, Tensor> state = {{"weight", bp::zeros({3, 4}, dev())},
                                         {"bias", bp::ones({3}, dev())}};
  lin.load_state_dict(state);
  EXPECT_TRUE(lin.weight().is_same(w_handle));
  EXPECT_EQ(w_handle.to_vector<float>(), std::vector<float>(12, 0.0f));
}

TEST_P(NnTest, ToIsANoOpWhenAlreadyThere) {
  Linear lin(3, 3, true, dev());
  Tensor w = lin.weight();
  lin.to(dev());
  EXPECT_TRUE(lin.weight().is_same(w));
}

TEST_P(NnTest, ToDTypeCastsParameters) {
  if (!dev().properties().supports_f64) GTEST_SKIP() << dev().str() << " has no f64";
  Linear lin(3, 2, true, dev());
  auto w32 = lin.weight().to_vector<double>();
  lin.to(bp::DType::f64);
  EXPECT_EQ(lin.weight().dtype(), bp::DType::f64);
  EXPECT_TRUE(lin.weight().requires_grad());
  EXPECT_EQ(lin.weight().to_vector<double>(), w32);
  EXPECT_THROW(lin.to(bp::DType::i32), bp::DTypeError);
}

TEST_P(NnTest, GradientsOfLinearMatchHandDerivation) {
  Linear lin(4, 3, true, dev());
  std::vector<double> xv;
  Tensor x = random({5, 4}, &xv);
  lin(x).sum().backward();
  // d(sum y)/dW[o, i] = sum_b x[b, i]; d/db[o] = batch.
  std::vector<double> gw(12), gb(3, 5.0);
  for (int o = 0; o < 3; ++o)
    for (int i = 0; i < 4; ++i)
      for (int b = 0; b < 5; ++b) gw[o * 4 + i] += xv[b * 4 + i];
  EXPECT_TRUE(nntest::close(lin.weight().grad().to_vector<double>(), gw, 1e-5));
  EXPECT_TRUE(nntest::close(lin.bias().grad().to_vector<double>(), gb, 1e-6));
  lin.zero_grad();
  EXPECT_FALSE(lin.weight().grad().defined());
}

TEST_P(NnTest, TrainAndEvalReachEveryChild) {
  Block block(dev());
  EXPECT_TRUE(block.is_training());
  block.eval();
  EXPECT_FALSE(block.is_training());
  for (auto& [n, c] : block.named_children()) EXPECT_FALSE(c->is_training()) << n;
  block.train();
  for (auto& [n, c] : block.named_children()) EXPECT_TRUE(c->is_training()) << n;
}

TEST_P(NnTest, LoadStateDictChecksBeforeChanging) {
  Sequential net;
  net.add<Linear>(3, 4, true, dev());
  Tensor w = net.get<Linear>(0).weight();
  std::map<std::string, Tensor> state = {{"0.weight", bp::zeros({4, 5}, dev())},
                                         {"0.bias", bp::zeros({4}, dev())}};
  EXPECT_THROW(net.load_state_dict(state), bp::ShapeError);
  EXPECT_TRUE(net.get<Linear>(0).weight().is_same(w));  // untouched

  state = {{"0.weight", bp::ones({4, 3}, dev())}};
  EXPECT_THROW(net.load_state_dict(state), bp::ShapeError);  // 0.bias missing
  auto r = net.load_state_dict(state, LoadOptions{.strict = false});
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"0.bias"});
  EXPECT_TRUE(r.unexpected_keys.empty());
  EXPECT_TRUE(net.get<Linear>(0).weight().requires_grad());
  EXPECT_EQ(net.get<Linear>(0).weight().to_vector<float>(), std::vector<float>(12, 1.0f));

  state = {{"0.weight", bp::ones({4, 3}, dev(), bp::DType::i32)}, {"0.bias", bp::ones({4}, dev())}};
  EXPECT_THROW(net.load_state_dict(state), bp::DTypeError);
}

TEST_P(NnTest, RegistrationRejectsBadNames) {
  struct Bad : Module {
    Tensor forward(const Tensor& x) override { return x; }
    std::string name() const override { return "Bad"; }
    void try_register(const std::string& n) { register_parameter(n, bp::zeros({1})); }
  } bad;
  bad.try_register("w");
  EXPECT_THROW(bad.try_register("w"), bp::Error);
  EXPECT_THROW(bad.try_register("a.b"), bp::Error);
  EXPECT_THROW(bad.try_register(""), bp::Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, NnTest, ::testing::ValuesIn(nntest::device_strings()),
                         nntest::param_name);

}  // namespace

// Training state on every device: AdamW against a float64 host reference with two parameter
// groups, options changed between steps, optimiser and scheduler state dicts, the schedulers'
// formulas, and checkpoints whose resumed run repeats the uninterrupted run's losses exactly.
#include <backplane_test/throws.hpp>
#include "nn_test_support.hpp"

#include <backplane/checkpoint.hpp>
#include <backplane/lr_scheduler.hpp>
#include <backplane/nn_conv.hpp>
#include <backplane/train.hpp>

#include <cmath>
#include <numbers>

namespace {

using bp::Tensor;
using namespace bp::optim;
using namespace bp::optim::lr_scheduler;

using bp_test::expect_throw;

class TrainStateTest : public ::testing::TestWithParam<std::string> {
 protected:
  bp::Device& dev() { return bp::device(GetParam()); }
};

// One AdamW step of torch.optim.AdamW in float64 for one parameter.
struct AdamWRef {
  std::vector<double> p, m, v;
  int64_t t = 0;
  void step(const std::vector<double>& g, double lr, double b1, double b2, double eps, double wd) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0);
    ++t;
    const double bc1 = 1 - std::pow(b1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(b2, static_cast<double>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
};

TEST_P(TrainStateTest, AdamWWithTwoGroupsMatchesAFloat64Reference) {
  auto p0 = nntest::as_f32(nntest::random_values(12)),
       p1 = nntest::as_f32(nntest::random_values(5));
  Tensor a = nntest::make(p0, {3, 4}, dev()), b = nntest::make(p1, {5}, dev());
  a.requires_grad_(true);
  b.requires_grad_(true);
  AdamW opt({ParamGroup{{a}, {}}, ParamGroup{{b}, {{"lr", 0.05}, {"weight_decay", 0.0}}}},
            AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  EXPECT_EQ(opt.name(), "AdamW");
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].options.at("beta2"), 0.999);  // from the defaults
  AdamWRef ra{p0, {}, {}}, rb{p1, {}, {}};
  for (int s = 0; s < 3; ++s) {
    auto ga = nntest::as_f32(nntest::random_values(12)),
         gb = nntest::as_f32(nntest::random_values(5));
    a.set_grad(nntest::make(ga, {3, 4}, dev()));
    b.set_grad(nntest::make(gb, {5}, dev()));
    if (s == 2) opt.param_groups()[0].set_lr(0.02);  // changed between steps: used at once
    opt.step();
    ra.step(ga, s == 2 ? 0.02 : 0.01, 0.9, 0.999, 1e-8, 0.1);
    rb.step(gb, 0.05, 0.9, 0.999, 1e-8, 0.0);
  }
  // A handful of f32 roundings per step on values of order 1.
  EXPECT_TRUE(nntest::allclose(a, nntest::make(ra.p, {3, 4}, dev()), 2e-6, 2e-6));
  EXPECT_TRUE(nntest::allclose(b, nntest::make(rb.p, {5}, dev()), 2e-6, 2e-6));

  OptimizerStateDict sd = opt.state_dict();
  EXPECT_EQ(sd.optimizer, "AdamW");
  ASSERT_EQ(sd.params.size(), 2u);
  EXPECT_EQ(sd.params[1], std::vector<int64_t>{1});
  EXPECT_EQ(sd.state.at(0).step, 3);
  EXPECT_TRUE(nntest::allclose(sd.state.at(1).buffers.at("exp_avg"), nntest::make(rb.m, {5}, dev()),
                               2e-6, 2e-6));
}

TEST_P(TrainStateTest, BadGroupsAndStatesAreRefusedNamingWhat) {
  Tensor a = nntest::make(nntest::random_values(4), {4}, dev());
  EXPECT_HAS(expect_throw<bp::Error>([&] {
               AdamW({ParamGroup{{a}, {{"betas", 0.9}}}});
             }),
             "unknown option 'betas' (known: beta1, beta2, eps, lr, weight_decay)");
  EXPECT_HAS(expect_throw<bp::Error>([&] {
               AdamW({ParamGroup{{a}, {}}, ParamGroup{{a}, {}}});
             }),
             "group 1 parameter 0 already belongs to a group");
  EXPECT_HAS(expect_throw<bp::Error>([&] {
               SGD({ParamGroup{{a}, {{"lr", -1.0}}}}, {});
             }),
             "group 0 has lr -1");
  AdamW opt({a});
  OptimizerStateDict sd = opt.state_dict();
  sd.optimizer = "SGD";
  EXPECT_HAS(expect_throw<bp::Error>([&] { opt.load_state_dict(sd); }), "SGD's, not AdamW's");
  sd = opt.state_dict();
  sd.state[0].step = 1;
  sd.state[0].buffers["exp_avg"] = nntest::make(nntest::random_values(3), {3}, dev());
  sd.state[0].buffers["exp_avg_sq"] = nntest::make(nntest::random_values(4), {4}, dev());
  EXPECT_HAS(expect_throw<bp::ShapeError>([&] { opt.load_state_dict(sd); }),
             "parameter 0's exp_avg is [3], the parameter [4]");
  EXPECT_TRUE(opt.state_dict().state.empty());  // nothing changed
}

TEST_P(TrainStateTest, SchedulersFollowTheirFormulas) {
  Tensor a = nntest::make(nntest::random_values(4), {4}, dev());
  {
    SGD opt({a}, {.lr = 0.5});
    StepLR s(opt, 3, 0.5);
    std::vector<double> got;
    for (int e = 0; e < 7; ++e, s.step()) got.push_back(opt.lr());
    EXPECT_EQ(got, (std::vector<double>{0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125}));
  }
  {
    SGD opt({a}, {.lr = 0.3});
    CosineAnnealingLR s(opt, 10, 0.01);
    for (int e = 0; e < 4; ++e) s.step();
    EXPECT_DOUBLE_EQ(opt.lr(), 0.01 + 0.29 * (1 + std::cos(std::numbers::pi * 0.4)) / 2);
  }
  {
    AdamW opt({a}, {.lr = 1e-3});
    auto s = get_cosine_schedule_with_warmup(opt, 4, 12);
    EXPECT_DOUBLE_EQ(opt.lr(), 0.0);
    for (int e = 0; e < 2; ++e) s->step();
    EXPECT_DOUBLE_EQ(opt.lr(), 0.5e-3);
    for (int e = 2; e < 8; ++e) s->step();
    EXPECT_NEAR(opt.lr(), 0.5e-3, 1e-18);  // half-way through the cosine
    EXPECT_EQ(s->name(), "CosineWithWarmup");
  }
  {
    // OneCycleLR's landmarks as PyTorch defines them: max_lr / 25 at step 0, max_lr at
    // pct_start * total - 1, max_lr / 25 / 1e4 at total - 1; beta1 moves the other way.
    AdamW opt({a});
    OneCycleLR s(opt, 0.1, {.total_steps = 100});
    EXPECT_DOUBLE_EQ(opt.lr(), 0.004);
    EXPECT_DOUBLE_EQ(opt.param_groups()[0].options.at("beta1"), 0.95);
    for (int e = 0; e < 29; ++e) s.step();
    EXPECT_DOUBLE_EQ(opt.lr(), 0.1);
    EXPECT_DOUBLE_EQ(opt.param_groups()[0].options.at("beta1"), 0.85);
    for (int e = 29; e < 99; ++e) s.step();
    EXPECT_NEAR(opt.lr(), 4e-7, 1e-20);
    s.step();  // step 100 = total_steps is allowed, as in PyTorch; 101 is not
    EXPECT_HAS(expect_throw<bp::Error>([&] { s.step(); }),
               "tried to step 101 times; the specified number of total steps is 100");
  }
  {
    SGD opt({a}, {.lr = 1.0});
    EXPECT_HAS(expect_throw<bp::Error>([&] { StepLR(opt, 0); }), "step_size 0 must be at least 1");
    LambdaLR bad(opt, [](int64_t e) { return e < 1 ? 1.0 : -1.0; });
    EXPECT_HAS(expect_throw<bp::Error>([&] { bad.step(); }), "lr_lambda(1) returned -1");
  }
}

TEST_P(TrainStateTest, SchedulerStateResumesTheSchedule) {
  Tensor a = nntest::make(nntest::random_values(4), {4}, dev());
  SGD o1({a}, {.lr = 0.2, .momentum = 0.9});
  OneCycleLR s1(o1, 0.2, {.total_steps = 50});
  for (int e = 0; e < 17; ++e) s1.step();
  SGD o2({a}, {.lr = 0.2, .momentum = 0.9});
  OneCycleLR s2(o2, 0.2, {.total_steps = 50});
  s2.load_state_dict(s1.state_dict());
  EXPECT_EQ(s2.last_epoch(), 17);
  EXPECT_EQ(o2.lr(), o1.lr());
  EXPECT_EQ(o2.param_groups()[0].options.at("momentum"),
            o1.param_groups()[0].options.at("momentum"));
  auto st = s1.state_dict();
  st["base_lr.3"] = 0.1;
  EXPECT_HAS(expect_throw<bp::Error>([&] { s2.load_state_dict(st); }),
             "unexpected key 'base_lr.3' (this optimizer has 1 parameter groups)");
}

// A model with dropout (the random stream) and a tied-free MLP, trained on batches that are a
// function of the step.
struct TrainRun {
  std::unique_ptr<bp::nn::Sequential> model;
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<LambdaLR> sched;
  TrainRun(bp::Device& d, uint64_t init_seed) {
    bp::manual_seed(init_seed);
    model = std::make_unique<bp::nn::Sequential>();
    model->add<bp::nn::Linear>(6, 16);
    model->add<bp::nn::ReLU>();
    model->add<bp::nn::Dropout>(0.2);
    model->add<bp::nn::Linear>(16, 3);
    model->to(d);
    std::vector<ParamGroup> groups{{model->parameters(), {}}};
    opt = std::make_unique<AdamW>(groups, AdamWOptions{.lr = 3e-2, .weight_decay = 0.05});
    sched = get_cosine_schedule_with_warmup(*opt, 3, 20);
  }
  double step(bp::Device& d, int64_t k) {
    bp::Generator g(1000 + static_cast<uint64_t>(k));
    Tensor x = bp::randn({8, 6}, d, bp::DType::f32, &g);
    Tensor y = bp::randn({8, 3}, d, bp::DType::f32, &g);
    opt->zero_grad();
    Tensor loss = bp::nn::mse_loss(model->forward(x), y);
    loss.backward();
    opt->step();
    sched->step();
    return loss.item<double>();
  }
};

TEST_P(TrainStateTest, AResumedRunRepeatsTheUninterruptedLossesExactly) {
  nntest::ScratchDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  std::vector<double> whole, resumed;
  {
    TrainRun r(dev(), 7);
    for (int64_t k = 0; k < 12; ++k) whole.push_back(r.step(dev(), k));
  }
  {
    TrainRun r(dev(), 7);
    for (int64_t k = 0; k < 6; ++k) resumed.push_back(r.step(dev(), k));
    bp::save_checkpoint(path, *r.model, *r.opt, r.sched.get(), 6, {{"note", "half-way"}});
  }
  {
    TrainRun r(dev(), 99);  // other initial weights and random state
    bp::manual_seed(12345);
    bp::CheckpointInfo info = bp::load_checkpoint(path, *r.model, *r.opt, r.sched.get());
    EXPECT_EQ(info.step, 6);
    EXPECT_EQ(info.metadata.at("note"), "half-way");
    EXPECT_EQ(r.sched->last_epoch(), 6);
    for (int64_t k = 6; k < 12; ++k) resumed.push_back(r.step(dev(), k));
  }
  ASSERT_EQ(whole.size(), resumed.size());
  for (size_t k = 0; k < whole.size(); ++k)
    EXPECT_EQ(whole[k], resumed[k]) << "step " << k;  // bitwise: same device, same work
  EXPECT_LT(whole.back(), whole.front());
}

TEST_P(TrainStateTest, AMismatchedCheckpointIsRefusedBeforeAnythingChanges) {
  nntest::ScratchDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  TrainRun saved(dev(), 3);
  saved.step(dev(), 0);
  bp::save_checkpoint(path, *saved.model, *saved.opt, saved.sched.get(), 1);

  bp::manual_seed(5);
  bp::nn::Sequential other;
  other.add<bp::nn::Linear>(6, 16);
  other.add<bp::nn::ReLU>();
  other.add<bp::nn::Dropout>(0.2);
  other.add<bp::nn::Linear>(16, 4);
  other.to(dev());
  AdamW oopt(other.parameters());
  const std::vector<double> before = other.parameters()[0].to_vector<double>();
  std::string m = expect_throw<bp::ShapeError>([&] { bp::load_checkpoint(path, other, oopt); });
  EXPECT_HAS(m, "'3.bias' has shape [3] in the checkpoint but the model's is [4]");
  EXPECT_EQ(other.parameters()[0].to_vector<double>(), before);
  EXPECT_TRUE(oopt.state_dict().state.empty());

  // The right model with an SGD optimiser: refused, parameters unchanged.
  TrainRun same(dev(), 4);
  SGD sgd(same.model->parameters(), {});
  const std::vector<double> w = same.model->parameters()[0].to_vector<double>();
  EXPECT_HAS(expect_throw<bp::Error>([&] { bp::load_checkpoint(path, *same.model, sgd); }),
             "the checkpoint has a CosineWithWarmup scheduler's state");
  LambdaLR lam(
      sgd, [](int64_t) { return 1.0; }, "CosineWithWarmup");
  EXPECT_HAS(expect_throw<bp::Error>([&] { bp::load_checkpoint(path, *same.model, sgd, &lam); }),
             "AdamW's, not SGD's");
  EXPECT_EQ(same.model->parameters()[0].to_vector<double>(), w);

  // A sidecar from another save of the same model.
  const std::string side = nntest::read_all(path + ".json");
  bp::save_checkpoint(path, *saved.model, *saved.opt, saved.sched.get(), 2);
  nntest::write_all(path + ".json", side);
  EXPECT_HAS(expect_throw<bp::IOError>(
                 [&] { bp::load_checkpoint(path, *saved.model, *saved.opt, saved.sched.get()); }),
             "are not one save");
  nntest::write_all(path + ".json", "{\"format\": 3}");
  EXPECT_HAS(expect_throw<bp::IOError>(
                 [&] { bp::load_checkpoint(path, *saved.model, *saved.opt, saved.sched.get()); }),
             "not a Backplane checkpoint sidecar");
}

INSTANTIATE_TEST_SUITE_P(Devices, TrainStateTest, ::testing::ValuesIn(nntest::device_strings()),
                         nntest::param_name);

}  // namespace

// Adam and AdamW with fused=true (Note [Fused optimiser step] in optim.hpp) on every device:
// 20 steps on fresh random parameters and gradients give the per-op update's parameters and
// state within the dtype's tolerance (f32 and f64; lower precisions are compared with a float64
// reference per step by bp-conformance's adamw cases), including a parameter without a
// gradient (skipped), parameters that start stepping late (another step count, another launch),
// several groups, a state loaded with load_state_dict, and the refusal inside a graph capture.
#include <backplane_test/throws.hpp>
#include "nn_test_support.hpp"

#include <backplane/graph.hpp>
#include <backplane/profiler.hpp>
#include <backplane/train.hpp>

namespace {

using bp::Tensor;
using namespace bp::optim;

class FusedAdamTest : public ::testing::TestWithParam<std::string> {
 protected:
  bp::Device& dev() { return bp::device(GetParam()); }
};

const std::vector<bp::Shape> kShapes = {{7, 13}, {31}, {1}, {64, 33}, {3, 1, 5}};

size_t count(const bp::Shape& s) {
  size_t n = 1;
  for (int64_t d : s) n *= static_cast<size_t>(d);
  return n;
}

// Identical parameters for the fused and the per-op optimiser.
std::vector<Tensor> params(const std::vector<std::vector<double>>& values, bp::Device& d,
                           bp::DType dt) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < kShapes.size(); ++k)
    out.push_back(nntest::make(values[k], kShapes[k], d, dt).requires_grad_(true));
  return out;
}

void expect_state_close(Optimizer& fused, Optimizer& unfused, bp::DType dt, int step) {
  const std::vector<Tensor> a = fused.parameters(), b = unfused.parameters();
  const double rtol = 4 * bp_test::rtol(static_cast<int32_t>(dt));
  for (size_t k = 0; k < a.size(); ++k)
    EXPECT_TRUE(bp_test::all_close(static_cast<int32_t>(dt), a[k].to_vector<double>(),
                                   b[k].to_vector<double>(), {.rtol = rtol}))
        << "parameter " << k << " after step " << step;
  const OptimizerStateDict sa = fused.state_dict(), sb = unfused.state_dict();
  ASSERT_EQ(sa.state.size(), sb.state.size());
  for (const auto& [n, st] : sa.state) {
    EXPECT_EQ(st.step, sb.state.at(n).step) << "parameter " << n;
    for (const char* key : {"exp_avg", "exp_avg_sq"})
      EXPECT_TRUE(
          bp_test::all_close(static_cast<int32_t>(dt), st.buffers.at(key).to_vector<double>(),
                             sb.state.at(n).buffers.at(key).to_vector<double>(), {.rtol = rtol}))
          << key << " of parameter " << n << " after step " << step;
  }
}

// 20 steps of both optimisers on the same gradients; parameter 2 has no gradient for the first
// 5 steps (it then steps with another count than the others: a second launch).
template <class Opt, class Options>
void run_twenty_steps(bp::Device& d, bp::DType dt, Options o) {
  std::vector<std::vector<double>> values;
  for (const bp::Shape& s : kShapes) values.push_back(nntest::random_values(count(s)));
  std::vector<Tensor> pf = params(values, d, dt), pu = params(values, d, dt);
  Options of = o, ou = o;
  of.fused = true;
  ou.fused = false;
  // Two groups: the last parameter with its own learning rate and no weight decay.
  Opt fused({ParamGroup{{pf.begin(), pf.end() - 1}, {}},
             ParamGroup{{pf.back()}, {{"lr", 0.03}, {"weight_decay", 0.0}}}},
            of);
  Opt unfused({ParamGroup{{pu.begin(), pu.end() - 1}, {}},
               ParamGroup{{pu.back()}, {{"lr", 0.03}, {"weight_decay", 0.0}}}},
              ou);
  for (int s = 1; s <= 20; ++s) {
    for (size_t k = 0; k < kShapes.size(); ++k) {
      if (k == 2 && s <= 5) continue;
      const auto g = nntest::random_values(count(kShapes[k]), -1.0, 1.0);
      pf[k].set_grad(nntest::make(g, kShapes[k], d, dt));
      pu[k].set_grad(nntest::make(g, kShapes[k], d, dt));
    }
    fused.step();
    unfused.step();
    expect_state_close(fused, unfused, dt, s);
    if (s == 10)
      fused.param_groups()[0].set_lr(o.lr / 2), unfused.param_groups()[0].set_lr(o.lr / 2);
  }
  EXPECT_EQ(fused.state_dict().state.at(2).step, 15);
  EXPECT_EQ(fused.state_dict().state.at(0).step, 20);
}

TEST_P(FusedAdamTest, AdamWEqualsThePerOpUpdateOverTwentySteps) {
  for (bp::DType dt : {bp::DType::f32, bp::DType::f64}) {
    if (dt == bp::DType::f64 && !dev().properties().supports_f64) continue;
    SCOPED_TRACE(bp::dtype_name(dt));
    run_twenty_steps<AdamW>(dev(), dt, AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
  }
}

TEST_P(FusedAdamTest, AdamWithL2DecayEqualsThePerOpUpdateOverTwentySteps) {
  run_twenty_steps<Adam>(
      dev(), bp::DType::f32,
      AdamOptions{.lr = 5e-3, .beta1 = 0.8, .beta2 = 0.99, .weight_decay = 0.05});
}

TEST_P(FusedAdamTest, ResumesFromALoadedState) {
  std::vector<double> v = nntest::random_values(40);
  Tensor a = nntest::make(v, {40}, dev()).requires_grad_(true);
  Tensor b = nntest::make(v, {40}, dev()).requires_grad_(true);
  AdamW fused({a}, AdamWOptions{.lr = 1e-2, .fused = true});
  AdamW unfused({b}, AdamWOptions{.lr = 1e-2});
  OptimizerStateDict sd;
  sd.optimizer = "AdamW";
  sd.param_groups = unfused.state_dict().param_groups;
  sd.params = {{0}};
  sd.state[0].step = 7;
  sd.state[0].buffers["exp_avg"] = nntest::make(nntest::random_values(40), {40}, dev());
  sd.state[0].buffers["exp_avg_sq"] =
      nntest::make(nntest::random_values(40, 0.0, 1.0), {40}, dev());
  fused.load_state_dict(sd);
  unfused.load_state_dict(sd);
  const auto g = nntest::random_values(40);
  a.set_grad(nntest::make(g, {40}, dev()));
  b.set_grad(nntest::make(g, {40}, dev()));
  fused.step();
  unfused.step();
  expect_state_close(fused, unfused, bp::DType::f32, 8);
  EXPECT_EQ(fused.state_dict().state.at(0).step, 8);
}

// The fused step is one adamw launch for a group's parameters of one dtype (the plugins built
// here all have the op), with none of the per-op update's elementwise ops.
TEST_P(FusedAdamTest, AStepIsOneLaunchPerGroup) {
  std::vector<std::vector<double>> values;
  for (const bp::Shape& s : kShapes) values.push_back(nntest::random_values(count(s)));
  std::vector<Tensor> ps = params(values, dev(), bp::DType::f32);
  AdamW opt(ps, AdamWOptions{.lr = 1e-2, .fused = true});
  for (size_t k = 0; k < ps.size(); ++k)
    ps[k].set_grad(nntest::make(nntest::random_values(count(kShapes[k])), kShapes[k], dev()));
  opt.step();  // the first step creates the state (zeros_like: fill launches)
  bp::profiler::start();
  opt.step();
  dev().synchronize();
  bp::profiler::stop();
  int64_t adamw = 0, others = 0;
  for (const bp::profiler::OpSummary& r : bp::profiler::key_averages())
    (r.name == "adamw" ? adamw : others) += r.calls;
  EXPECT_EQ(adamw, 1);
  EXPECT_EQ(others, 0) << bp::profiler::table();
}

TEST_P(FusedAdamTest, ACaptureIsRefusedBeforeAnythingChanges) {
  Tensor a = nntest::make(nntest::random_values(9), {9}, dev()).requires_grad_(true);
  AdamW opt({a}, AdamWOptions{.fused = true});
  a.set_grad(nntest::make(nntest::random_values(9), {9}, dev()));
  const std::vector<double> before = a.to_vector<double>();
  bp::Graph g;
  g.begin_capture(dev());
  const std::string msg = bp_test::expect_throw<bp::CaptureError>([&] { opt.step(); });
  g.abort_capture();
  EXPECT_NE(msg.find("AdamW.step cannot be captured"), std::string::npos) << msg;
  EXPECT_EQ(a.to_vector<double>(), before);
  EXPECT_TRUE(opt.state_dict().state.empty());
}

INSTANTIATE_TEST_SUITE_P(Devices, FusedAdamTest, ::testing::ValuesIn(nntest::device_strings()),
                         nntest::param_name);

}  // namespace

// Graphs (graph.hpp) on every device, in both modes (the backend's native graphs where it has
// them, and the recorded list): capture, replay, the private pool, inputs updated in place,
// constants, a captured training step against the eager one, and every refused op, each
// refusal leaving the capture open and the stream usable.
#include "device_params.hpp"

#include <backplane/graph.hpp>
#include <backplane/nn.hpp>
#include <backplane/train.hpp>

#include <cstring>

namespace {

struct GraphParam {
  std::string device;
  bp::GraphMode mode;
};

std::vector<GraphParam> graph_params() {
  std::vector<GraphParam> out;
  for (const std::string& d : bptest::device_strings()) {
    out.push_back({d, bp::GraphMode::automatic});
    out.push_back({d, bp::GraphMode::recorded});
  }
  return out;
}

void PrintTo(const GraphParam& p, std::ostream* os) {
  *os << p.device << (p.mode == bp::GraphMode::recorded ? " recorded" : " automatic");
}

std::string graph_param_name(const ::testing::TestParamInfo<GraphParam>& info) {
  std::string s = info.param.device;
  for (char& c : s)
    if (c == ':') c = '_';
  return s + (info.param.mode == bp::GraphMode::recorded ? "_recorded" : "_automatic");
}

class GraphTest : public ::testing::TestWithParam<GraphParam> {
 protected:
  bp::Device& dev() { return bp::device(GetParam().device); }
  bp::GraphMode mode() { return GetParam().mode; }
  bp::Tensor make(const std::vector<double>& v, const bp::Shape& shape) {
    std::vector<float> f(v.begin(), v.end());
    return bp::from_vector(f, shape, dev());
  }
  std::vector<double> values(const bp::Tensor& t) { return t.to_vector<double>(); }
  // The backend makes native graphs in automatic mode when it has the slots (cuda).
  bool expect_native() { return mode() == bp::GraphMode::automatic && dev().type() == "cuda"; }
  template <typename F>
  void expect_refused(bp::Graph& g, F&& f, const std::string& fragment) {
    try {
      f();
      ADD_FAILURE() << "expected CaptureError containing '" << fragment << "' on " << dev().str();
    } catch (const bp::CaptureError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dev().str()), std::string::npos) << e.what();
    }
    EXPECT_TRUE(g.capturing()) << "a refused op must leave the capture open";
    EXPECT_TRUE(bp::is_capturing(dev()));
  }
};

TEST_P(GraphTest, ReplayComputesFromTheCurrentInputs) {
  const int64_t n = 1000;
  auto xv = bptest::random_values(n), bv = bptest::random_values(n);
  bp::Tensor x = make(xv, {n}), b = make(bv, {n});
  bp::Tensor y;
  bp::Graph g = bp::capture(
      dev(), [&] { y = ((x + b) * 2.0).relu() - b.exp(); }, mode());
  EXPECT_FALSE(g.empty());
  EXPECT_FALSE(g.capturing());
  EXPECT_EQ(g.native(), expect_native());
  EXPECT_EQ(&g.device(), &dev());
  EXPECT_EQ(g.num_ops(), 5u);  // add, mul, relu, exp, sub
  EXPECT_GT(g.pool_bytes(), 0u);
  auto ref = [&](const std::vector<double>& xs) {
    std::vector<double> r(n);
    for (int64_t i = 0; i < n; ++i) {
      double xf = float(xs[i]), bf = float(bv[i]);
      r[i] = std::max(0.0, (xf + bf) * 2.0) - std::exp(bf);
    }
    return r;
  };
  for (int round = 0; round < 3; ++round) {
    g.replay();
    EXPECT_TRUE(bptest::close(bp::DType::f32, values(y), ref(xv))) << "round " << round;
    // New input values, written in place into the captured tensor.
    xv = bptest::random_values(n);
    x.copy_(make(xv, {n}));
  }
}

TEST_P(GraphTest, NothingRunsDuringTheCaptureAndEachReplayRunsOnce) {
  const int64_t n = 37;
  auto av = bptest::random_values(n), dv = bptest::random_values(n);
  bp::Tensor acc = make(av, {n}), d = make(dv, {n});
  bp::Graph g = bp::capture(
      dev(), [&] { acc.add_(d, 0.5); }, mode());
  EXPECT_TRUE(bptest::close(bp::DType::f32, values(acc), bptest::rounded(av, bp::DType::f32)))
      << "the captured add_ ran during the capture";
  const int replays = 7;
  for (int k = 0; k < replays; ++k) g.replay();
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) {
    float a = float(av[i]);
    for (int k = 0; k < replays; ++k) a += 0.5f * float(dv[i]);
    ref[i] = a;
  }
  EXPECT_TRUE(bptest::close(bp::DType::f32, values(acc), ref, {.scale = 4}));
}

TEST_P(GraphTest, PoolReusesFreedBlocksAndKeepsAddresses) {
  const int64_t n = 4096;
  auto xv = bptest::random_values(n);
  bp::Tensor x = make(xv, {n});
  bp::Tensor out;
  const bp::Buffer* out_storage = nullptr;
  bp::Graph g = bp::capture(
      dev(),
      [&] {
        bp::Tensor t = x;
        for (int k = 0; k < 20; ++k) t = t + 1.0;  // each intermediate dies at once
        out = t;
        out_storage = out.storage().get();
      },
      mode());
  // Twenty intermediates of 16 KiB each, but at most two alive at a time.
  EXPECT_LE(g.pool_bytes(), 3u * n * 4) << "freed blocks were not reused within the capture";
  const uint64_t pool = g.pool_bytes();
  for (int round = 0; round < 2; ++round) {
    g.replay();
    std::vector<double> ref(n);
    for (int64_t i = 0; i < n; ++i) {
      float v = float(xv[i]);
      for (int k = 0; k < 20; ++k) v += 1.0f;
      ref[i] = v;
    }
    EXPECT_TRUE(bptest::close(bp::DType::f32, values(out), ref));
    EXPECT_EQ(out.storage().get(), out_storage);
    EXPECT_EQ(g.pool_bytes(), pool);
  }
  // Tensors created after the capture come from the ordinary allocator again.
  bp::Tensor eager = x + 1.0;
  EXPECT_NE(eager.storage().get(), out_storage);
}

TEST_P(GraphTest, OutputsOutliveTheGraphAndInputsAreKeptAlive) {
  const int64_t n = 300;
  auto xv = bptest::random_values(n);
  bp::Tensor y;
  bp::Graph g;
  {
    bp::Tensor x = make(xv, {n});  // dropped after the capture: the graph keeps its buffer
    g = bp::capture(
        dev(), [&] { y = x * 3.0; }, mode());
  }
  g.replay();
  g.replay();
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = float(xv[i]) * 3.0;
  EXPECT_TRUE(bptest::close(bp::DType::f32, values(y), ref));
  g = bp::Graph();  // the graph goes; y's block stays valid while y lives
  EXPECT_TRUE(bptest::close(bp::DType::f32, values(y), ref));
  bp::Tensor z = y + 1.0;
  for (auto& r : ref) r += 1.0;
  EXPECT_TRUE(bptest::close(bp::DType::f32, values(z), ref));
}

// Note [Buffers a graph keeps]: the graph holds the memory, not the Buffer object, so memory
// someone else owns (bp::from_blob) goes back to its owner only when the last graph that
// references it goes, and exactly once, whichever of the tensor and the graphs goes first.
namespace {
void count_call(void* ctx) {
  ++*static_cast<int*>(ctx);
}
}  // namespace

TEST_P(GraphTest, ImportedMemoryReturnsToItsOwnerWhenTheLastGraphGoes) {
  bp::Device& d = dev();
  const int64_t n = 200;
  auto xv = bptest::random_values(n);
  bp::Tensor owner = make(xv, {n});  // the memory the import wraps (someone else's)
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = float(xv[i]) * 2.0 + 1.0;
  for (int order = 0; order < 3; ++order) {  // which of the three goes last
    int released = 0;
    bp::Tensor x;
    try {
      x = bp::from_blob(d, owner.data_ptr(), {n}, {}, bp::DType::f32, &count_call, &released);
    } catch (const bp::UnsupportedError& e) {
      GTEST_SKIP() << d.str() << " cannot import memory: " << e.what();
    }
    bp::Tensor y1, y2;
    auto g1 = std::make_unique<bp::Graph>(bp::capture(
        d, [&] { y1 = x * 2.0 + 1.0; }, mode()));
    auto g2 = std::make_unique<bp::Graph>(bp::capture(
        d, [&] { y2 = x * 2.0 + 1.0; }, mode()));
    if (order == 0) x = bp::Tensor();  // the tensor first: both graphs still replay from it
    g1->replay();
    EXPECT_TRUE(bptest::close(bp::DType::f32, values(y1), ref)) << "order " << order;
    if (order == 1) x = bp::Tensor();
    g1.reset();
    d.synchronize();
    EXPECT_EQ(released, 0) << "order " << order << ": released while a graph or tensor held it";
    g2->replay();
    EXPECT_TRUE(bptest::close(bp::DType::f32, values(y2), ref)) << "order " << order;
    g2.reset();
    d.synchronize();
    EXPECT_EQ(released, order == 2 ? 0 : 1) << "order " << order;
    x = bp::Tensor();  // order 2: the tensor last, after both graphs
    d.synchronize();
    EXPECT_EQ(released, 1) << "order " << order << ": the owner's release ran " << released
                           << " times";
  }
}

TEST_P(GraphTest, AnInputDroppedDuringTheGraphsLifeIsFreedWithTheGraph) {
  bp::Device& d = dev();
  d.synchronize();
  const bp::MemoryStats before = d.memory_stats();
  bp::Tensor y;
  {
    bp::Tensor x = make(bptest::random_values(4096), {4096});
    bp::Graph g = bp::capture(
        d, [&] { y = x.exp(); }, mode());
    x = bp::Tensor();
    d.synchronize();
    // x's block is still allocated: the graph holds it.
    EXPECT_GE(d.memory_stats().allocated, before.allocated + 4096 * 4 + g.pool_bytes());
    g.replay();
    (void)y.to_vector<float>();
  }
  y = bp::Tensor();
  d.synchronize();
  const bp::MemoryStats after = d.memory_stats();
  EXPECT_EQ(after.allocated, before.allocated) << "the dropped input was never freed";
  EXPECT_EQ(after.num_allocs, before.num_allocs);
}

TEST_P(GraphTest, MemoryReturnsToItsBaselineWhenTheGraphAndItsTensorsGo) {
  bp::Device& d = dev();
  bp::Tensor x = make(bptest::random_values(2048), {2048});
  d.synchronize();
  const uint64_t before = d.memory_stats().allocated;
  {
    bp::Tensor y;
    bp::Graph g = bp::capture(
        d, [&] { y = (x * 2.0 + 1.0).exp().sum(); }, mode());
    EXPECT_GE(d.memory_stats().allocated, before + g.pool_bytes());
    g.replay();
    (void)y.item<float>();
  }
  d.synchronize();
  EXPECT_EQ(d.memory_stats().allocated, before) << "the graph's pool was not freed";
}

TEST_P(GraphTest, OtherDevicesRunEagerlyDuringACapture) {
  bp::Device* other = nullptr;
  for (bp::Device* o : bp::devices())
    if (o != &dev()) other = o;
  if (!other) GTEST_SKIP() << "one device only";
  auto v = bptest::random_values(64);
  bp::Tensor x = make(v, {64});
  std::vector<float> vf(v.begin(), v.end());
  bp::Tensor on_other = bp::from_vector(vf, {64}, *other);
  bp::Tensor y;
  bp::Graph g;
  g.begin_capture(dev(), mode());
  y = x + 1.0;
  EXPECT_FALSE(bp::is_capturing(*other));
  // Work on another device runs now and reads back, while dev() is still capturing.
  std::vector<double> twice(64);
  for (int i = 0; i < 64; ++i) twice[i] = vf[i] * 2.0;
  EXPECT_TRUE(bptest::close(bp::DType::f32, (on_other * 2.0).to_vector<double>(), twice));
  g.end_capture();
  g.replay();
  std::vector<double> plus(64);
  for (int i = 0; i < 64; ++i) plus[i] = vf[i] + 1.0;
  EXPECT_TRUE(bptest::close(bp::DType::f32, values(y), plus));
}

TEST_P(GraphTest, HostDataBecomesAConstantOfTheGraph) {
  auto xv = bptest::random_values(4);
  bp::Tensor x = make(xv, {4});
  bp::Tensor y;
  bp::Graph g = bp::capture(
      dev(),
      [&] {
        y = x * bp::tensor({1.5f, -2.0f, 0.25f, 4.0f}, dev());
      },
      mode());
  g.replay();
  const double c[4] = {1.5, -2.0, 0.25, 4.0};
  std::vector<double> ref(4);
  for (int i = 0; i < 4; ++i) ref[i] = float(xv[i]) * c[i];
  EXPECT_TRUE(bptest::close(bp::DType::f32, values(y), ref));
}

TEST_P(GraphTest, PinnedHostMemoryIsReadAgainOnEveryReplay) {
  const int64_t n = 64;
  bp::Device& d = dev();
  float* pinned = static_cast<float*>(d.host_alloc(n * sizeof(float)));
  bp::Tensor x = bp::empty({n}, d);
  bp::Tensor y;
  try {
    bp::Graph g = bp::capture(
        d,
        [&] {
          d.copy_from_host(d.default_stream(), *x.storage(), 0, pinned, n * sizeof(float));
          y = x * 2.0;
        },
        mode());
    EXPECT_EQ(g.num_ops(), 2u);
    for (int round = 0; round < 3; ++round) {
      auto v = bptest::random_values(n);
      for (int64_t i = 0; i < n; ++i) pinned[i] = float(v[i]);
      g.replay();
      std::vector<double> ref(n);
      for (int64_t i = 0; i < n; ++i) ref[i] = double(pinned[i]) * 2.0;
      EXPECT_TRUE(bptest::close(bp::DType::f32, values(y), ref)) << "round " << round;
    }
  } catch (...) {
    d.host_free(pinned);
    throw;
  }
  d.host_free(pinned);
}

TEST_P(GraphTest, EveryUncapturableOpIsRefusedNamingIt) {
  const int64_t n = 16;
  auto xv = bptest::random_values(n);
  bp::Tensor x = make(xv, {n});
  bp::Tensor y;
  bp::Device& d = dev();
  std::vector<float> pageable(n, 1.0f);
  auto event = d.create_event();
  bp::Graph other = bp::capture(
      d, [&] { (void)(x + 1.0); }, mode());
  bp::Graph g;
  g.begin_capture(d, mode());
  y = x * 2.0;
  expect_refused(
      g, [&] { (void)y.to_vector<float>(); }, "to_vector()");
  expect_refused(
      g, [&] { (void)y.sum().item<float>(); }, "to_vector()");
  expect_refused(
      g, [&] { d.synchronize(); }, "synchronize");
  expect_refused(
      g, [&] { d.default_stream().synchronize(); }, "synchronize");
  expect_refused(
      g, [&] { bp::synchronize(); }, "synchronize");
  expect_refused(
      g, [&] { (void)d.allocator().allocate(256); }, "outside the graph's pool");
  expect_refused(
      g,
      [&] {
        d.copy_from_host(d.default_stream(), *x.storage(), 0, pageable.data(), n * sizeof(float));
      },
      "pageable");
  expect_refused(
      g,
      [&] {
        d.copy_to_host(d.default_stream(), pageable.data(), *x.storage(), 0, n * sizeof(float));
      },
      "pageable");
  expect_refused(
      g, [&] { (void)bp::randn({n}, d); }, "randn");
  expect_refused(
      g, [&] { (void)bp::rand({n}, d); }, "rand");
  expect_refused(
      g, [&] { event->record(d.default_stream()); }, "Event::record");
  expect_refused(
      g, [&] { d.default_stream().wait(*event); }, "Stream::wait");
  expect_refused(
      g, [&] { other.replay(); }, "replaying another graph");
  if (&d != &bp::device("cpu:0"))
    expect_refused(
        g, [&] { (void)x.to(bp::device("cpu:0")); }, "between devices");
  // A second capture on the same device (a nested one) is refused the same way.
  bp::Graph nested;
  try {
    nested.begin_capture(d, mode());
    ADD_FAILURE() << "a nested begin_capture on " << d.str() << " was accepted";
  } catch (const bp::CaptureError& e) {
    EXPECT_NE(std::string(e.what()).find("while another capture is open on this device (begun "
                                         "by this thread"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(nested.empty());
  EXPECT_TRUE(bp::is_capturing(d));
  // The capture is still good after every refusal.
  y = y + 1.0;
  g.end_capture();
  EXPECT_FALSE(bp::is_capturing(d));
  g.replay();
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = float(xv[i]) * 2.0 + 1.0;
  EXPECT_TRUE(bptest::close(bp::DType::f32, values(y), ref));
}

TEST_P(GraphTest, AThrowingCaptureLeavesTheStreamUsable) {
  const int64_t n = 10;
  auto xv = bptest::random_values(n);
  bp::Tensor x = make(xv, {n});
  bp::Tensor y;
  EXPECT_THROW(bp::capture(
                   dev(),
                   [&] {
                     y = x + 1.0;
                     (void)y.sum().item<float>();  // refused: the exception leaves capture()
                   },
                   mode()),
               bp::CaptureError);
  EXPECT_FALSE(bp::is_capturing(dev()));
  // Eager work runs and reads back as usual.
  bp::Tensor z = x * 4.0;
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = float(xv[i]) * 4.0;
  EXPECT_TRUE(bptest::close(bp::DType::f32, values(z), ref));
  dev().synchronize();
  // And a new capture works.
  bp::Graph g = bp::capture(
      dev(), [&] { y = x - 1.0; }, mode());
  g.replay();
  for (int64_t i = 0; i < n; ++i) ref[i] = float(xv[i]) - 1.0;
  EXPECT_TRUE(bptest::close(bp::DType::f32, values(y), ref));
}

TEST_P(GraphTest, MisuseOfTheGraphObjectIsAnError) {
  bp::Graph g;
  EXPECT_TRUE(g.empty());
  EXPECT_THROW(g.replay(), bp::Error);
  EXPECT_THROW(g.end_capture(), bp::Error);
  EXPECT_THROW((void)g.device(), bp::Error);
  bp::Tensor x = make(bptest::random_values(3), {3});
  g.begin_capture(dev(), mode());
  (void)(x + 1.0);
  EXPECT_THROW(g.replay(), bp::Error);  // still capturing
  EXPECT_THROW(g.begin_capture(dev(), mode()), bp::Error);
  g.end_capture();
  EXPECT_THROW(g.begin_capture(dev(), mode()), bp::Error);  // one capture per graph
  g.abort_capture();                                        // nothing open: no effect
  g.replay();
  dev().synchronize();
}

// Linear(8,16)-ReLU-Linear(16,4), SGD: the captured step replayed on fresh batches gives the
// losses and parameters of the same steps run eagerly.
TEST_P(GraphTest, ATrainingStepReplaysLikeTheEagerStep) {
  bp::Device& d = dev();
  auto make_model = [&] {
    auto m = std::make_shared<bp::nn::Sequential>();
    m->add(std::make_shared<bp::nn::Linear>(8, 16));
    m->add(std::make_shared<bp::nn::ReLU>());
    m->add(std::make_shared<bp::nn::Linear>(16, 4));
    return m;
  };
  auto eager = make_model();
  auto captured = make_model();
  eager->to(d);
  captured->to(d);
  auto pe = eager->parameters(), pc = captured->parameters();
  ASSERT_EQ(pe.size(), pc.size());
  for (size_t k = 0; k < pe.size(); ++k) {
    bp::NoGradGuard ng;
    pc[k].copy_(pe[k]);
  }
  bp::optim::SGD opt_e(pe, {.lr = 0.05});
  bp::optim::SGD opt_c(pc, {.lr = 0.05});
  const int64_t batch = 32;
  auto batch_x = [&] { return make(bptest::random_values(batch * 8), {batch, 8}); };
  auto batch_y = [&] {
    std::vector<int64_t> l(batch);
    auto r = bptest::random_values(batch, 0.0, 4.0);
    for (int64_t i = 0; i < batch; ++i) l[i] = std::min<int64_t>(3, int64_t(r[i]));
    return bp::from_vector(l, {batch}, d);
  };
  bp::Tensor x = batch_x(), labels = batch_y();  // the graph's static inputs
  bp::Tensor loss_c;
  bp::Graph g = bp::capture(
      d,
      [&] {
        opt_c.zero_grad();
        loss_c = bp::nn::cross_entropy(captured->forward(x), labels);
        loss_c.backward();
        opt_c.step();
      },
      mode());
  for (int step = 0; step < 4; ++step) {
    bp::Tensor bx = batch_x(), by = batch_y();
    opt_e.zero_grad();
    bp::Tensor loss_e = bp::nn::cross_entropy(eager->forward(bx), by);
    loss_e.backward();
    opt_e.step();
    x.copy_(bx);
    labels.copy_(by);
    g.replay();
    const float le = loss_e.item<float>(), lc = loss_c.item<float>();
    EXPECT_NEAR(lc, le, 1e-6 * std::max(1.0f, std::fabs(le))) << "step " << step;
  }
  for (size_t k = 0; k < pe.size(); ++k)
    EXPECT_TRUE(bptest::close(bp::DType::f32, values(pc[k]), values(pe[k]), {.scale = 4}))
        << "parameter " << k;
}

TEST_P(GraphTest, OptimisersWithHostStateAreRefused) {
  bp::Device& d = dev();
  bp::Tensor w = make(bptest::random_values(6), {6});
  w.requires_grad_(true);
  bp::optim::SGD momentum({w}, {.lr = 0.1, .momentum = 0.9});
  bp::optim::Adam adam({w}, {.lr = 0.1});
  bp::Graph g;
  g.begin_capture(d, mode());
  bp::Tensor loss = (w * w).sum();
  loss.backward();
  expect_refused(
      g, [&] { momentum.step(); }, "SGD.step with momentum");
  expect_refused(
      g, [&] { adam.step(); }, "Adam.step");
  g.abort_capture();
  EXPECT_FALSE(bp::is_capturing(d));
}

INSTANTIATE_TEST_SUITE_P(AllDevices, GraphTest, ::testing::ValuesIn(graph_params()),
                         graph_param_name);

}  // namespace

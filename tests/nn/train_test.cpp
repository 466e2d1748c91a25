// Training on every device: losses against a host reference, optimiser math against
// hand-computed references for two steps, gradient clipping, the DataLoader, and end-to-end
// training that must bring the loss below a bound.
#include "nn_test_support.hpp"

#include <backplane/train.hpp>

#include <cstdio>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

namespace {

using bp::Shape;
using bp::Tensor;
using namespace bp::nn;

class TrainTest : public ::testing::TestWithParam<std::string> {
 protected:
  bp::Device& dev() { return bp::device(GetParam()); }
  Tensor f32(const std::vector<double>& v, const Shape& s) { return nntest::make(v, s, dev()); }
};

// ---- losses ---------------------------------------------------------------------------------

TEST_P(TrainTest, MseLossMatchesHostReference) {
  auto p = nntest::as_f32(nntest::random_values(30)), t = nntest::as_f32(nntest::random_values(30));
  double ref = 0;
  for (size_t i = 0; i < p.size(); ++i) ref += (p[i] - t[i]) * (p[i] - t[i]) / 30.0;
  Tensor loss = mse_loss(f32(p, {10, 3}), f32(t, {10, 3}));
  EXPECT_EQ(loss.rank(), 0);
  EXPECT_EQ(&loss.device(), &dev());
  EXPECT_TRUE(nntest::near(loss.item<double>(), ref, 1e-5 * ref));
  EXPECT_THROW(mse_loss(f32(p, {30}), f32(t, {30, 1})), bp::ShapeError);
}

TEST_P(TrainTest, CrossEntropyIsStableAndMatchesHostReference) {
  const int64_t n = 6, c = 5;
  auto logits = nntest::as_f32(nntest::random_values(n * c, -3, 3));
  logits[0] = 80.0f;  // exp(80) overflows f32 without the max subtraction
  logits[7] = -90.0f;
  std::vector<int64_t> labels = {0, 4, 2, 2, 1, 3};
  double ref = 0;
  for (int64_t b = 0; b < n; ++b) {
    double m = -1e300, s = 0;
    for (int64_t k = 0; k < c; ++k) m = std::max(m, logits[b * c + k]);
    for (int64_t k = 0; k < c; ++k) s += std::exp(logits[b * c + k] - m);
    ref += -(logits[b * c + labels[b]] - m - std::log(s)) / n;
  }
  Tensor x = f32(logits, {n, c});
  x.requires_grad_(true);
  Tensor loss = cross_entropy(x, bp::from_vector(labels, {n}, dev()));
  EXPECT_EQ(&loss.device(), &dev());
  double got = loss.item<double>();
  ASSERT_TRUE(std::isfinite(got));
  EXPECT_TRUE(nntest::near(got, ref, 1e-5 * std::fabs(ref)));
  // d loss / d logits = (softmax - onehot) / n.
  loss.backward();
  auto g = x.grad().to_vector<double>();
  for (int64_t b = 0; b < n; ++b) {
    double m = -1e300, s = 0;
    for (int64_t k = 0; k < c; ++k) m = std::max(m, logits[b * c + k]);
    for (int64_t k = 0; k < c; ++k) s += std::exp(logits[b * c + k] - m);
    for (int64_t k = 0; k < c; ++k) {
      double want = (std::exp(logits[b * c + k] - m) / s - (k == labels[b] ? 1 : 0)) / n;
      EXPECT_TRUE(nntest::near(g[b * c + k], want, 1e-6)) << b << "," << k;
    }
  }
  // i32 labels work too; wrong shapes and dtypes are errors.
  Tensor l32 = bp::from_vector(std::vector<int32_t>{0, 4, 2, 2, 1, 3}, {n}, dev());
  EXPECT_TRUE(nntest::near(cross_entropy(x, l32).item<double>(), ref, 1e-5 * std::fabs(ref)));
  EXPECT_THROW(cross_entropy(x, bp::from_vector(labels, {n}, dev()).to(bp::DType::f32)),
               bp::DTypeError);
  EXPECT_THROW(cross_entropy(x, bp::from_vector(std::vector<int64_t>{1, 2}, {2}, dev())),
               bp::ShapeError);
  EXPECT_THROW(cross_entropy(x.reshape({-1}), bp::from_vector(labels, {n}, dev())), bp::ShapeError);
}

// ---- optimisers against hand-computed references ---------------------------------------------

struct OptCase {
  std::vector<double> p0, g1, g2;
};

OptCase opt_case() {
  return {nntest::as_f32(nntest::random_values(5)), nntest::as_f32(nntest::random_values(5)),
          nntest::as_f32(nntest::random_values(5))};
}

// Runs two steps with the given gradients and returns the parameter after each.
std::vector<std::vector<double>> two_steps(bp::optim::Optimizer& opt, Tensor& p, const OptCase& c,
                                           bp::Device& d) {
  std::vector<std::vector<double>> out;
  for (const auto* g : {&c.g1, &c.g2}) {
    p.set_grad(nntest::make(*g, {5}, d));
    opt.step();
    out.push_back(p.to_vector<double>());
  }
  return out;
}

TEST_P(TrainTest, SgdMatchesHandComputedSteps) {
  struct Variant {
    bp::optim::SGDOptions o;
  } variants[] = {{{.lr = 0.1}},
                  {{.lr = 0.1, .momentum = 0.9}},
                  {{.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01}},
                  {{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true}}};
  for (const auto& v : variants) {
    const auto& o = v.o;
    OptCase c = opt_case();
    Tensor p = nntest::make(c.p0, {5}, dev());
    p.requires_grad_(true);
    bp::optim::SGD opt({p}, o);
    auto got = two_steps(opt, p, c, dev());
    // Reference, written out step by step.
    std::vector<double> x = c.p0, buf(5);
    for (int step = 0; step < 2; ++step) {
      const auto& g = step == 0 ? c.g1 : c.g2;
      for (size_t i = 0; i < 5; ++i) {
        double d = g[i] + o.weight_decay * x[i];
        if (o.momentum != 0) {
          buf[i] = step == 0 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
          d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
        }
        x[i] -= o.lr * d;
      }
      EXPECT_TRUE(nntest::close(got[step], x, 1e-6))
          << "step " << step + 1 << " momentum " << o.momentum << " nesterov " << o.nesterov;
    }
    EXPECT_EQ(&p.device(), &dev());
    EXPECT_TRUE(p.requires_grad());
  }
}

TEST_P(TrainTest, AdamMatchesHandComputedSteps) {
  for (double wd : {0.0, 0.05}) {
    bp::optim::AdamOptions o{
        .lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = wd};
    OptCase c = opt_case();
    Tensor p = nntest::make(c.p0, {5}, dev());
    p.requires_grad_(true);
    bp::optim::Adam opt({p}, o);
    auto got = two_steps(opt, p, c, dev());
    std::vector<double> x = c.p0, m(5), v(5);
    for (int t = 1; t <= 2; ++t) {
      const auto& g0 = t == 1 ? c.g1 : c.g2;
      for (size_t i = 0; i < 5; ++i) {
        double g = g0[i] + wd * x[i];
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
        double mhat = m[i] / (1 - std::pow(o.beta1, t)), vhat = v[i] / (1 - std::pow(o.beta2, t));
        x[i] -= o.lr * mhat / (std::sqrt(vhat) + o.eps);
      }
      EXPECT_TRUE(nntest::close(got[t - 1], x, 1e-6)) << "step " << t << " wd " << wd;
    }
  }
}

TEST_P(TrainTest, OptimisersSkipParametersWithoutGradientAndZeroGrad) {
  Tensor a = nntest::make({1, 2}, {2}, dev()), b = nntest::make({3, 4}, {2}, dev());
  a.requires_grad_(true);
  b.requires_grad_(true);
  bp::optim::SGD opt({a, b}, {.lr = 1.0});
  a.set_grad(nntest::make({1, 1}, {2}, dev()));
  opt.step();
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 1}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{3, 4}));
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_THROW(bp::optim::SGD({a}, {.lr = -1}), bp::Error);
  EXPECT_THROW(bp::optim::SGD({a}, {.lr = 0.1, .nesterov = true}), bp::Error);
  EXPECT_THROW(bp::optim::Adam({a}, {.beta1 = 1.0}), bp::Error);
}

TEST_P(TrainTest, ClipGradNormScalesToTheBound) {
  Tensor a = nntest::make({0, 0}, {2}, dev()), b = nntest::make({0}, {1}, dev());
  a.requires_grad_(true);
  b.requires_grad_(true);
  a.set_grad(nntest::make({3, 0}, {2}, dev()));
  b.set_grad(nntest::make({4}, {1}, dev()));  // global norm 5
  Tensor norm = clip_grad_norm_({a, b}, 1.0);
  EXPECT_EQ(&norm.device(), &dev());
  EXPECT_TRUE(nntest::near(norm.item<double>(), 5.0, 1e-6));
  EXPECT_TRUE(nntest::close(a.grad().to_vector<double>(), {0.6, 0}, 1e-5));
  EXPECT_TRUE(nntest::close(b.grad().to_vector<double>(), {0.8}, 1e-5));
  // Below the bound nothing changes.
  clip_grad_norm_({a, b}, 10.0);
  EXPECT_TRUE(nntest::close(a.grad().to_vector<double>(), {0.6, 0}, 1e-5));
}

// ---- DataLoader -----------------------------------------------------------------------------

TEST_P(TrainTest, DataLoaderBatchesEveryExampleOncePerEpoch) {
  const int64_t n = 23;
  std::vector<double> xs(n * 2), ys(n);
  for (int64_t i = 0; i < n; ++i) {
    xs[2 * i] = static_cast<double>(i);
    xs[2 * i + 1] = -static_cast<double>(i);
    ys[i] = static_cast<double>(i);
  }
  Tensor X = f32(xs, {n, 2});
  Tensor Y = bp::from_vector(std::vector<int64_t>(ys.begin(), ys.end()), {n}, dev());
  bp::DataLoader plain(X, Y, {.batch_size = 5});
  EXPECT_EQ(plain.num_batches(), 5);
  int64_t seen = 0;
  for (bp::Batch b : plain) {
    EXPECT_EQ(&b.x.device(), &dev());
    EXPECT_EQ(b.y.dtype(), bp::DType::i64);
    auto x = b.x.to_vector<double>();
    auto y = b.y.to_vector<int64_t>();
    for (size_t k = 0; k < y.size(); ++k) {
      EXPECT_EQ(y[k], seen) << "unshuffled batches keep data order";
      EXPECT_EQ(x[2 * k], seen);
      ++seen;
    }
  }
  EXPECT_EQ(seen, n);

  bp::DataLoader dropped(X, Y, {.batch_size = 5, .drop_last = true});
  EXPECT_EQ(dropped.num_batches(), 4);
  int64_t rows = 0;
  for (bp::Batch b : dropped) rows += b.x.size(0);
  EXPECT_EQ(rows, 20);

  auto epoch_order = [](bp::DataLoader& dl) {
    std::vector<int64_t> order;
    for (bp::Batch b : dl) {
      auto x = b.x.to_vector<double>();
      auto y = b.y.to_vector<int64_t>();
      for (size_t k = 0; k < y.size(); ++k) {
        EXPECT_EQ(x[2 * k], static_cast<double>(y[k])) << "inputs and targets stay paired";
        order.push_back(y[k]);
      }
    }
    return order;
  };
  bp::DataLoader s1(X, Y, {.batch_size = 4, .shuffle = true, .seed = 7});
  bp::DataLoader s2(X, Y, {.batch_size = 4, .shuffle = true, .seed = 7});
  auto e1 = epoch_order(s1), e2 = epoch_order(s1), f1 = epoch_order(s2);
  EXPECT_EQ(e1, f1) << "one seed, one order";
  EXPECT_NE(e1, e2) << "each epoch draws a new order";
  std::vector<int64_t> sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted, all);
  EXPECT_EQ(s1.first_batch().y.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));

  EXPECT_THROW(bp::DataLoader(X, f32(ys, {n}).slice(0, 0, 3)), bp::ShapeError);
  EXPECT_THROW(bp::DataLoader(X, Y, {.batch_size = 0}), bp::Error);
}

// ---- end to end -----------------------------------------------------------------------------

TEST_P(TrainTest, TrainerReducesRegressionLossBelowBound) {
  // y = x @ w + b + noise, fitted by an MLP with SGD + momentum.
  bp::manual_seed(11);
  const int64_t n = 256;
  auto xs = nntest::random_values(n * 4, -1, 1);
  std::vector<double> w = {1.5, -2.0, 0.5, 3.0}, ys(n);
  auto noise = nntest::random_values(n, -0.01, 0.01);
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0.7 + noise[i];
    for (int k = 0; k < 4; ++k) acc += xs[i * 4 + k] * w[k];
    ys[i] = acc;
  }
  bp::Device& cpu = bp::device("cpu:0");
  bp::DataLoader data(nntest::make(xs, {n, 4}, cpu), nntest::make(ys, {n, 1}, cpu),
                      {.batch_size = 32, .shuffle = true, .seed = 3});
  Sequential net;
  net.add<LazyLinear>(16);  // materialised by the Trainer's dry run on its device
  net.add<Tanh>();
  net.add<Linear>(16, 1, true, cpu);
  std::vector<int> epochs;
  bp::Trainer trainer({.max_epochs = 30,
                       .device = GetParam(),
                       .gradient_clip_val = 5.0,
                       .on_epoch = [&](int e, double) { epochs.push_back(e); }});
  EXPECT_EQ(&trainer.device(), &dev());
  auto losses = trainer.fit(net, data, mse_loss, bp::sgd({.lr = 0.05, .momentum = 0.9}));
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_EQ(epochs.size(), 30u);
  for (const Tensor& p : net.parameters()) EXPECT_EQ(&p.device(), &dev());
  EXPECT_LT(losses.back(), 0.02) << "first epoch " << losses.front();
  EXPECT_LT(losses.back(), losses.front() / 20);
}

TEST_P(TrainTest, TrainerWritesPlainProgressLinesAndAMetricsCsv) {
  const int64_t n = 64;
  auto xs = nntest::random_values(n * 3, -1, 1), ys = nntest::random_values(n, -1, 1);
  bp::Device& cpu = bp::device("cpu:0");
  bp::DataLoader data(nntest::make(xs, {n, 3}, cpu), nntest::make(ys, {n, 1}, cpu),
                      {.batch_size = 16});
  Sequential net;
  net.add<Linear>(3, 1, true, cpu);
  std::ostringstream progress;
  std::string csv_path =
      ::testing::TempDir() + "bp_metrics_" + nntest::param_name({GetParam(), 0}) + ".csv";
  bp::Trainer trainer({.max_epochs = 3,
                       .device = GetParam(),
                       .progress = bp::Progress::automatic,  // a stream that is not a TTY: lines
                       .progress_stream = &progress,
                       .progress_every = 2,
                       .metrics_csv = csv_path});
  auto losses = trainer.fit(net, data, mse_loss, bp::sgd({.lr = 0.1}));
  ASSERT_EQ(losses.size(), 3u);

  // Two lines per epoch (after batch 2 and at the end), no carriage returns or escapes.
  std::string text = progress.str();
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\033'), std::string::npos);
  // Each line is exactly what its parsed fields print back to in the documented format.
  std::istringstream in(text);
  std::string line;
  std::vector<std::pair<int, int>> seen;
  while (std::getline(in, line)) {
    int epoch = 0, batch = 0, h = 0, mi = 0, se = 0;
    double loss = 0, rate = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "epoch %d/3 batch %d/4 loss %lf samples/s %lf eta %d:%d:%d",
                          &epoch, &batch, &loss, &rate, &h, &mi, &se),
              7)
        << "line: '" << line << "'";
    char again[256];
    std::snprintf(again, sizeof again,
                  "epoch %d/3 batch %d/4 loss %.6f samples/s %.1f eta %d:%02d:%02d", epoch, batch,
                  loss, rate, h, mi, se);
    EXPECT_EQ(line, again);
    seen.emplace_back(epoch, batch);
    EXPECT_GT(rate, 0.0) << line;
    if (batch == 4) {  // the epoch's mean, as fit() returns it
      EXPECT_NEAR(loss, losses[epoch - 1], 5e-7 + 1e-6 * std::fabs(losses[epoch - 1])) << line;
    }
  }
  EXPECT_EQ(seen,
            (std::vector<std::pair<int, int>>{{1, 2}, {1, 4}, {2, 2}, {2, 4}, {3, 2}, {3, 4}}));

  // The CSV: a header and one row per epoch with the same losses.
  std::ifstream f(csv_path);
  ASSERT_TRUE(f) << csv_path;
  std::getline(f, line);
  EXPECT_EQ(line, "epoch,loss,batches,samples,seconds,samples_per_s");
  for (int e = 1; e <= 3; ++e) {
    ASSERT_TRUE(std::getline(f, line)) << "row " << e;
    int epoch = 0;
    long long batches = 0, samples = 0;
    double loss = 0, secs = 0, rate = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%d,%lf,%lld,%lld,%lf,%lf", &epoch, &loss, &batches,
                          &samples, &secs, &rate),
              6)
        << line;
    EXPECT_EQ(epoch, e);
    EXPECT_NEAR(loss, losses[e - 1], 1e-8 * std::max(1.0, std::fabs(losses[e - 1])));
    EXPECT_EQ(batches, 4);
    EXPECT_EQ(samples, n);
    EXPECT_GT(secs, 0.0);
    // seconds has 6 decimals: allow its rounding in the rate.
    EXPECT_NEAR(rate, static_cast<double>(n) / secs, 1e-3 + rate * 1e-6 / secs);
  }
  EXPECT_FALSE(std::getline(f, line)) << "extra row: " << line;
  std::remove(csv_path.c_str());

  bp::Trainer bad({.max_epochs = 1, .device = GetParam(), .metrics_csv = "/nonexistent-dir/m.csv"});
  try {
    bad.fit(net, data, mse_loss, bp::sgd({.lr = 0.1}));
    FAIL() << "no error for an unwritable metrics_csv";
  } catch (const bp::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics_csv '/nonexistent-dir/m.csv'"), std::string::npos)
        << e.what();
  }
}

TEST_P(TrainTest, TrainerReducesClassificationLossWithAdam) {
  // Three Gaussian blobs; cross-entropy with Adam.
  const int64_t n = 300;
  auto r = nntest::random_values(n * 2, -0.6, 0.6);
  std::vector<double> xs(n * 2);
  std::vector<int64_t> ys(n);
  const double centers[3][2] = {{2, 0}, {-1, 1.7}, {-1, -1.7}};
  for (int64_t i = 0; i < n; ++i) {
    ys[i] = i % 3;
    xs[2 * i] = centers[ys[i]][0] + r[2 * i];
    xs[2 * i + 1] = centers[ys[i]][1] + r[2 * i + 1];
  }
  bp::Device& cpu = bp::device("cpu:0");
  bp::DataLoader data(nntest::make(xs, {n, 2}, cpu), bp::from_vector(ys, {n}, cpu),
                      {.batch_size = 50, .shuffle = true, .seed = 1});
  bp::manual_seed(5);
  Sequential net;
  net.add<Linear>(2, 16, true, cpu);
  net.add<ReLU>();
  net.add<Linear>(16, 3, true, cpu);
  bp::Trainer trainer({.max_epochs = 20, .device = GetParam()});
  auto losses = trainer.fit(net, data, cross_entropy, bp::adam({.lr = 0.02}));
  EXPECT_LT(losses.back(), 0.05) << "first epoch " << losses.front();
  // Accuracy on the training set, on the device.
  bp::NoGradGuard no_grad;
  Tensor logits = net(nntest::make(xs, {n, 2}, dev()));
  auto l = logits.to_vector<double>();
  int correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    for (int64_t k = 1; k < 3; ++k)
      if (l[i * 3 + k] > l[i * 3 + best]) best = k;
    correct += best == ys[i];
  }
  EXPECT_GE(correct, n * 98 / 100);
}

TEST_P(TrainTest, SameSeedTrainsTheSameOnThisDeviceAndTheCpu) {
  auto run = [&](const std::string& device) {
    bp::manual_seed(99);
    bp::Device& cpu = bp::device("cpu:0");
    Tensor X = bp::uniform({64, 3}, -1, 1, cpu);
    Tensor Y = (X * 2.0).sum(1, true) - 0.5;
    bp::DataLoader data(X, Y, {.batch_size = 16, .shuffle = true, .seed = 2});
    Sequential net;
    net.add<Linear>(3, 8, true, cpu);
    net.add<ReLU>();
    net.add<Linear>(8, 1, true, cpu);
    bp::Trainer trainer({.max_epochs = 5, .device = device});
    return trainer.fit(net, data, mse_loss, bp::sgd({.lr = 0.1}));
  };
  auto here = run(GetParam()), cpu = run("cpu:0");
  ASSERT_EQ(here.size(), cpu.size());
  for (size_t e = 0; e < here.size(); ++e)
    EXPECT_TRUE(nntest::near(here[e], cpu[e], 1e-4 * (1 + cpu[e]))) << "epoch " << e;
}

TEST(Trainer, PicksTheDeviceLikeTryGpu) {
  EXPECT_EQ(&bp::Trainer({.num_gpus = 0}).device(), &bp::device("cpu:0"));
  EXPECT_EQ(&bp::Trainer({.num_gpus = 1}).device(), &bp::try_device("cuda:0"));
  EXPECT_THROW(bp::Trainer({.device = "nonsense:7"}), bp::DeviceError);
  EXPECT_THROW(bp::Trainer({.num_gpus = -1}), bp::Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, TrainTest, ::testing::ValuesIn(nntest::device_strings()),
                         nntest::param_name);

}  // namespace

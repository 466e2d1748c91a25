// docs/names.md, walkthrough items 5-10 on every device: creation, device semantics, printing,
// errors, asynchronous execution and memory accounting.
#include "device_params.hpp"

#include <algorithm>
#include <thread>

using bptest::DeviceTest;

namespace {

std::vector<double> as_double(const bp::Tensor& t) {
  return t.to_vector<double>();
}

TEST_P(DeviceTest, WalkthroughItem8Values) {
  auto x = bp::tensor({1, 2, 3}, bp::device("cpu:0"));
  auto y = x.copy_to(dev());
  auto z = x.to(dev());
  auto a = (z + 2).exp() + y;
  auto b = (z + 2).exp() * y;
  auto c = y.pow(2);
  EXPECT_EQ(&a.device(), &dev());
  EXPECT_EQ(&b.device(), &dev());
  EXPECT_EQ(&c.device(), &dev());
  std::vector<double> ea = {21.085537, 56.59815, 151.41316}, eb = {20.085537, 109.1963, 445.2395};
  // The walkthrough prints 8 significant digits.
  EXPECT_TRUE(bptest::close(bp::DType::f32, as_double(a), ea, {.rtol = 1e-6}));
  EXPECT_TRUE(bptest::close(bp::DType::f32, as_double(b), eb, {.rtol = 1e-6}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{1, 4, 9}));
  std::string printed = bp::to_string(c);
  EXPECT_EQ(printed, "[1. 4. 9.]\n<Tensor 3 f32 @" + dev().str() + ">");
}

TEST_P(DeviceTest, CopyToAlwaysCopiesToReturnsSame) {
  auto y = bp::tensor({1, 2, 3}, dev());
  auto c = y.copy_to(dev());
  EXPECT_FALSE(c.is_same(y));
  EXPECT_FALSE(c.shares_storage(y));
  EXPECT_TRUE(y.to(dev()).is_same(y));
  c.fill_(7);  // the copy is independent
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  auto h = y.cpu();
  EXPECT_EQ(h.device().str(), "cpu:0");
  EXPECT_EQ(&y.device(), &dev());  // the original stays
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

TEST_P(DeviceTest, CreationOnDevice) {
  auto o = bp::ones({2, 3}, dev());
  EXPECT_EQ(o.shape(), (bp::Shape{2, 3}));
  EXPECT_EQ(&o.device(), &dev());
  EXPECT_EQ(o.to_vector<float>(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(bp::zeros({4}, dev(), bp::DType::i32).to_vector<int32_t>(), std::vector<int32_t>(4, 0));
  EXPECT_EQ(bp::full({3}, -2.5, dev()).to_vector<float>(), std::vector<float>(3, -2.5f));
  EXPECT_EQ(bp::arange(5, dev(), bp::DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 2, 3, 4}));
  auto big = bp::full({3}, 9007199254740991.0, dev(), bp::DType::i64);  // 2^53 - 1: exact
  EXPECT_EQ(big.to_vector<int64_t>()[0], 9007199254740991LL);
  auto e = bp::empty({0, 3}, dev());
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(e.to_vector<float>().empty());
  auto b = bp::from_vector(std::vector<bool>{true, false, true}, {3}, dev());
  EXPECT_EQ(b.dtype(), bp::DType::boolean);
  EXPECT_EQ(b.to_vector<bool>(), (std::vector<bool>{true, false, true}));
}

TEST_P(DeviceTest, RandomIsIdenticalOnEveryDevice) {
  bp::Generator g1(1234), g2(1234);
  auto here = bp::rand({1001}, dev(), bp::DType::f32, &g1);
  auto cpu = bp::rand({1001}, bp::device("cpu:0"), bp::DType::f32, &g2);
  EXPECT_EQ(here.to_vector<float>(), cpu.to_vector<float>());  // bit-identical uniforms
  EXPECT_EQ(g1.offset(), 1004u);
  auto v = here.to_vector<double>();
  double mean = 0;
  for (double x : v) {
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
    mean += x / v.size();
  }
  EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F64, mean, 0.5, {.rtol = 0, .atol = 0.05}));
  bp::Generator g3(99);
  auto n = bp::randn({20000}, dev(), bp::DType::f32, &g3).to_vector<double>();
  double m = 0, s = 0;
  for (double x : n) m += x / n.size();
  for (double x : n) s += (x - m) * (x - m) / n.size();
  EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F64, m, 0.0, {.rtol = 0, .atol = 0.03}));
  EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F64, std::sqrt(s), 1.0, {.rtol = 0, .atol = 0.03}));
  // Successive draws differ; re-seeding repeats them.
  bp::manual_seed(7);
  auto r1 = bp::rand({8}, dev()).to_vector<float>();
  auto r2 = bp::rand({8}, dev()).to_vector<float>();
  bp::manual_seed(7);
  EXPECT_EQ(bp::rand({8}, dev()).to_vector<float>(), r1);
  EXPECT_NE(r1, r2);
}

TEST_P(DeviceTest, PrintingSummarisesLargeTensors) {
  auto t = bp::arange(2000, dev());
  std::string s = bp::to_string(t);
  EXPECT_EQ(s, "[0. 1. 2. ... 1997. 1998. 1999.]\n<Tensor 2000 f32 @" + dev().str() + ">");
  auto m = bp::arange(6, dev(), bp::DType::i32).reshape({2, 3});
  EXPECT_EQ(bp::to_string(m), "[[0 1 2]\n [3 4 5]]\n<Tensor 2x3 i32 @" + dev().str() + ">");
  auto scalar = bp::tensor({2.5f}, dev()).sum();
  EXPECT_EQ(bp::to_string(scalar), "2.5\n<Tensor scalar f32 @" + dev().str() + ">");
}

TEST_P(DeviceTest, MismatchedDevicesAreAnErrorNamingBoth) {
  bp::Device* other = nullptr;
  for (bp::Device* d : bp::devices())
    if (d != &dev()) other = d;
  if (!other) GTEST_SKIP() << "only one device on this machine";
  auto a = bp::ones({3}, dev());
  auto b = bp::ones({3}, *other);
  try {
    auto c = a + b;
    FAIL() << "no error";
  } catch (const bp::DeviceMismatch& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("add: expected all tensors on one device, found " + dev().str() + " and " +
                       other->str()),
              std::string::npos)
        << msg;
  }
  EXPECT_THROW(bp::matmul(a.reshape({1, 3}), b.reshape({3, 1})), bp::DeviceMismatch);
  EXPECT_THROW(bp::where(bp::gt(a, 0.0), a, b), bp::DeviceMismatch);
  // An explicit move makes it work.
  EXPECT_EQ((a + b.to(dev())).to_vector<float>(), std::vector<float>(3, 2.0f));
}

TEST_P(DeviceTest, ShapeAndDtypeErrors) {
  auto a = bp::ones({2, 3}, dev());
  try {
    auto c = a + bp::ones({4}, dev());
    FAIL();
  } catch (const bp::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("add: shapes 2x3 and 4 cannot be broadcast"),
              std::string::npos)
        << e.what();
  }
  try {
    auto c = bp::matmul(a, bp::ones({3, 2}, dev(), bp::DType::f64));
    FAIL();
  } catch (const bp::DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("matmul: dtypes differ, f32 and f64"), std::string::npos)
        << e.what();
  }
  try {
    bp::matmul(a, a);
    FAIL();
  } catch (const bp::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("matmul: inner dimensions differ, 2x3 @ 2x3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(a.item<float>(), bp::ShapeError);
  EXPECT_THROW(a.reshape({4, 2}), bp::ShapeError);
  EXPECT_THROW(a.sum(2), bp::ShapeError);
  EXPECT_THROW(a.t().view({6}), bp::ShapeError);
  EXPECT_THROW(bp::ones({2}, dev(), bp::DType::i32) + 0.5, bp::DTypeError);
  EXPECT_THROW(bp::ones({2}, dev(), bp::DType::i32).mean(), bp::DTypeError);
  EXPECT_THROW(bp::empty({0}, dev()).max(), bp::ShapeError);
}

// Note [Type promotion]: mixed dtypes compute in PyTorch's result type, against host values.
TEST_P(DeviceTest, TypePromotionFollowsPyTorch) {
  auto fv = bptest::random_values(6, -50, 50);
  std::vector<double> iv(6);
  for (size_t k = 0; k < 6; ++k) {  // |iv| >= 3, never 0 (i / l divides by them)
    const double t = std::trunc(fv[k]);
    iv[k] = t >= 0 ? t + 3 : t - 3;
  }
  auto f = make(fv, {2, 3});                     // f32
  auto i = make(iv, {2, 3}, bp::DType::i32);     // i32
  auto l = make(iv, {2, 3}, bp::DType::i64);     // i64
  auto u = make({1, 2, 3}, {3}, bp::DType::u8);  // u8
  auto rf = bptest::rounded(fv, bp::DType::f32);
  auto sum = i + f;
  EXPECT_EQ(sum.dtype(), bp::DType::f32);
  std::vector<double> ref(6);
  for (size_t k = 0; k < 6; ++k) ref[k] = iv[k] + rf[k];
  EXPECT_TRUE(bptest::close(bp::DType::f32, sum.to_vector<double>(), ref));
  EXPECT_EQ((l - i).dtype(), bp::DType::i64);
  EXPECT_EQ((l - i).to_vector<int64_t>(), std::vector<int64_t>(6, 0));
  EXPECT_EQ((u * i.slice(0, 0, 1).reshape({3})).dtype(), bp::DType::i32);
  EXPECT_EQ(bp::result_type(bp::ones({2}, dev(), bp::DType::boolean), u), bp::DType::u8);
  EXPECT_EQ(bp::promote_types(bp::DType::f16, bp::DType::bf16), bp::DType::f32);
  EXPECT_EQ(bp::promote_types(bp::DType::u8, bp::DType::i64), bp::DType::i64);
  // A 0-d operand decides only from a higher category.
  auto h = bp::ones({3}, dev(), bp::DType::f16);
  EXPECT_EQ((h + bp::full({}, 2.0, dev())).dtype(), bp::DType::f16);
  EXPECT_EQ((i + bp::full({}, 0.5, dev())).dtype(), bp::DType::f32);
  EXPECT_EQ((i + bp::full({}, 2.0, dev(), bp::DType::i64)).dtype(), bp::DType::i32);
  // True division and exp / sqrt of integers give f32.
  auto q = i / l;
  EXPECT_EQ(q.dtype(), bp::DType::f32);
  EXPECT_EQ(q.to_vector<float>(), std::vector<float>(6, 1.0f));
  auto half = i / 2.0;
  EXPECT_EQ(half.dtype(), bp::DType::f32);
  for (size_t k = 0; k < 6; ++k) ref[k] = iv[k] / 2.0;
  EXPECT_TRUE(bptest::close(bp::DType::f32, half.to_vector<double>(), ref));
  auto e = make({0, 1, 2}, {3}, bp::DType::i64).exp();
  EXPECT_EQ(e.dtype(), bp::DType::f32);
  EXPECT_TRUE(
      bptest::close(bp::DType::f32, e.to_vector<double>(), {1.0, std::exp(1.0), std::exp(2.0)}));
  EXPECT_EQ(make({4, 9}, {2}, bp::DType::i32).sqrt().to_vector<float>(),
            (std::vector<float>{2, 3}));
  // Comparisons and where promote; sums of bools count in int64.
  auto lt = bp::lt(i, f);
  std::vector<bool> lt_ref;
  for (size_t k = 0; k < 6; ++k) lt_ref.push_back(iv[k] < rf[k]);
  EXPECT_EQ(lt.to_vector<bool>(), lt_ref);
  auto count = lt.sum();
  EXPECT_EQ(count.dtype(), bp::DType::i64);
  EXPECT_EQ(count.item<int64_t>(), std::count(lt_ref.begin(), lt_ref.end(), true));
  auto w = bp::where(lt, i, f);
  EXPECT_EQ(w.dtype(), bp::DType::f32);
  for (size_t k = 0; k < 6; ++k) ref[k] = lt_ref[k] ? iv[k] : rf[k];
  EXPECT_EQ(w.to_vector<double>(), ref);
  // Gradients flow back through the cast to the floating operand's dtype.
  auto g = make(fv, {2, 3}).requires_grad_();
  (g * i).sum().backward();
  EXPECT_EQ(g.grad().dtype(), bp::DType::f32);
  for (size_t k = 0; k < 6; ++k) ref[k] = iv[k];
  EXPECT_EQ(g.grad().to_vector<double>(), ref);
}

// autograd::grad gives d(output)/d(inputs), leaves and intermediates, and leaves every grad()
// as it was; GradModeGuard(true) records inside a no-grad region.
TEST_P(DeviceTest, AutogradGradLeavesGradsAlone) {
  auto xv = bptest::random_values(5), wv = bptest::random_values(5);
  auto x = make(xv, {5}).requires_grad_();
  auto w = make(wv, {5}).requires_grad_();
  auto h = x * x;
  auto y = (h * w).sum();
  auto g = bp::autograd::grad(y, {x, w, h});
  ASSERT_EQ(g.size(), 3u);
  auto rx = bptest::rounded(xv, bp::DType::f32), rw = bptest::rounded(wv, bp::DType::f32);
  std::vector<double> gx(5), gw(5), gh(5);
  for (size_t k = 0; k < 5; ++k) {
    gx[k] = 2 * rx[k] * rw[k];
    gw[k] = rx[k] * rx[k];
    gh[k] = rw[k];
  }
  EXPECT_TRUE(bptest::close(bp::DType::f32, g[0].to_vector<double>(), gx));
  EXPECT_TRUE(bptest::close(bp::DType::f32, g[1].to_vector<double>(), gw));
  EXPECT_TRUE(bptest::close(bp::DType::f32, g[2].to_vector<double>(), gh));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  auto unused = make(xv, {5}).requires_grad_();
  EXPECT_THROW(bp::autograd::grad(y, {unused}), bp::Error);
  EXPECT_FALSE(bp::autograd::grad(y, {unused}, {}, true)[0].defined());
  bp::NoGradGuard off;
  EXPECT_FALSE((x * 2.0).requires_grad());
  {
    bp::GradModeGuard on(true);
    EXPECT_TRUE((x * 2.0).requires_grad());
  }
  EXPECT_FALSE(bp::grad_enabled());
}

TEST_P(DeviceTest, LongAsyncChainReadsFreshValues) {
  auto v = bptest::random_values(4097);
  auto t = make(v, {4097});
  std::vector<double> ref = bptest::rounded(v, bp::DType::f32);
  for (int i = 0; i < 200; ++i) {
    t = t * 1.01 + 0.5;
    t = t - 0.25;
  }
  for (int i = 0; i < 200; ++i)
    for (auto& x : ref)
      x = static_cast<float>(static_cast<float>(static_cast<float>(x * 1.01f) + 0.5f) - 0.25f);
  EXPECT_TRUE(bptest::close(bp::DType::f32, t.to_vector<double>(), ref));
}

TEST_P(DeviceTest, FreeingTensorsReturnsMemoryToBaseline) {
  dev().synchronize();
  bp::MemoryStats before = dev().memory_stats();
  {
    auto a = bp::rand({1 << 16}, dev());
    auto b = (a * 2 + 1).exp();
    auto c = b.sum();
    bp::MemoryStats during = dev().memory_stats();
    EXPECT_GE(during.allocated, before.allocated + 2 * (4u << 16));
    EXPECT_GE(during.num_allocs, before.num_allocs + 3);
    EXPECT_GE(during.peak_allocated, during.allocated);
    (void)c.item<float>();
  }
  dev().synchronize();
  bp::MemoryStats after = dev().memory_stats();
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.num_allocs, before.num_allocs);
  dev().allocator().reset_peak();
  EXPECT_EQ(dev().memory_stats().peak_allocated, after.allocated);
}

TEST_P(DeviceTest, OutOfMemoryIsTypedAndNamesTheRequest) {
  try {
    auto t = bp::empty({int64_t(1) << 58}, dev(), bp::DType::u8);
    FAIL() << "a 256 PiB allocation succeeded";
  } catch (const bp::OutOfMemory& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(dev().str() + ": allocating"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GiB"), std::string::npos) << msg;
  }
  // The device still works afterwards.
  EXPECT_EQ(bp::ones({2}, dev()).sum().item<float>(), 2.0f);
}

TEST_P(DeviceTest, CopiesBetweenEveryPairOfDevices) {
  for (bp::Device* other : bp::devices()) {
    auto v = bptest::random_values(1000 + 3);
    auto t = make(v, {1003});
    auto moved = t.to(*other);
    EXPECT_EQ(&moved.device(), other);
    EXPECT_EQ(moved.to_vector<float>(), t.to_vector<float>())
        << dev().str() << " -> " << other->str();
    auto back = moved.slice(0, 1, 1001, 3).to(dev());  // a strided view crosses too
    auto ref = t.slice(0, 1, 1001, 3).to_vector<float>();
    EXPECT_EQ(back.to_vector<float>(), ref);
  }
}

// The message of the SyncError that `read` raises in sync-debug mode "error", or "" when the
// read is quiet.
template <typename F>
std::string sync_report(F&& read) {
  bp::set_sync_debug(bp::SyncDebug::error);
  try {
    read();
  } catch (const bp::SyncError& e) {
    bp::set_sync_debug(bp::SyncDebug::off);
    return e.what();
  }
  bp::set_sync_debug(bp::SyncDebug::off);
  return "";
}

// Every implicit read that waits for queued work is reported under the name of the call the
// user made; after an explicit synchronisation the values it covered read quietly (Note
// [Sync-debug]).
TEST_P(DeviceTest, SyncDebugReportsImplicitReads) {
  auto v = bptest::random_values(4);
  auto t = (make(v, {4}) * 2.0).sum();
  double want = 2.0 * (static_cast<float>(v[0]) + static_cast<float>(v[1]) +
                       static_cast<float>(v[2]) + static_cast<float>(v[3]));
  if (dev().properties().unified_memory) {
    EXPECT_EQ(sync_report([&] { (void)t.item<float>(); }), "");  // host memory: no wait
    return;
  }
  std::string prefix = "implicit device-to-host synchronisation on " + dev().str() + " in ";
  EXPECT_NE(sync_report([&] { (void)t.item<float>(); }).find(prefix + "item()"), std::string::npos);
  auto u = t * 3.0;
  EXPECT_NE(sync_report([&] { (void)u.to_vector<float>(); }).find(prefix + "to_vector()"),
            std::string::npos);
  u = t * 4.0;
  EXPECT_NE(sync_report([&] { (void)u.cpu(); }).find(prefix + "copy_to()"), std::string::npos);
  u = t * 5.0;
  EXPECT_NE(sync_report([&] {
              bp::SyncDebugCall call("tolist()");
              (void)u.to_vector<float>();
            }).find(prefix + "tolist()"),
            std::string::npos);
  // An explicit synchronisation covers what was queued before it, on either entry point.
  u = t * 6.0;
  bp::synchronize();
  float read = 0;
  EXPECT_EQ(sync_report([&] { read = u.item<float>(); }), "");
  EXPECT_NEAR(read, 6.0 * want, 1e-3 * std::fabs(want));
  u = t * 7.0;
  dev().synchronize();
  EXPECT_EQ(sync_report([&] { (void)u.cpu(); }), "");
  // New work is waited for again.
  u = t * 8.0;
  EXPECT_NE(sync_report([&] { (void)u.item<float>(); }), "");
  EXPECT_NEAR(u.item<float>(), 8.0 * want, 1e-3 * std::fabs(want));
}

TEST_P(DeviceTest, OpsFromSeveralThreads) {
  std::vector<std::thread> threads;
  std::vector<float> results(4);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      auto a = bp::full({1000}, k + 1.0, dev());
      for (int i = 0; i < 50; ++i) a = a + 1.0;
      results[k] = a.sum().item<float>();
    });
  for (auto& t : threads) t.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(results[k], 1000.0f * (k + 51));
}

INSTANTIATE_TEST_SUITE_P(AllDevices, DeviceTest, ::testing::ValuesIn(bptest::device_strings()),
                         bptest::param_name);

}  // namespace

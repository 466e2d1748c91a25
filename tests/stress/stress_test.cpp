// Concurrency stress of the core library and its plugins, meant to run under ThreadSanitizer
// (tools/setup.sh's TSan build) as well as in the normal build:
//   - 16 threads resolving devices at start-up (the registry loads once, for all of them);
//   - 8 threads issuing random ops on the shared devices and checking every value against a
//     float64 host reference;
//   - concurrent save and load of different files;
//   - allocations on every device while other threads read and reset its statistics.
// Each test runs in its own process under ctest (gtest_discover_tests), so the start-up test
// really is the first use of the registry; it is also declared first for direct runs.
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane/nn.hpp>
#include <backplane/serialize.hpp>
#include <backplane_test/gtest_compare.hpp>
#include <backplane_test/seed.hpp>

#include <unistd.h>

#include <atomic>
#include <barrier>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

// Iterations scale with BP_STRESS_SCALE (default 1; the sanitizer builds run at 1).
int scaled(int n) {
  const char* s = std::getenv("BP_STRESS_SCALE");
  return n * (s && *s ? std::max(1, std::atoi(s)) : 1);
}

// The devices the stress runs on: every device the registry finds, or BP_TEST_DEVICES.
std::vector<bp::Device*> stress_devices() {
  std::vector<bp::Device*> out;
  const char* only = std::getenv("BP_TEST_DEVICES");
  for (bp::Device* d : bp::devices()) {
    if (only && *only &&
        (std::string(",") + only + ",").find("," + d->str() + ",") == std::string::npos)
      continue;
    out.push_back(d);
  }
  return out;
}

// Runs f(k) on n threads that start together.
void on_threads(int n, const std::function<void(int)>& f) {
  std::barrier start(n);
  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k)
    threads.emplace_back([&, k] {
      start.arrive_and_wait();
      f(k);
    });
  for (auto& t : threads) t.join();
}

TEST(Stress, SixteenThreadsResolveDevicesAtStartUp) {
  constexpr int kThreads = 16;
  std::vector<std::vector<bp::Device*>> seen(kThreads);
  std::vector<bp::Device*> cpu(kThreads), fallback(kThreads), dflt(kThreads);
  std::vector<size_t> report(kThreads);
  on_threads(kThreads, [&](int k) {
    // Different first calls, all of which load the registry.
    switch (k % 4) {
      case 0:
        cpu[k] = &bp::device("cpu:0");
        break;
      case 1:
        report[k] = bp::load_report().size();
        break;
      case 2:
        fallback[k] = &bp::try_device("nosuchtype:3");
        break;
      default:
        dflt[k] = &bp::default_device();
        break;
    }
    seen[k] = bp::devices();
    cpu[k] = &bp::device("cpu");
    fallback[k] = &bp::try_device("cuda:10");
    dflt[k] = &bp::default_device();
    report[k] = bp::load_report().size();
    EXPECT_GE(bp::num_devices("cpu"), 1);
  });
  for (int k = 1; k < kThreads; ++k) {
    EXPECT_EQ(seen[k], seen[0]) << "thread " << k << " saw another device list";
    EXPECT_EQ(cpu[k], cpu[0]);
    EXPECT_EQ(fallback[k], cpu[0]) << "try_device falls back to cpu:0";
    EXPECT_EQ(dflt[k], dflt[0]);
    EXPECT_EQ(report[k], report[0]);
  }
  EXPECT_EQ(cpu[0]->str(), "cpu:0");
}

// One random op on `dev` with fresh inputs, checked against a float64 reference.
void random_op(bp::Device& dev, const bp::Tensor& shared, const std::vector<double>& shared_v,
               std::mt19937_64& rng) {
  const int64_t n = shared.numel();
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = static_cast<float>(u(rng));
  bp::Tensor a = bp::from_vector(v, {n}, dev);
  std::vector<double> ref(static_cast<size_t>(n));
  bp::Tensor out;
  switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
    case 0:  // binary with the tensor all threads share
      out = a + shared;
      for (int64_t i = 0; i < n; ++i) ref[i] = v[i] + shared_v[i];
      break;
    case 1:
      out = a * shared - 1.0;
      for (int64_t i = 0; i < n; ++i) ref[i] = v[i] * shared_v[i] - 1.0;
      break;
    case 2:
      out = a.exp();
      for (int64_t i = 0; i < n; ++i) ref[i] = std::exp(v[i]);
      break;
    case 3:
      out = bp::maximum(a, shared).relu();
      for (int64_t i = 0; i < n; ++i) ref[i] = std::max(0.0, std::max(v[i], shared_v[i]));
      break;
    case 4: {  // a reduction of many elements into one
      double s = 0, sq = 0;
      for (double x : v) s += x, sq += x * x;
      EXPECT_TRUE(bp_test::all_close(BP_DTYPE_F32, a.sum().to_vector<double>(), {s},
                                     {.magnitude = std::vector<double>{std::sqrt(sq)}}))
          << "sum on " << dev.str();
      return;
    }
    default: {  // a matrix product
      const int64_t m = 8, k = n / 8;
      bp::Tensor b = shared.reshape({k, 8});
      out = bp::matmul(a.reshape({m, k}), b);
      ref.assign(static_cast<size_t>(m * 8), 0.0);
      std::vector<double> mag(ref.size(), 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < 8; ++j)
          for (int64_t q = 0; q < k; ++q) {
            const double t = v[i * k + q] * shared_v[q * 8 + j];
            ref[i * 8 + j] += t;
            mag[i * 8 + j] += t * t;
          }
      for (double& x : mag) x = std::sqrt(x);
      EXPECT_TRUE(bp_test::all_close(BP_DTYPE_F32, out.to_vector<double>(), ref,
                                     {.scale = 10, .magnitude = mag}))
          << "matmul on " << dev.str();
      return;
    }
  }
  EXPECT_TRUE(bp_test::all_close(BP_DTYPE_F32, out.to_vector<double>(), ref)) << dev.str();
}

TEST(Stress, EightThreadsIssueRandomOpsOnSharedDevices) {
  const std::vector<bp::Device*> devs = stress_devices();
  ASSERT_FALSE(devs.empty());
  // One read-only input per device that every thread uses.
  constexpr int64_t kN = 1024;
  std::vector<bp::Tensor> shared;
  std::vector<double> shared_v(kN);
  std::mt19937_64 g(bp_test::test_seed("bp_stress_tests"));
  for (double& x : shared_v) x = static_cast<float>(std::uniform_real_distribution<>(-2, 2)(g));
  for (bp::Device* d : devs) shared.push_back(bp::from_vector(shared_v, {kN}, *d));
  const int iterations = scaled(40);
  on_threads(8, [&](int k) {
    std::mt19937_64 rng(bp_test::test_seed("bp_stress_tests") + 1 + k);
    for (int i = 0; i < iterations; ++i) {
      const size_t d = std::uniform_int_distribution<size_t>(0, devs.size() - 1)(rng);
      random_op(*devs[d], shared[d], shared_v, rng);
      if (i % 16 == 15) devs[d]->synchronize();
    }
  });
  bp::synchronize();
}

TEST(Stress, ConcurrentSaveAndLoadOfDifferentFiles) {
  const std::string dir =
      std::filesystem::temp_directory_path().string() + "/bp_stress_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  bp::Device& cpu = bp::device("cpu:0");
  const std::vector<bp::Device*> devs = stress_devices();
  const int rounds = scaled(6);
  on_threads(8, [&](int k) {
    bp::Generator gen(bp_test::test_seed("bp_stress_tests") + 100 + k);
    bp::Device& dev = *devs[static_cast<size_t>(k) % devs.size()];
    const std::string path = dir + "/model" + std::to_string(k) + ".safetensors";
    for (int r = 0; r < rounds; ++r) {
      std::map<std::string, bp::Tensor> state = {
          {"w", bp::rand({17, 33}, dev, bp::DType::f32, &gen)},
          {"b", bp::randn({33}, dev, bp::DType::f64, &gen)},
          {"i", bp::arange(7 + k, dev, bp::DType::i64)}};
      bp::save(state, path, {{"thread", std::to_string(k)}});
      std::map<std::string, bp::Tensor> back = bp::load_file(path, k % 2 ? cpu : dev);
      ASSERT_EQ(back.size(), 3u);
      EXPECT_EQ(back.at("w").to_vector<float>(), state.at("w").to_vector<float>());
      EXPECT_EQ(back.at("b").to_vector<double>(), state.at("b").to_vector<double>());
      EXPECT_EQ(back.at("i").to_vector<int64_t>(), state.at("i").to_vector<int64_t>());
    }
  });
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos)
        << "left behind: " << e.path();
  std::filesystem::remove_all(dir);
}

TEST(Stress, AllocatorStatisticsWhileOthersAllocate) {
  for (bp::Device* dev : stress_devices()) {
    SCOPED_TRACE(dev->str());
    dev->synchronize();
    const bp::MemoryStats base = dev->allocator().stats();
    std::atomic<bool> done{false};
    std::atomic<int> readers_ran{0};
    const int rounds = scaled(200);
    std::thread readers[2];
    for (auto& r : readers)
      r = std::thread([&] {
        while (!done.load()) {
          bp::MemoryStats s = dev->allocator().stats();
          (void)s;
          dev->memory_stats();
          dev->allocator().reset_peak();
          readers_ran.fetch_add(1);
        }
      });
    on_threads(4, [&](int k) {
      std::mt19937_64 rng(bp_test::test_seed("bp_stress_tests") + 200 + k);
      std::vector<std::shared_ptr<bp::Buffer>> held;
      for (int i = 0; i < rounds; ++i) {
        const uint64_t bytes = std::uniform_int_distribution<uint64_t>(1, 1 << 16)(rng);
        held.push_back(dev->allocator().allocate(bytes));
        if (held.size() > 8) held.erase(held.begin() + static_cast<long>(rng() % held.size()));
      }
    });
    done.store(true);
    for (auto& r : readers) r.join();
    EXPECT_GT(readers_ran.load(), 0);
    dev->synchronize();
    const bp::MemoryStats after = dev->allocator().stats();
    EXPECT_EQ(after.allocated, base.allocated) << "every buffer was freed";
    EXPECT_EQ(after.num_allocs, base.num_allocs);
    EXPECT_GE(after.peak_allocated, after.allocated);
  }
}

}  // namespace

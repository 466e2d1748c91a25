// libbackplane's own memory accounting (Note [Memory accounting] in memory_counters.hpp):
// allocated, peak_allocated, num_allocs and total_allocs are exact after any sequence of
// allocations and frees, on every device, from one thread or many.
#include "device_params.hpp"

#include <algorithm>
#include <memory>
#include <thread>

namespace {

class MemoryAccountingTest : public bptest::DeviceTest {};

struct Expected {
  uint64_t allocated, live, total, peak;
};

void expect_stats(bp::Device& d, const Expected& e, const std::string& when) {
  const bp::MemoryStats s = d.memory_stats();
  EXPECT_EQ(s.allocated, e.allocated) << when;
  EXPECT_EQ(s.num_allocs, e.live) << when;
  EXPECT_EQ(s.total_allocs, e.total) << when;
  EXPECT_EQ(s.peak_allocated, e.peak) << when;
}

TEST_P(MemoryAccountingTest, SequenceOfAllocationsAndFreesIsCountedExactly) {
  bp::Device& d = dev();
  d.synchronize();
  d.allocator().reset_peak();
  const bp::MemoryStats base = d.memory_stats();
  ASSERT_EQ(base.peak_allocated, base.allocated) << "reset_peak starts the peak at allocated";
  Expected e{base.allocated, base.num_allocs, base.total_allocs, base.allocated};

  auto stream = d.create_stream();
  std::vector<std::shared_ptr<bp::Buffer>> live;
  std::vector<uint64_t> sizes = {0, 1, 511, 513, 4096, 100000, (uint64_t{1} << 20) + 3, 0};
  std::uniform_int_distribution<uint64_t> any(1, uint64_t{3} << 20);
  for (int i = 0; i < 12; ++i) sizes.push_back(any(bp_test::rng("bp_device_tests")));
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Half on the default stream, half on a stream of their own: both are counted.
    live.push_back(i % 2 ? d.allocator().allocate(sizes[i], *stream)
                         : d.allocator().allocate(sizes[i]));
    e.allocated += sizes[i];
    ++e.live;
    ++e.total;
    e.peak = std::max(e.peak, e.allocated);
    expect_stats(d, e, "after allocating " + std::to_string(sizes[i]) + " bytes");
  }
  const bp::MemoryStats full = d.memory_stats();
  EXPECT_GE(full.reserved, full.allocated - base.allocated)
      << "the backend holds at least what is live";

  // Free a random half, in random order.
  std::vector<size_t> order(live.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), bp_test::rng("bp_device_tests"));
  for (size_t k = 0; k < order.size() / 2; ++k) {
    const size_t i = order[k];
    live[i].reset();
    e.allocated -= sizes[i];
    --e.live;
    expect_stats(d, e, "after freeing " + std::to_string(sizes[i]) + " bytes");
  }

  // reset_peak: the peak restarts at what is live and follows new allocations only.
  d.allocator().reset_peak();
  e.peak = e.allocated;
  expect_stats(d, e, "after reset_peak");
  {
    auto extra = d.allocator().allocate(12345);
    e.allocated += 12345;
    ++e.live;
    ++e.total;
    e.peak = e.allocated;
    expect_stats(d, e, "after a 12345-byte allocation past the reset");
  }
  e.allocated -= 12345;
  --e.live;
  expect_stats(d, e, "after freeing it (the peak stays)");

  live.clear();
  stream->synchronize();
  e.allocated = base.allocated;
  e.live = base.num_allocs;
  expect_stats(d, e, "after freeing everything");
  EXPECT_EQ(d.memory_stats().total_allocs, base.total_allocs + sizes.size() + 1);
}

TEST_P(MemoryAccountingTest, TensorOpsCountTheirOutputs) {
  bp::Device& d = dev();
  d.synchronize();
  const bp::MemoryStats base = d.memory_stats();
  {
    bp::Tensor a = bp::zeros({1000}, d);  // one f32 buffer of 4000 bytes
    bp::Tensor b = a + a;                 // one more
    bp::Tensor c = (a + a) + a;           // one more; the temporary a + a is freed
    const bp::MemoryStats s = d.memory_stats();
    EXPECT_EQ(s.allocated, base.allocated + 3 * 4000) << "a, b and c live";
    EXPECT_EQ(s.num_allocs, base.num_allocs + 3);
    EXPECT_GE(s.total_allocs, base.total_allocs + 4);
  }
  d.synchronize();
  const bp::MemoryStats after = d.memory_stats();
  EXPECT_EQ(after.allocated, base.allocated);
  EXPECT_EQ(after.num_allocs, base.num_allocs);
}

// Eight threads allocate and free on the device at once (default stream and one stream each):
// the counters end exact, and the peak lies between the largest one thread held and the sum of
// what every thread held at most.
TEST_P(MemoryAccountingTest, ManyThreadsEndExact) {
  bp::Device& d = dev();
  d.synchronize();
  d.allocator().reset_peak();
  const bp::MemoryStats base = d.memory_stats();
  constexpr int kThreads = 8, kIters = 150;
  const uint64_t seed = bp_test::rng("bp_device_tests")();
  std::vector<uint64_t> max_live(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 g(seed + static_cast<uint64_t>(t));
      auto stream = d.create_stream();
      std::vector<std::shared_ptr<bp::Buffer>> live;
      uint64_t bytes = 0;
      for (int i = 0; i < kIters; ++i) {
        if (live.size() < 4 && (live.empty() || (g() & 1))) {
          const uint64_t n = g() % 70000;
          live.push_back((g() & 1) ? d.allocator().allocate(n, *stream)
                                   : d.allocator().allocate(n));
          bytes += n;
          max_live[t] = std::max(max_live[t], bytes);
        } else {
          const size_t k = g() % live.size();
          bytes -= live[k]->size();
          live[k] = live.back();
          live.pop_back();
        }
      }
      live.clear();
      stream->synchronize();
    });
  for (auto& th : threads) th.join();
  d.synchronize();
  const bp::MemoryStats after = d.memory_stats();
  EXPECT_EQ(after.allocated, base.allocated);
  EXPECT_EQ(after.num_allocs, base.num_allocs);
  uint64_t sum_max = 0, one_max = 0;
  for (uint64_t m : max_live) {
    sum_max += m;
    one_max = std::max(one_max, m);
  }
  EXPECT_GE(after.peak_allocated, base.allocated + one_max);
  EXPECT_LE(after.peak_allocated, base.allocated + sum_max);
  EXPECT_GE(after.total_allocs, base.total_allocs + kThreads);
}

INSTANTIATE_TEST_SUITE_P(AllDevices, MemoryAccountingTest,
                         ::testing::ValuesIn(bptest::device_strings()), bptest::param_name);

}  // namespace

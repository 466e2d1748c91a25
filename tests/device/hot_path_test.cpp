// The per-op hot path's allocation rule (docs/design.md, "The hot path"; Note [Per-op hot path]) on
// every device: an op allocates on the heap only what its output needs (the TensorImpl and the
// Buffer, one make_shared each), an in-place op nothing, a graph replay nothing. Counted by
// replacing the global operator new in this test program, so libbackplane's and the plugin's C++
// allocations are both seen (a backend's device memory comes from its own allocator and is not
// counted).
#include "device_params.hpp"

#include <backplane/graph.hpp>

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_news{0};
}  // namespace

// GCC sees free() of memory from operator new once these replacements are inlined into
// new/delete pairs; they are the standard replacement pattern, so the warning does not apply.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
#pragma GCC diagnostic pop

namespace {

class HotPathTest : public bptest::DeviceTest {
 protected:
  // operator new calls per call of fn, over n calls after a warm-up (kernel caches, the
  // allocator's caches, the default stream).
  template <typename F>
  double news_per_call(F&& fn, int n = 200) {
    for (int i = 0; i < 20; ++i) fn();
    dev().synchronize();
    g_news = 0;
    g_counting = true;
    for (int i = 0; i < n; ++i) fn();
    g_counting = false;
    dev().synchronize();
    return double(g_news.load()) / n;
  }
};

TEST_P(HotPathTest, AnOpAllocatesOnlyItsOutput) {
  bp::Tensor x = make(bptest::random_values(1), {1}), y = make(bptest::random_values(1), {1});
  EXPECT_LE(news_per_call([&] { bp::Tensor z = x + y; }), 2.0)
      << "x + y on " << dev().str() << ": more than the output's TensorImpl and Buffer";
  bp::Tensor big = make(bptest::random_values(4096), {64, 64});
  EXPECT_LE(news_per_call([&] { bp::Tensor z = big * 2.0; }), 2.0) << "big * 2.0";
  EXPECT_LE(news_per_call([&] { bp::Tensor z = big.exp(); }), 2.0) << "exp";
}

TEST_P(HotPathTest, InPlaceOpsAndReplaysAllocateNothing) {
  bp::Tensor acc = make(bptest::random_values(16), {16}), y = make(bptest::random_values(16), {16});
  EXPECT_EQ(news_per_call([&] { acc.add_(y); }), 0.0) << "add_ on " << dev().str();
  EXPECT_EQ(news_per_call([&] { acc.mul_(0.5); }), 0.0) << "mul_";
  for (bp::GraphMode mode : {bp::GraphMode::automatic, bp::GraphMode::recorded}) {
    bp::Graph g = bp::capture(
        dev(),
        [&] {
          for (int i = 0; i < 10; ++i) acc.add_(y);
        },
        mode);
    EXPECT_EQ(news_per_call([&] { g.replay(); }), 0.0)
        << "replay of a " << (g.native() ? "native" : "recorded") << " graph";
  }
}

INSTANTIATE_TEST_SUITE_P(AllDevices, HotPathTest, ::testing::ValuesIn(bptest::device_strings()),
                         bptest::param_name);

}  // namespace
